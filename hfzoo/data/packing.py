"""Tokenize documents and pack them into fixed-length blocks (`datasets.map`, batched).

Each document is cleaned (`hfzoo.data.loading.clean_text`) and tokenized with the tokenizer's own
post-processing, so the family's separator tokens mark document boundaries (the decoder tokenizer
starts every document with `<|endoftext|>`). The token streams are then concatenated and cut into
`block_size` blocks, dropping the incomplete tail, as transformers' `run_clm.py` `group_texts` does.
"""

from __future__ import annotations

from itertools import chain

import datasets
import numpy as np

from .loading import clean_text, column_names

#: Documents per tokenizer call, and tokenized documents concatenated per packing call (the tail of each
#: packing call shorter than a block is dropped); shared by the map-style and the streamed paths, which
#: therefore cut the same blocks from the same documents.
TOKENIZE_BATCH_SIZE = 16
PACK_BATCH_SIZE = 1000


def tokenize_function(tokenizer, text_column_name: str, clean: bool = True):
    """Return a batched `datasets.map` function that cleans and tokenizes a text column.

    Args:
        tokenizer: a transformers tokenizer (its post-processor adds the family's special tokens).
        text_column_name: the column holding the text.
        clean: apply `clean_text` (CRLF, Project Gutenberg boilerplate) first.

    Returns:
        A function `batch -> {"input_ids": list[list[int]]}`; empty documents are skipped.
    """

    def tokenize(batch: dict) -> dict:
        texts = [clean_text(t) if clean else t for t in batch[text_column_name] if t]
        texts = [t for t in texts if t.strip()]
        if not texts:
            return {"input_ids": []}
        return {"input_ids": tokenizer(texts, return_attention_mask=False)["input_ids"]}

    return tokenize


def group_texts(block_size: int, with_labels: bool = True):
    """Return a batched `datasets.map` function that concatenates token lists and cuts `block_size` blocks.

    Args:
        block_size: tokens per block.
        with_labels: also return a `labels` copy of the blocks (causal LM; the masked-LM and
            span-corruption collators make their own labels).

    Returns:
        A function `batch -> {"input_ids": blocks[, "labels": blocks]}`, each block a list of
        `block_size` ints; the remainder shorter than a block is dropped.
    """

    def group(batch: dict) -> dict:
        tokens = list(chain.from_iterable(batch["input_ids"]))
        total = (len(tokens) // block_size) * block_size
        blocks = [tokens[i : i + block_size] for i in range(0, total, block_size)]
        return {"input_ids": blocks, "labels": [list(b) for b in blocks]} if with_labels else {"input_ids": blocks}

    return group


def tokenize_and_pack(
    raw_datasets: datasets.DatasetDict,
    tokenizer,
    text_column_name: str,
    block_size: int,
    num_proc: int | None = None,
    clean: bool = True,
    load_from_cache_file: bool = True,
    with_labels: bool = True,
) -> datasets.DatasetDict:
    """Tokenize every split and pack it into blocks of `block_size` tokens.

    Args:
        raw_datasets: splits with a `text_column_name` column (one document per row).
        tokenizer: a transformers tokenizer.
        text_column_name: the text column.
        block_size: tokens per block (>= 2).
        num_proc: worker processes for `datasets.map` (None: in-process).
        clean: apply `clean_text` before tokenizing.
        load_from_cache_file: reuse `datasets`' cache of earlier identical maps.
        with_labels: add a `labels` column (a copy of `input_ids`, for the causal LM objective).

    Returns:
        A `DatasetDict` with `input_ids` (and `labels`) columns (int64 lists of length `block_size`).

    Raises:
        ValueError: `block_size < 2`, or a split that yields no complete block (the message gives
            the split and its token count).
    """
    if block_size < 2:
        raise ValueError(f"--block_size must be at least 2, got {block_size}")
    tokenized = raw_datasets.map(
        tokenize_function(tokenizer, text_column_name, clean),
        batched=True,
        batch_size=TOKENIZE_BATCH_SIZE,
        num_proc=num_proc,
        remove_columns=list(next(iter(raw_datasets.values())).column_names),
        load_from_cache_file=load_from_cache_file,
        desc="Tokenizing",
    )
    packed = tokenized.map(
        group_texts(block_size, with_labels),
        batched=True,
        batch_size=PACK_BATCH_SIZE,
        num_proc=num_proc,
        load_from_cache_file=load_from_cache_file,
        desc=f"Packing into blocks of {block_size}",
    )
    for split, dataset in packed.items():
        if len(dataset) == 0:
            n_tokens = sum(len(ids) for ids in tokenized[split]["input_ids"])
            raise ValueError(
                f"the {split} data has {n_tokens} tokens, fewer than one block of --block_size {block_size}"
            )
    return packed


def pack_stream(
    raw: datasets.IterableDataset,
    tokenizer,
    text_column_name: str,
    block_size: int,
    clean: bool = True,
    with_labels: bool = True,
) -> datasets.IterableDataset:
    """Tokenize and pack a streamed split on the fly: the blocks `tokenize_and_pack` cuts from the same documents.

    Nothing is read until the result is iterated, and memory stays bounded (`PACK_BATCH_SIZE` tokenized
    documents at a time), so the source may be larger than memory or disk.

    Args:
        raw: a streamed split (`datasets.IterableDataset`) with a `text_column_name` column.
        tokenizer: a transformers tokenizer.
        text_column_name: the text column.
        block_size: tokens per block (>= 2).
        clean: apply `clean_text` before tokenizing.
        with_labels: add a `labels` column (a copy of `input_ids`, for the causal LM objective).

    Returns:
        An `IterableDataset` of `input_ids` (and `labels`) rows, lists of `block_size` ints.

    Raises:
        ValueError: `block_size < 2`.
    """
    if block_size < 2:
        raise ValueError(f"--block_size must be at least 2, got {block_size}")
    tokenized = raw.map(
        tokenize_function(tokenizer, text_column_name, clean),
        batched=True,
        batch_size=TOKENIZE_BATCH_SIZE,
        remove_columns=column_names(raw),
    )
    return tokenized.map(group_texts(block_size, with_labels), batched=True, batch_size=PACK_BATCH_SIZE)


def token_counts(dataset: datasets.Dataset, vocab_size: int, column: str = "input_ids") -> np.ndarray:
    """Count how often each token id occurs in a packed dataset.

    Args:
        dataset: packed blocks with an int list column.
        vocab_size: length of the returned array (ids must be < vocab_size).
        column: the token column.

    Returns:
        int64 array `(vocab_size,)` of counts.
    """
    counts = np.zeros(vocab_size, dtype=np.int64)
    for batch in dataset.with_format("numpy").iter(batch_size=1024):
        counts += np.bincount(np.asarray(batch[column]).ravel(), minlength=vocab_size)[:vocab_size]
    return counts
