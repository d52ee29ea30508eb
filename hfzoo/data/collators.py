"""Data collators for the two denoising pretraining objectives: BERT's masked LM and T5's span corruption.

* `DataCollatorForMaskedLM`: masked language modelling (Devlin et al. 2019, "BERT: Pre-training of
  Deep Bidirectional Transformers for Language Understanding", §3.1 "Task #1: Masked LM"), built on
  transformers' `DataCollatorForLanguageModeling` with its special-token and whole-word handling
  fixed for byte-level BPE vocabularies.
* `DataCollatorForSpanCorruption`: T5's span-corruption objective (Raffel et al. 2020, "Exploring
  the Limits of Transfer Learning with a Unified Text-to-Text Transformer", JMLR, §3.1.4
  "Unsupervised Objective" and §3.3 "Unsupervised Objectives"), with `random_spans_noise_mask`,
  `compute_input_and_target_lengths` (T5's `random_spans_helper`) and `reconstruct_from_spans`.

Both collators work on whole batches with torch tensor operations (no per-token Python loops).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerBase

#: Keys of an MLM example that are kept and padded; any other key (e.g. the `labels` column written by
#: `hfzoo.data.packing.group_texts`) is dropped, since the collator computes the labels itself.
MLM_FEATURE_KEYS = ("input_ids", "attention_mask", "token_type_ids", "special_tokens_mask")

#: The label value ignored by `torch.nn.CrossEntropyLoss` (and by transformers' models).
IGNORE_INDEX = -100

#: The whitespace bytes (space, \t, \n, \v, \f, \r) that delimit words for whole-word masking.
_WHITESPACE_BYTES = b" \t\n\x0b\x0c\r"


def _byte_level_symbols(byte_values: bytes) -> set[str]:
    """Return the printable symbols GPT-2's byte-level alphabet uses for `byte_values`.

    The mapping is GPT-2's `bytes_to_unicode`: printable Latin-1 bytes map to themselves and the
    others, in byte order, to code points 256, 257, ... (so a space is 'Ġ' and a newline 'Ċ').
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping, n = {}, 0
    for b in range(256):
        if b in printable:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + n)
            n += 1
    return {mapping[b] for b in byte_values}


def _special_token_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Return the sorted ids of every special token (roles, extra special tokens, special added tokens)."""
    ids = {i for i in tokenizer.all_special_ids if i is not None}
    for i, token in getattr(tokenizer, "added_tokens_decoder", {}).items():
        if getattr(token, "special", False):
            ids.add(int(i))
    return sorted(ids)


def _check_ids(input_ids: torch.Tensor, table_size: int) -> None:
    """Raise a clear error for token ids outside `[0, table_size)` (they would index past the lookup tables)."""
    if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= table_size):
        raise ValueError(
            f"token ids must be in [0, {table_size}) for this tokenizer, got ids in "
            f"[{int(input_ids.min())}, {int(input_ids.max())}]"
        )


def _make_generator(seed: int | None) -> torch.Generator | None:
    """Create the collator's torch generator for this process (None: use torch's global RNG).

    In a worker process of a `torch.utils.data.DataLoader` the seed is mixed with the worker's own seed
    (`get_worker_info().seed`: a base seed the loader draws for each pass over the data, plus the worker id), as
    the loader seeds torch's global RNG there: the workers draw different masks, each pass draws new ones (the
    loader starts new workers for each pass, and a seed plus only the worker id would repeat the last pass's masks
    epoch after epoch), and a loader seeded the same way (`set_seed`, or its `generator`) draws the same masks again.
    """
    if seed is None:
        return None
    worker = torch.utils.data.get_worker_info()
    if worker is not None:
        seed = int(np.random.SeedSequence([seed, worker.seed]).generate_state(1, dtype=np.uint64)[0])
    return torch.Generator().manual_seed(seed)


def _process_generator(collator) -> None:
    """Give a collator with a `seed` its private generator on its first call in each process.

    A collator called in the main process and then copied into `DataLoader` workers (fork or pickle) would carry
    that generator, the same state in every worker; each process makes its own instead (`_make_generator`).
    """
    made_here = collator.generator is not None and getattr(collator, "_generator_pid", None) == os.getpid()
    if collator.seed is not None and not made_here:
        collator.generator = _make_generator(collator.seed)
        collator._generator_pid = os.getpid()


def pad_examples(
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[Mapping[str, Any] | Sequence[int]],
    keys: Sequence[str] = MLM_FEATURE_KEYS,
    pad_to_multiple_of: int | None = None,
) -> dict[str, torch.Tensor]:
    """Pad examples of different lengths into int64 tensors, like `tokenizer.pad(..., return_tensors="pt")`.

    Same result as `tokenizer.pad` with `return_attention_mask=True` (`input_ids` padded with the pad id,
    `attention_mask` with 0, `token_type_ids` with `tokenizer.pad_token_type_id`, `special_tokens_mask`
    with 1, on `tokenizer.padding_side`), but vectorised with numpy: `tokenizer.pad` flattens every
    nested list in Python, which costs seconds per million tokens.

    Args:
        tokenizer: gives the pad id, pad token type id and padding side.
        examples: dicts (the `keys` present in the first one are kept; others, such as a packed `labels`
            column, are dropped) or plain sequences / 1-D tensors / arrays of `input_ids`.
        keys: the keys to keep and pad.
        pad_to_multiple_of: round the padded length up to a multiple of this.

    Returns:
        Int64 tensors `(batch_size, seq_len)` per kept key, always including `attention_mask`.

    Raises:
        ValueError: no examples, an example without `input_ids` or with fields of different lengths, or
            rows of different lengths and no pad token.
    """
    if len(examples) == 0:
        raise ValueError("cannot collate an empty list of examples")
    examples = [e if isinstance(e, Mapping) else {"input_ids": e} for e in examples]
    present = [k for k in keys if k in examples[0]]
    if "input_ids" not in present:
        raise ValueError(f"examples must have 'input_ids' (got keys {sorted(examples[0])})")
    columns = {k: [e[k].tolist() if hasattr(e[k], "tolist") else e[k] for e in examples] for k in present}
    lengths = np.array([len(ids) for ids in columns["input_ids"]], dtype=np.int64)
    width = int(lengths.max())
    if pad_to_multiple_of:
        width = -(-width // pad_to_multiple_of) * pad_to_multiple_of
    if (width != lengths).any() and tokenizer.pad_token_id is None:
        raise ValueError("rows of different lengths need padding but the tokenizer has no pad token")
    positions = np.arange(width)
    if tokenizer.padding_side == "left":
        real = positions >= (width - lengths)[:, None]
    else:
        real = positions < lengths[:, None]
    pad_values = {
        "input_ids": tokenizer.pad_token_id,
        "attention_mask": 0,
        "token_type_ids": tokenizer.pad_token_type_id,
        "special_tokens_mask": 1,
    }
    batch = {}
    for key, rows in columns.items():
        if any(len(r) != n for r, n in zip(rows, lengths)):
            raise ValueError(f"every example's {key!r} must have as many entries as its input_ids")
        out = np.full((len(rows), width), pad_values.get(key, 0) or 0, dtype=np.int64)
        out[real] = np.fromiter(itertools.chain.from_iterable(rows), dtype=np.int64, count=int(lengths.sum()))
        batch[key] = torch.from_numpy(out)
    if "attention_mask" not in batch:
        batch["attention_mask"] = torch.from_numpy(real.astype(np.int64))
    return batch


# ==================================================================================================
# Masked language modelling (BERT)
# ==================================================================================================


@dataclass
class DataCollatorForMaskedLM(DataCollatorForLanguageModeling):
    """BERT's masked-LM collator (Devlin et al. 2019, §3.1 and Appendix A.1), for any tokenizer with a mask token.

    A subclass of transformers' `DataCollatorForLanguageModeling` (same dataclass fields and validation of
    the probabilities, same seeding scheme) whose padding is vectorised (`pad_examples`) and whose masking
    step is rewritten to fix what the stock collator gets wrong for this project:

    * Candidates: only tokens that are neither special tokens (every id in `tokenizer.all_special_ids`
      and every added token marked special; so `[CLS]`, `[SEP]`, `[PAD]`, `[UNK]`, `[MASK]`) nor
      padding (`attention_mask == 0`, or `special_tokens_mask == 1` when the examples carry one) can be
      selected. Each candidate is selected independently with probability `mlm_probability`.
    * Replacement of a selected token: with probability `mask_replace_prob` (0.8) the mask token, with
      probability `random_replace_prob` (0.1) a random token drawn uniformly from the *non-special*
      vocabulary, otherwise (0.1) left unchanged. The stock collator draws random tokens from
      `range(len(tokenizer))`, special tokens included, so it could put `[CLS]`, `[SEP]`, `[PAD]` or
      `[MASK]` in the middle of a text. As in BERT, the random draw is not conditioned on the original
      token, so with K non-special ids it equals the original with probability 1/K: the share of
      selected tokens that end up *different and not the mask* is `random_replace_prob * (1 - 1/K)`
      and the share left unchanged `1 - mask_replace_prob - random_replace_prob * (1 - 1/K)`.
    * Whole-word masking (`whole_word_mask=True`, the "Whole Word Masking" variant of BERT's release):
      words are selected with probability `mlm_probability` and every token of a selected word is
      selected, so the expected share of selected tokens is still `mlm_probability`; each token of a
      selected word then gets its own 80/10/10 decision, as in BERT's `create_pretraining_data.py`. The
      stock collator needs `offset_mapping` in every example (byte-level offsets include the leading
      space, so it would see no word boundary at all), builds a `(batch, seq_len, seq_len)` tensor, and
      disables random replacement; here word boundaries come from the token strings:

      A token *starts a word* when it is the first candidate of the row, follows a non-candidate
      (special or padding token), its string begins with whitespace, or the previous token's string ends
      with whitespace. Whitespace is the byte-level symbol of a whitespace byte (`Ġ` space, `Ċ` newline,
      `ĉ` tab, `č` CR, `ċ`, `Č`) for byte-level BPE vocabularies (detected by the presence of `Ġ`);
      tokens without `##` for WordPiece vocabularies; tokens starting with `▁` for SentencePiece
      vocabularies. Words are thus whitespace-delimited, as with the stock collator's offset rule:
      punctuation belongs to the word it is attached to (`world,` is one word).

    Examples are dicts with `input_ids` (and optionally `attention_mask`, `token_type_ids`,
    `special_tokens_mask`; other keys such as a packed `labels` column are dropped) or plain sequences
    of ids, of any lengths: rows are padded by `pad_examples` (the same result as the stock collator's
    `tokenizer.pad`, vectorised; to a multiple of `pad_to_multiple_of` when given).

    Only `return_tensors="pt"` is supported. Inherited fields: `tokenizer`, `mlm` (must stay True),
    `whole_word_mask`, `mlm_probability` (0.15), `mask_replace_prob` (0.8), `random_replace_prob` (0.1),
    `pad_to_multiple_of`, `return_tensors` ("pt"), `seed` (None: torch's global RNG; else a private
    `torch.Generator`, one per process: in `DataLoader` workers mixed with the worker's seed, see `_make_generator`).

    Returns (from `__call__`):
        A dict of int64 tensors of shape `(batch_size, seq_len)`: `input_ids` (corrupted), `labels`
        (the original id at selected positions, -100 elsewhere), `attention_mask` (1 for real tokens,
        0 for padding) and `token_type_ids` when the examples carry them.

    Raises:
        ValueError: the tokenizer has no mask token, `mlm=False`, `return_tensors` other than "pt",
            probabilities out of range (stock checks), or, with `whole_word_mask`, a vocabulary whose
            word boundaries cannot be recognised.
    """

    def __post_init__(self):
        """Validate the configuration and precompute the special-id, random-pool and word-boundary tables.

        Raises:
            ValueError: see the class docstring.
        """
        if self.tokenizer.mask_token is None or self.tokenizer.mask_token_id is None:
            raise ValueError(
                f"the tokenizer ({type(self.tokenizer).__name__}) has no mask token, which masked language "
                "modelling needs: use an encoder-family tokenizer (mask token '[MASK]') or set tokenizer.mask_token"
            )
        if not self.mlm:
            raise ValueError(
                "DataCollatorForMaskedLM is for masked LM only (mlm=True); use DataCollatorForLanguageModeling"
                "(mlm=False) for causal LM"
            )
        if self.return_tensors != "pt":
            raise ValueError(
                f"DataCollatorForMaskedLM returns torch tensors only (return_tensors='pt'), got {self.return_tensors!r}"
            )
        # The stock __post_init__ validates the probabilities, but with whole_word_mask it also forces
        # mask_replace_prob=1 (no random replacement); whole-word masking is handled here instead.
        whole_word_mask = self.whole_word_mask
        self.whole_word_mask = False
        super().__post_init__()
        self.whole_word_mask = whole_word_mask

        vocab_size = len(self.tokenizer)
        special = _special_token_ids(self.tokenizer)
        is_special = torch.zeros(max([vocab_size, *special]) + 1, dtype=torch.bool)
        is_special[special] = True
        self._is_special = is_special
        #: The ids random replacement draws from: the whole vocabulary except special tokens.
        self.random_token_ids = torch.arange(vocab_size)[~is_special[:vocab_size]]
        if self.random_replace_prob > 0 and len(self.random_token_ids) == 0:
            raise ValueError("random_replace_prob > 0 but every token of the vocabulary is special")
        self._starts_word = self._ends_word = None
        if self.whole_word_mask:
            self._starts_word, self._ends_word = self._word_boundary_tables(vocab_size)

    def _word_boundary_tables(self, vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Return `(starts_word, ends_with_space)`: bool tensors `(vocab_size,)` indexed by token id."""
        tokens = [t or "" for t in self.tokenizer.convert_ids_to_tokens(list(range(vocab_size)))]
        vocab = set(tokens)
        if "Ġ" in vocab:  # byte-level BPE (GPT-2 alphabet)
            space = _byte_level_symbols(_WHITESPACE_BYTES)
            starts = [bool(t) and t[0] in space for t in tokens]
            ends = [bool(t) and t[-1] in space for t in tokens]
        elif any(t.startswith("##") for t in tokens):  # WordPiece
            starts = [not t.startswith("##") for t in tokens]
            ends = [False] * vocab_size
        elif any(t.startswith("▁") for t in tokens):  # SentencePiece
            starts = [t.startswith("▁") for t in tokens]
            ends = [False] * vocab_size
        else:
            raise ValueError(
                "whole_word_mask: cannot find word boundaries in this vocabulary (expected byte-level BPE 'Ġ', "
                "WordPiece '##' or SentencePiece '▁' markers)"
            )
        return torch.tensor(starts, dtype=torch.bool), torch.tensor(ends, dtype=torch.bool)

    def torch_call(self, examples: Sequence[Mapping[str, Any] | Sequence[int]]) -> dict[str, torch.Tensor]:
        """Pad a list of examples and mask them.

        Args:
            examples: dicts with `input_ids` (and optional `attention_mask`, `token_type_ids`,
                `special_tokens_mask`), or plain sequences / 1-D tensors of token ids.

        Returns:
            A dict of int64 tensors `(batch_size, seq_len)`: `input_ids`, `labels`, `attention_mask`
            (and `token_type_ids` when given).
        """
        _process_generator(self)
        batch = pad_examples(self.tokenizer, examples, MLM_FEATURE_KEYS, self.pad_to_multiple_of)
        special_tokens_mask = batch.pop("special_tokens_mask", None)
        batch["input_ids"], batch["labels"] = self.torch_mask_tokens(
            batch["input_ids"], special_tokens_mask=special_tokens_mask, attention_mask=batch["attention_mask"]
        )
        return batch

    def numpy_call(self, examples):
        """Not supported: the stock numpy path draws random replacements from the special tokens too.

        Raises:
            ValueError: always.
        """
        raise ValueError("DataCollatorForMaskedLM returns torch tensors only (return_tensors='pt')")

    def candidate_mask(
        self,
        input_ids: torch.Tensor,
        special_tokens_mask: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Return which positions may be selected: neither a special token nor padding.

        Args:
            input_ids: int64 `(batch_size, seq_len)`.
            special_tokens_mask: optional `(batch_size, seq_len)`, 1 at special/padding positions.
            attention_mask: optional `(batch_size, seq_len)`, 0 at padding positions.

        Returns:
            Bool tensor `(batch_size, seq_len)`.
        """
        _check_ids(input_ids, len(self._is_special))
        candidates = ~self._is_special[input_ids]
        if special_tokens_mask is not None:
            candidates &= ~special_tokens_mask.bool()
        if attention_mask is not None:
            candidates &= attention_mask.bool()
        return candidates

    def word_starts(self, input_ids: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
        """Return which candidate positions start a word (the rule is in the class docstring).

        Args:
            input_ids: int64 `(batch_size, seq_len)`.
            candidates: bool `(batch_size, seq_len)`, from `candidate_mask`.

        Returns:
            Bool tensor `(batch_size, seq_len)`, True at the first token of every word (False at
            non-candidates).

        Raises:
            ValueError: the collator was built without `whole_word_mask`.
        """
        if self._starts_word is None:
            raise ValueError("word_starts needs a collator built with whole_word_mask=True")
        ids = input_ids.clamp(0, len(self._starts_word) - 1)
        after_break = torch.ones_like(candidates)
        after_break[:, 1:] = ~candidates[:, :-1] | self._ends_word[ids[:, :-1]]
        return candidates & (self._starts_word[ids] | after_break)

    def torch_mask_tokens(
        self,
        inputs: torch.Tensor,
        special_tokens_mask: torch.Tensor | None = None,
        offset_mapping: Any | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Select and corrupt tokens for masked LM (BERT §3.1), vectorised over the batch.

        Args:
            inputs: int64 `(batch_size, seq_len)` token ids (not modified).
            special_tokens_mask: optional `(batch_size, seq_len)`, 1 where a token must not be selected.
            offset_mapping: ignored (accepted for compatibility with the stock signature; word
                boundaries come from the token strings).
            attention_mask: optional `(batch_size, seq_len)`, 0 at padding.

        Returns:
            `(input_ids, labels)`, int64 `(batch_size, seq_len)`: the corrupted ids, and the original id
            at selected positions with -100 elsewhere.
        """
        inputs = inputs.clone()
        shape, g = inputs.shape, self.generator
        candidates = self.candidate_mask(inputs, special_tokens_mask, attention_mask)
        if self.whole_word_mask:
            starts = self.word_starts(inputs, candidates)
            chosen_start = starts & (torch.rand(shape, generator=g) < self.mlm_probability)
            positions = torch.arange(shape[1]).expand(shape)
            # Position of each token's word start (a candidate always has one: the first candidate of a
            # row, and the first after a special or padding token, start words).
            word_start = torch.where(starts, positions, -1).cummax(dim=1).values.clamp(min=0)
            selected = candidates & chosen_start.gather(1, word_start)
        else:
            selected = candidates & (torch.rand(shape, generator=g) < self.mlm_probability)
        labels = torch.where(selected, inputs, IGNORE_INDEX)

        draw = torch.rand(shape, generator=g)
        to_mask = selected & (draw < self.mask_replace_prob)
        to_random = selected & ~to_mask & (draw < self.mask_replace_prob + self.random_replace_prob)
        inputs[to_mask] = self.tokenizer.mask_token_id
        n_random = int(to_random.sum())
        if n_random:
            pick = torch.randint(len(self.random_token_ids), (n_random,), generator=g)
            inputs[to_random] = self.random_token_ids[pick]
        return inputs, labels


# ==================================================================================================
# Span corruption (T5)
# ==================================================================================================


def _lengths_after_corruption(
    tokens_length: int, noise_density: float, mean_noise_span_length: float
) -> tuple[int, int]:
    """T5's `_tokens_length_to_inputs_length_targets_length` with one sentinel per span and one EOS."""
    num_noise_tokens = int(round(tokens_length * noise_density))
    num_nonnoise_tokens = tokens_length - num_noise_tokens
    num_noise_spans = int(round(num_noise_tokens / mean_noise_span_length))
    return num_nonnoise_tokens + num_noise_spans + 1, num_noise_tokens + num_noise_spans + 1


def compute_input_and_target_lengths(
    inputs_length: int, noise_density: float = 0.15, mean_noise_span_length: float = 3.0
) -> tuple[int, int]:
    """Raw block length and target length that make span-corrupted inputs exactly `inputs_length` long.

    T5's `t5.data.preprocessors.random_spans_helper` (Raffel et al. 2020, §3.1.4) with one sentinel per
    span in inputs and targets and an EOS appended to both (as in transformers'
    `run_t5_mlm_flax.compute_input_and_target_lengths`): the largest raw length whose corrupted input
    (non-noise tokens + one sentinel per noise span + EOS) fits in `inputs_length`. Packing raw text into
    blocks of the returned `expanded_inputs_length` tokens and corrupting them with
    `DataCollatorForSpanCorruption` gives inputs of exactly `inputs_length` and targets of exactly
    `target_length` tokens, so no padding. For `noise_density == 0.5` T5 shortens the raw length by one
    when the targets would otherwise be longer than the inputs.

    Example: `inputs_length=512, noise_density=0.15, mean_noise_span_length=3` -> `(568, 114)`:
    85 noise tokens in 28 spans, inputs 483 + 28 + 1 = 512, targets 85 + 28 + 1 = 114.

    Args:
        inputs_length: the encoder input length wanted, EOS included (>= 2).
        noise_density: fraction of raw tokens that are noise, in (0, 1).
        mean_noise_span_length: mean length of a noise span (>= 1).

    Returns:
        `(expanded_inputs_length, target_length)`: ints.

    Raises:
        ValueError: `inputs_length < 2`, or `noise_density` / `mean_noise_span_length` out of range.
    """
    _check_noise_arguments(noise_density, mean_noise_span_length)
    if inputs_length < 2:
        raise ValueError(f"inputs_length must be >= 2 (room for a token and EOS), got {inputs_length}")
    tokens_length = inputs_length - 1
    while _lengths_after_corruption(tokens_length + 1, noise_density, mean_noise_span_length)[0] <= inputs_length:
        tokens_length += 1
    _, targets_length = _lengths_after_corruption(tokens_length, noise_density, mean_noise_span_length)
    if noise_density == 0.5 and targets_length > inputs_length:
        tokens_length -= 1
        targets_length -= 1
    return tokens_length, targets_length


def _check_noise_arguments(noise_density: float, mean_noise_span_length: float) -> None:
    if not 0.0 < noise_density < 1.0:
        raise ValueError(f"noise_density must be in (0, 1) (exclusive), got {noise_density}")
    if not 1.0 <= mean_noise_span_length < float("inf"):  # inf would make one span of every row's noise
        raise ValueError(f"mean_noise_span_length must be finite and >= 1, got {mean_noise_span_length}")


def noise_span_counts(
    lengths: torch.Tensor, noise_density: float, mean_noise_span_length: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Numbers of noise tokens and noise spans T5's `random_spans_noise_mask` uses for each length.

    `num_noise = round(max(length, 2) * noise_density)` clipped to `[1, max(length, 2) - 1]` and
    `num_spans = max(round(num_noise / mean_noise_span_length), 1)`, with Python's round-half-to-even (in
    float64, like `compute_input_and_target_lengths`). For a row of length 0 or 1 T5 computes the mask
    for length 2 and truncates it, so the row ends up with no noise.

    Args:
        lengths: int64 `(batch_size,)` row lengths.
        noise_density: fraction of noise tokens, in (0, 1).
        mean_noise_span_length: mean noise span length (>= 1).

    Returns:
        `(num_noise_tokens, num_noise_spans)`: int64 tensors `(batch_size,)` for the (>= 2) lengths used.
    """
    length = lengths.clamp(min=2)
    num_noise = torch.round(length.double() * noise_density).long()
    num_noise = torch.minimum(num_noise.clamp(min=1), length - 1)
    num_spans = torch.round(num_noise.double() / mean_noise_span_length).long().clamp(min=1)
    return num_noise, num_spans


def _random_segmentation(
    num_items: torch.Tensor, num_segments: torch.Tensor, generator: torch.Generator | None
) -> torch.Tensor:
    """Split each row's `num_items` into `num_segments` non-empty segments, all splits equally likely.

    T5's `_random_segmentation`: a segment starts at item 0 and at `num_segments - 1` of the items
    `1 .. num_items - 1` chosen uniformly without replacement (here: the smallest random keys).

    Args:
        num_items: int64 `(batch_size,)`, >= 1.
        num_segments: int64 `(batch_size,)`, in `[1, num_items]`.
        generator: torch generator (None: global RNG).

    Returns:
        int64 `(batch_size, max(num_segments))`: segment lengths, zero-padded after each row's
        `num_segments`.
    """
    batch, width = len(num_items), int(num_items.max())
    keys = torch.rand(batch, max(width - 1, 0), generator=generator)
    positions = torch.arange(max(width - 1, 0))
    keys = torch.where(positions < (num_items - 1)[:, None], keys, 2.0)  # items past the row: never chosen
    # The argsort is a random permutation of each row's valid positions (invalid ones last); its first
    # num_segments - 1 entries are the chosen segment starts.
    order = keys.argsort(dim=1)
    chosen = (positions < (num_segments - 1)[:, None]).long()
    first_in_segment = torch.zeros(batch, width, dtype=torch.long)
    first_in_segment[:, 1:] = torch.zeros_like(chosen).scatter_(1, order, chosen)
    segment_id = first_in_segment.cumsum(dim=1)
    in_row = (torch.arange(width) < num_items[:, None]).long()
    lengths = torch.zeros(batch, int(num_segments.max()), dtype=torch.long)
    return lengths.scatter_add_(1, segment_id.clamp(max=lengths.shape[1] - 1), in_row)


def random_spans_noise_mask(
    lengths: torch.Tensor | Sequence[int],
    noise_density: float = 0.15,
    mean_noise_span_length: float = 3.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """T5's `random_spans_noise_mask` (Raffel et al. 2020, §3.1.4), vectorised over a batch of rows.

    Each row of length L gets exactly `num_noise` noise tokens in `num_spans` noise spans (see
    `noise_span_counts`); the noise and the non-noise tokens are each split into `num_spans` non-empty
    spans by `_random_segmentation`, and the spans alternate non-noise, noise, non-noise, ..., so a row
    starts with non-noise and ends with noise (`random_roll=False`, T5's default). Subject to these
    counts every mask is equally likely.

    Args:
        lengths: the row lengths, int `(batch_size,)`.
        noise_density: fraction of noise tokens, in (0, 1).
        mean_noise_span_length: mean noise span length (>= 1).
        generator: torch generator (None: torch's global RNG).

    Returns:
        Bool tensor `(batch_size, max(lengths))`: True at noise positions, False past each row's length.

    Raises:
        ValueError: `noise_density` / `mean_noise_span_length` out of range, a negative length, or a row
            with fewer non-noise tokens than noise spans (T5's segmentation then fails; lower
            `noise_density` or raise `mean_noise_span_length`).
    """
    _check_noise_arguments(noise_density, mean_noise_span_length)
    lengths = torch.as_tensor(lengths, dtype=torch.long).reshape(-1)
    if len(lengths) == 0:
        return torch.zeros(0, 0, dtype=torch.bool)
    if int(lengths.min()) < 0:
        raise ValueError("lengths must be >= 0")
    num_noise, num_spans = noise_span_counts(lengths, noise_density, mean_noise_span_length)
    length = lengths.clamp(min=2)
    num_nonnoise = length - num_noise
    short = num_nonnoise < num_spans
    if bool(short.any()):
        i = int(short.nonzero()[0])
        raise ValueError(
            f"a row of {int(lengths[i])} tokens needs {int(num_spans[i])} noise spans and as many non-noise spans "
            f"but has only {int(num_nonnoise[i])} non-noise tokens (noise_density={noise_density}, "
            f"mean_noise_span_length={mean_noise_span_length})"
        )
    noise_lengths = _random_segmentation(num_noise, num_spans, generator)
    nonnoise_lengths = _random_segmentation(num_nonnoise, num_spans, generator)
    interleaved = torch.stack([nonnoise_lengths, noise_lengths], dim=2).reshape(len(lengths), -1)
    span_starts = interleaved.cumsum(dim=1)[:, :-1]  # spans past a row's num_spans start at its length
    width = int(length.max())
    indicator = torch.zeros(len(lengths), width + 1, dtype=torch.long)
    indicator.scatter_add_(1, span_starts, torch.ones_like(span_starts))
    is_noise = indicator.cumsum(dim=1)[:, :width] % 2 == 1
    is_noise &= torch.arange(width) < lengths[:, None]
    return is_noise[:, : int(lengths.max())]


def sentinel_token_ids(tokenizer: PreTrainedTokenizerBase, pattern: str = "<extra_id_{}>") -> list[int]:
    """Return the ids of the tokenizer's sentinels `<extra_id_0>`, `<extra_id_1>`, ... (in that order).

    Args:
        tokenizer: a transformers tokenizer.
        pattern: the sentinel name pattern.

    Returns:
        A list of ids (empty when the tokenizer has no `<extra_id_0>`); stops at the first missing index.
    """
    vocab = tokenizer.get_vocab()
    ids = []
    while pattern.format(len(ids)) in vocab:
        ids.append(vocab[pattern.format(len(ids))])
    return ids


@dataclass
class DataCollatorForSpanCorruption:
    """T5's span-corruption collator (Raffel et al. 2020, §3.1.4 and §3.3.4), vectorised over the batch.

    Takes raw packed blocks of token ids (no sentinel or padding tokens inside; EOS document separators
    are fine) and for each row draws a `random_spans_noise_mask`, replaces each noise span in the input by
    a distinct sentinel (`<extra_id_0>` for the first span of the row, `<extra_id_1>` for the second, ...)
    and appends EOS, and builds the target as `sentinel_i` + span i for each span, then EOS:

        raw     :  Thank you for inviting me to your party last week .
        input   :  Thank you <extra_id_0> me to your party <extra_id_1> week . </s>   (T5 paper, Fig. 2)
        labels  :  <extra_id_0> for inviting <extra_id_1> last </s>

    (T5's mask always ends with a noise span, so the input ends with a sentinel and EOS.)

    With `inputs_length` set, raw blocks of `expanded_inputs_length` tokens (see
    `compute_input_and_target_lengths`, e.g. `hfzoo.data.packing.group_texts(collator.expanded_inputs_length)`)
    give inputs of exactly `inputs_length` and labels of exactly `target_length`; shorter rows are padded,
    and a row whose corruption does not fit is an error. Without it, outputs are padded to the longest row
    of the batch (and to a multiple of `pad_to_multiple_of`).

    Args:
        tokenizer: a tokenizer with an EOS token, a padding token and sentinels `<extra_id_N>` (the
            encoder-decoder family of `hfzoo.tokenization.train_bpe_tokenizer`).
        noise_density: fraction of raw tokens to corrupt, in (0, 1).
        mean_noise_span_length: mean length of a noise span (>= 1).
        inputs_length: fixed encoder input length, EOS included (None: pad to the batch's longest).
        pad_to_multiple_of: pad dynamic lengths to a multiple of this (ignored with `inputs_length`).
        seed: seed of a private `torch.Generator` (one per process: in `DataLoader` workers mixed with the
            worker's seed, so that workers and passes over the data draw different masks);
            None uses torch's global RNG.

    Attributes:
        sentinel_ids: the sentinel ids, `<extra_id_0>` first.
        expanded_inputs_length: raw block length matching `inputs_length` (None without it).
        target_length: label length matching `inputs_length` (None without it).

    Returns (from `__call__`):
        A dict of int64 tensors: `input_ids` `(batch_size, inputs_length)` (padded with the pad id),
        `attention_mask` (same shape; 0 at padding) and `labels` `(batch_size, target_length)` (padding is
        -100). `decoder_input_ids` are left to the model (shift right of `labels`, as T5 models do).

    Raises:
        ValueError: (at construction) no sentinel tokens, no EOS token, no padding token, `noise_density`
            outside (0, 1), `mean_noise_span_length` < 1, or fewer sentinels than the spans of a block of
            `expanded_inputs_length` tokens; (per batch) fewer sentinels than the spans a row needs, a row
            containing sentinel or padding ids, or a row whose corrupted input or target is longer than
            `inputs_length` / `target_length`.
    """

    tokenizer: PreTrainedTokenizerBase
    noise_density: float = 0.15
    mean_noise_span_length: float = 3.0
    inputs_length: int | None = None
    pad_to_multiple_of: int | None = None
    seed: int | None = None

    def __post_init__(self):
        """Validate the configuration and look up the special token ids.

        Raises:
            ValueError: see the class docstring.
        """
        _check_noise_arguments(self.noise_density, self.mean_noise_span_length)
        self.sentinel_ids = sentinel_token_ids(self.tokenizer)
        if not self.sentinel_ids:
            raise ValueError(
                f"the tokenizer ({type(self.tokenizer).__name__}) has no sentinel tokens <extra_id_0>, <extra_id_1>, "
                "...: span corruption needs them (train an encoder-decoder family tokenizer with num_extra_ids > 0)"
            )
        if self.tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no eos token, which ends span-corruption inputs and targets")
        if self.tokenizer.pad_token_id is None:
            raise ValueError("the tokenizer has no padding token, which pads span-corruption inputs")
        self.eos_token_id = self.tokenizer.eos_token_id
        self.pad_token_id = self.tokenizer.pad_token_id
        self._sentinels = torch.tensor(self.sentinel_ids, dtype=torch.long)
        forbidden = [*self.sentinel_ids, self.pad_token_id]
        self._forbidden = torch.zeros(max([len(self.tokenizer), *forbidden]) + 1, dtype=torch.bool)
        self._forbidden[forbidden] = True
        self.expanded_inputs_length = self.target_length = None
        if self.inputs_length is not None:
            self.expanded_inputs_length, self.target_length = compute_input_and_target_lengths(
                self.inputs_length, self.noise_density, self.mean_noise_span_length
            )
            _, spans = noise_span_counts(
                torch.tensor([self.expanded_inputs_length]), self.noise_density, self.mean_noise_span_length
            )
            self._check_sentinels(int(spans[0]), self.expanded_inputs_length)
        self.generator = None

    def _check_sentinels(self, num_spans: int, length: int) -> None:
        if num_spans > len(self.sentinel_ids):
            raise ValueError(
                f"a row of {length} tokens needs {num_spans} noise spans (noise_density={self.noise_density}, "
                f"mean_noise_span_length={self.mean_noise_span_length}) but the tokenizer has only "
                f"{len(self.sentinel_ids)} sentinel tokens: use shorter rows or more sentinels (num_extra_ids)"
            )

    def _rows(self, examples: Sequence[Mapping[str, Any] | Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Stack the examples' ids into `(batch_size, max_len)` (padded with the pad id) and their lengths."""
        if len(examples) == 0:
            raise ValueError("cannot collate an empty list of examples")
        rows = [torch.as_tensor(e["input_ids"] if isinstance(e, Mapping) else e, dtype=torch.long) for e in examples]
        if any(r.dim() != 1 for r in rows):
            raise ValueError("every example's input_ids must be a 1-D sequence of token ids")
        lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
        if bool((lengths == lengths[0]).all()):
            tokens = torch.stack(rows) if len(rows[0]) else torch.zeros(len(rows), 0, dtype=torch.long)
        else:
            tokens = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=self.pad_token_id)
        return tokens, lengths

    def _width(self, needed: int, fixed: int | None, what: str, lengths: torch.Tensor, sizes: torch.Tensor) -> int:
        if fixed is None:
            if self.pad_to_multiple_of:
                needed = -(-needed // self.pad_to_multiple_of) * self.pad_to_multiple_of
            return needed
        if needed > fixed:
            i = int(sizes.argmax())
            raise ValueError(
                f"a row of {int(lengths[i])} raw tokens gives {what} of {int(sizes[i])} tokens, longer than "
                f"{fixed} ({what} length for inputs_length={self.inputs_length}); raw rows must have at most "
                f"expanded_inputs_length={self.expanded_inputs_length} tokens"
            )
        return fixed

    def __call__(self, examples: Sequence[Mapping[str, Any] | Sequence[int]]) -> dict[str, torch.Tensor]:
        """Corrupt a batch of raw blocks.

        Args:
            examples: dicts with an `input_ids` sequence (other keys are ignored), or plain sequences /
                1-D tensors of ids; rows may differ in length.

        Returns:
            A dict of int64 tensors `input_ids` and `attention_mask` `(batch_size, inputs_length)` and
            `labels` `(batch_size, target_length)` (see the class docstring).

        Raises:
            ValueError: see the class docstring.
        """
        _process_generator(self)
        tokens, lengths = self._rows(examples)
        batch, width = tokens.shape
        positions = torch.arange(width)
        valid = positions < lengths[:, None]
        _check_ids(tokens, len(self._forbidden))
        if bool((self._forbidden[tokens] & valid).any()):
            raise ValueError(
                "raw rows must not contain sentinel (<extra_id_N>) or padding tokens: they would make the "
                "corruption ambiguous"
            )
        _, num_spans = noise_span_counts(lengths, self.noise_density, self.mean_noise_span_length)
        i = int(num_spans.argmax())
        self._check_sentinels(int(num_spans[i]), int(lengths[i]))
        noise = random_spans_noise_mask(lengths, self.noise_density, self.mean_noise_span_length, self.generator)
        noise = noise.reshape(batch, width)

        previous_noise = torch.zeros_like(noise)
        previous_noise[:, 1:] = noise[:, :-1]
        span_start = noise & ~previous_noise
        span_index = span_start.long().cumsum(dim=1) - 1
        sentinel = self._sentinels[span_index.clamp(0, len(self.sentinel_ids) - 1)]
        n_spans = span_start.sum(dim=1)

        # Inputs: non-noise tokens, the span's sentinel at each span start, other noise tokens dropped.
        keep = valid & (~noise | span_start)
        input_sizes = keep.sum(dim=1) + 1
        in_width = self._width(int(input_sizes.max()), self.inputs_length, "inputs", lengths, input_sizes)
        trash = max(width, in_width) + 1
        inputs = torch.full((batch, trash + 1), self.pad_token_id, dtype=torch.long)
        destination = torch.where(keep, keep.long().cumsum(dim=1) - 1, trash)
        inputs.scatter_(1, destination, torch.where(span_start, sentinel, tokens))
        inputs[:, -1] = self.pad_token_id
        inputs.scatter_(1, (input_sizes - 1)[:, None], self.eos_token_id)
        inputs = inputs[:, :in_width]
        attention_mask = (torch.arange(in_width) < input_sizes[:, None]).long()

        # Targets: for each span, its sentinel then its tokens; then EOS.
        target_sizes = noise.sum(dim=1) + n_spans + 1
        tg_width = self._width(int(target_sizes.max()), self.target_length, "targets", lengths, target_sizes)
        trash = max(2 * width, tg_width) + 1
        labels = torch.full((batch, trash + 1), IGNORE_INDEX, dtype=torch.long)
        token_destination = noise.long().cumsum(dim=1) - 1 + span_index + 1
        labels.scatter_(1, torch.where(noise, token_destination, trash), tokens)
        labels.scatter_(1, torch.where(span_start, token_destination - 1, trash), sentinel)
        labels.scatter_(1, (target_sizes - 1)[:, None], self.eos_token_id)
        labels = labels[:, :tg_width]
        return {"input_ids": inputs, "attention_mask": attention_mask, "labels": labels}


def reconstruct_from_spans(
    input_ids: torch.Tensor | np.ndarray | Sequence[Sequence[int]],
    labels: torch.Tensor | np.ndarray | Sequence[Sequence[int]],
    sentinel_ids: Sequence[int],
    eos_token_id: int,
    pad_token_id: int,
) -> list[list[int]]:
    """Undo span corruption: put each target span back in place of its sentinel in the input.

    Inverse of `DataCollatorForSpanCorruption` for rows whose raw tokens contain no sentinel or padding
    ids (which the collator enforces). Padding (`pad_token_id` in the inputs, -100 or `pad_token_id` in the
    labels) and the final EOS of both are removed first.

    Args:
        input_ids: `(batch_size, inputs_length)` corrupted inputs (tensor, array or nested lists).
        labels: `(batch_size, target_length)` targets.
        sentinel_ids: the sentinel ids, `<extra_id_0>` first (`DataCollatorForSpanCorruption.sentinel_ids`).
        eos_token_id: the EOS id that ends inputs and targets.
        pad_token_id: the padding id of the inputs.

    Returns:
        One list of ids per row: the raw block.

    Raises:
        ValueError: a row does not end with EOS, or its input and target sentinels differ (not the same
            sentinels in the same order).
    """
    sentinels = np.asarray(list(sentinel_ids))
    rows = []
    for row, (inp, tgt) in enumerate(zip(np.asarray(input_ids), np.asarray(labels))):
        inp = inp[inp != pad_token_id]
        tgt = tgt[(tgt != IGNORE_INDEX) & (tgt != pad_token_id)]
        if len(inp) == 0 or inp[-1] != eos_token_id or len(tgt) == 0 or tgt[-1] != eos_token_id:
            raise ValueError(f"row {row}: inputs and labels must both end with EOS ({eos_token_id})")
        inp, tgt = inp[:-1], tgt[:-1]
        in_at = np.flatnonzero(np.isin(inp, sentinels))
        tg_at = np.flatnonzero(np.isin(tgt, sentinels))
        if not np.array_equal(inp[in_at], tgt[tg_at]) or (len(tgt) and (not len(tg_at) or tg_at[0] != 0)):
            raise ValueError(
                f"row {row}: the sentinels of the input {inp[in_at].tolist()} and of the labels "
                f"{tgt[tg_at].tolist()} differ"
            )
        spans = np.split(tgt, tg_at[1:])  # each starts with its sentinel
        pieces = np.split(inp, in_at)  # pieces[k + 1] starts with sentinel k
        out = [pieces[0]]
        for span, piece in zip(spans, pieces[1:]):
            out.extend([span[1:], piece[1:]])
        rows.append(np.concatenate(out).tolist() if out else [])
    return rows
