"""Tokenize documents and pack them into fixed-length blocks (`datasets.map`, batched).

Each document is cleaned (`hfzoo.data.loading.clean_text`) and tokenized with the tokenizer's own
post-processing, so the family's separator tokens mark document boundaries (the decoder tokenizer
starts every document with `<|endoftext|>`). The token streams are then concatenated and cut into
`block_size` blocks, dropping the incomplete tail, as transformers' `run_clm.py` `group_texts` does.
A streamed split (`pack_stream`) is cut into the same blocks on the fly by `PackedStream`.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from itertools import chain
from typing import Any

import datasets
import numpy as np
import torch

from .loading import clean_text, column_names, parsed_rows

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
        ValueError: `block_size < 2`, a split with no text left after cleaning, or a split that yields
            no complete block (the message gives the split and its token count).
    """
    if block_size < 2:
        raise ValueError(f"--block_size must be at least 2, got {block_size}")
    tokenized = datasets.DatasetDict(
        {
            split: dataset.map(  # each split drops its own columns (local files and hub splits may differ)
                tokenize_function(tokenizer, text_column_name, clean),
                batched=True,
                batch_size=TOKENIZE_BATCH_SIZE,
                num_proc=num_proc,
                remove_columns=list(dataset.column_names),
                load_from_cache_file=load_from_cache_file,
                desc="Tokenizing",
            )
            for split, dataset in raw_datasets.items()
        }
    )
    for split, dataset in tokenized.items():
        if len(dataset) == 0:
            what = "empty, whitespace or Project Gutenberg boilerplate" if clean else "empty or whitespace"
            raise ValueError(
                f"the {split} data has no text{' after cleaning' if clean else ''}: its "
                f"{len(raw_datasets[split])} row(s) of {text_column_name!r} are {what}"
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


class PackedStream(torch.utils.data.IterableDataset):
    """Blocks cut on the fly from a stream of tokenized documents, with a resumable position.

    The blocks are `group_texts`' over consecutive groups of `group_size` documents (the packing calls of
    `tokenize_and_pack`, so a streamed split and the same split loaded whole give the same blocks, each group's
    tail shorter than a block dropped), but each block is yielded as soon as its tokens have been read: the
    first block waits for one tokenizer batch (`TOKENIZE_BATCH_SIZE` documents), not for a whole group, and
    memory holds that batch and fewer than `block_size` carried tokens.

    Iterating gives one pass (the documents' epoch). `state_dict` is the position after the last block
    yielded (its epoch, the documents' own `state_dict` at the start of the current document, the tokens
    carried into it, and how many of its blocks were yielded); `load_state_dict` restores the epoch, and the
    next pass of that epoch continues with the block that followed.

    Args:
        documents: a stream (`datasets.IterableDataset`) of rows with an `input_ids` list of ints, one
            document each.
        block_size: tokens per block (>= 2).
        with_labels: also yield a `labels` copy of each block (causal LM).
        group_size: documents per group (default `PACK_BATCH_SIZE`).
        max_blocks: yield at most this many blocks per pass (None: all).
        source: what the documents came from (`--train_file books.jsonl`), for the message of a record that
            cannot be parsed.

    Raises:
        ValueError: `block_size < 2`, `group_size < 1` or `max_blocks < 0`; while iterating, a
            `hfzoo.data.loading.DataReadError` naming `source` where a record cannot be parsed (a line of a
            stream that is not JSON), instead of pyarrow's or pandas' error from inside `datasets`.
    """

    def __init__(
        self,
        documents: datasets.IterableDataset,
        block_size: int,
        with_labels: bool = True,
        group_size: int | None = None,
        max_blocks: int | None = None,
        source: str = "the streamed data",
    ) -> None:
        group_size = PACK_BATCH_SIZE if group_size is None else group_size
        if block_size < 2:
            raise ValueError(f"--block_size must be at least 2, got {block_size}")
        if group_size < 1 or (max_blocks is not None and max_blocks < 0):
            raise ValueError(f"group_size must be >= 1 and max_blocks >= 0, got {group_size} and {max_blocks}")
        self.documents = documents
        self.block_size, self.with_labels = block_size, with_labels
        self.group_size, self.max_blocks = group_size, max_blocks
        self.source = source
        self._position: dict[str, Any] | None = None  # after the last block yielded
        self._resume: dict[str, Any] | None = None  # from load_state_dict, for the next pass

    @property
    def epoch(self) -> int:
        """The documents' epoch (the current pass)."""
        return self.documents.epoch

    def set_epoch(self, epoch: int) -> None:
        """Set the documents' epoch (the next pass)."""
        self.documents.set_epoch(epoch)

    def _start(self) -> dict[str, Any]:
        return self._here(None, [], 0, 0, 0)

    def state_dict(self) -> dict[str, Any]:
        """The position after the last block yielded (a copy), or the one loaded for the next pass."""
        return copy.deepcopy(self._resume or self._position or self._start())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from `state` (a `state_dict`): its epoch becomes the current one, and that pass continues."""
        self._resume = copy.deepcopy(state)
        self.documents.set_epoch(state["epoch"])

    def __iter__(self) -> Iterator[dict[str, list[int]]]:
        """Yield one pass of blocks: `{"input_ids": [block_size ints]}` (and `labels`, a copy)."""
        position, self._resume = self._resume, None
        if position is None or position["epoch"] != self.epoch:
            position = self._start()
        elif position["documents"] is not None:
            self.documents.load_state_dict(position["documents"])
        self._position = copy.deepcopy(position)
        cut, count = group_texts(self.block_size, self.with_labels), position["blocks"]
        before, carry = position["documents"], list(position["carry"])
        in_group, skip = position["group_documents"], position["document_blocks"]
        if self.max_blocks is not None and count >= self.max_blocks:
            return
        for row in parsed_rows(self.documents, self.source):
            after = self.documents.state_dict()  # the documents' position once this one is read
            if in_group == self.group_size:  # a new group: the last one's tail is dropped
                carry, in_group = [], 0
            tokens = carry + list(row["input_ids"])
            blocks = cut({"input_ids": [tokens]})  # this document's complete blocks, with the carried tokens
            for index in range(skip, len(blocks["input_ids"])):
                count += 1
                self._position = self._here(before, carry, in_group, index + 1, count)
                yield {key: column[index] for key, column in blocks.items()}
                if self.max_blocks is not None and count >= self.max_blocks:
                    return
            used = len(blocks["input_ids"]) * self.block_size
            before, carry, in_group, skip = after, tokens[used:], in_group + 1, 0
            self._position = self._here(before, carry, in_group, 0, count)

    def _here(self, documents, carry: list[int], group_documents: int, document_blocks: int, blocks: int) -> dict:
        return {"epoch": self.epoch, "documents": documents, "carry": carry, "group_documents": group_documents,
                "document_blocks": document_blocks, "blocks": blocks}  # fmt: skip


def pack_stream(
    raw: datasets.IterableDataset,
    tokenizer,
    text_column_name: str,
    block_size: int,
    clean: bool = True,
    with_labels: bool = True,
    max_blocks: int | None = None,
    source: str = "the streamed data",
) -> PackedStream:
    """Tokenize and pack a streamed split on the fly: the blocks `tokenize_and_pack` cuts from the same documents.

    Nothing is read until the result is iterated, blocks come as soon as their documents are tokenized, and
    memory stays bounded (`TOKENIZE_BATCH_SIZE` documents and one block's tokens at a time; see `PackedStream`),
    so the source may be larger than memory or disk.

    Args:
        raw: a streamed split (`datasets.IterableDataset`) with a `text_column_name` column.
        tokenizer: a transformers tokenizer.
        text_column_name: the text column.
        block_size: tokens per block (>= 2).
        clean: apply `clean_text` before tokenizing.
        with_labels: add a `labels` column (a copy of `input_ids`, for the causal LM objective).
        max_blocks: yield at most this many blocks per pass (None: all).
        source: what the split came from, for the message of a record that cannot be parsed (see `PackedStream`).

    Returns:
        A `PackedStream` of `input_ids` (and `labels`) rows, lists of `block_size` ints, with `set_epoch`,
        `state_dict` and `load_state_dict`.

    Raises:
        ValueError: `block_size < 2` (from `PackedStream`, before anything is read).
    """
    tokenized = raw.map(
        tokenize_function(tokenizer, text_column_name, clean),
        batched=True,
        batch_size=TOKENIZE_BATCH_SIZE,
        remove_columns=column_names(raw),
    )
    return PackedStream(tokenized, block_size, with_labels, max_blocks=max_blocks, source=source)


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
