"""Pretraining objectives: what each one trains, how its batches are built and how its targets are counted.

Registered in `OBJECTIVES` at the bottom of this file (`--objective` of the pretraining recipe):

- `clm`: next-token prediction (decoder, GPT; Radford et al. 2018), labels = inputs, shifted inside the model.
- `mlm`: BERT's masked LM (encoder; Devlin et al. 2019 §3.1): 15% of the tokens, 80% `[MASK]` / 10% random /
  10% unchanged (`hfzoo.data.collators.DataCollatorForMaskedLM`).
- `span`: T5's span corruption (encoder-decoder; Raffel et al. 2020 §3.1.4): noise spans replaced by sentinels,
  the targets are the spans (`hfzoo.data.collators.DataCollatorForSpanCorruption`).

Everything the training loop must know about an objective is a field of `Objective`, so that the loop
never branches on the objective's name.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM, default_data_collator

from ..choices import choice_hint
from ..data.collators import IGNORE_INDEX, DataCollatorForMaskedLM, DataCollatorForSpanCorruption

#: `(args, tokenizer, block_size) -> (collator, raw_block_size)`: see `Objective.build_collator`.
CollatorFactory = Callable[[argparse.Namespace, Any, int], tuple[Callable, int]]


@dataclass(frozen=True)
class Objective:
    """One pretraining objective.

    Attributes:
        name: the `--objective` value.
        auto_class: the transformers Auto class whose head the objective trains; a model family can take
            the objective when its config is in that class's mapping.
        build_collator: `(args, tokenizer, block_size) -> (collator, raw_block_size)`: the batch collator
            and the length (tokens) of the packed blocks it consumes; `args` are the recipe's arguments
            (objective parameters such as `mlm_probability`). Raises `ValueError` when the tokenizer
            lacks what the objective needs or a parameter is out of range.
        labels_in_blocks: packing stores a `labels` copy of every block (the collator makes no labels).
        shifts_labels: the model shifts the labels inside (position t predicts label t + 1), so the first
            label of every row is never predicted.
        predicts_every_token: every token of a block after the first is a target, so the add-one unigram
            perplexity of the same tokens is a comparable baseline.
        can_generate: the trained head generates text (`generate` after training, `--sample_prompt`).
        flags: the recipe flags only this objective reads, with their defaults (`--mlm_probability 0.15`);
            given with another `--objective` they are refused (`hfzoo.training.arguments.resolve_choice_flags`).
    """

    name: str
    auto_class: type
    build_collator: CollatorFactory
    labels_in_blocks: bool
    shifts_labels: bool
    predicts_every_token: bool
    can_generate: bool
    flags: dict[str, Any] = dataclasses.field(default_factory=dict)

    def count_predicted_tokens(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Number of labelled positions the loss averages over in `batch`.

        Args:
            batch: a collated batch with `labels` `(batch_size, seq_len)` int64 (-100: ignored).

        Returns:
            An int64 scalar tensor on the labels' device.
        """
        labels = batch["labels"]
        if self.shifts_labels:
            labels = labels[..., 1:]
        return (labels != IGNORE_INDEX).sum()

    def supports(self, config) -> bool:
        """Whether a model with `config` has this objective's head (its config is in `auto_class`'s mapping)."""
        return type(config) in self.auto_class._model_mapping


def causal_lm_collator(args: argparse.Namespace, tokenizer, block_size: int) -> tuple[Callable, int]:
    """`clm`: blocks of `block_size` tokens whose `labels` were stored by packing (`default_data_collator`)."""
    return default_data_collator, block_size


def masked_lm_collator(args: argparse.Namespace, tokenizer, block_size: int) -> tuple[Callable, int]:
    """`mlm`: blocks of `block_size` tokens masked on the fly (80/10/10; `--whole_word_mask` selects words).

    Raises:
        ValueError: `--mlm_probability` outside (0, 1), or a tokenizer without a mask token.
    """
    if not 0.0 < args.mlm_probability < 1.0:
        raise ValueError(f"--mlm_probability must be in (0, 1), got {args.mlm_probability}")
    if tokenizer.mask_token is None:
        raise ValueError(
            f"--objective mlm needs a tokenizer with a mask token; {args.tokenizer_name} has none "
            "(train one with --model_family encoder)"
        )
    collator = DataCollatorForMaskedLM(
        tokenizer=tokenizer, mlm_probability=args.mlm_probability, whole_word_mask=args.whole_word_mask
    )
    return collator, block_size


def span_corruption_collator(args: argparse.Namespace, tokenizer, block_size: int) -> tuple[Callable, int]:
    """`span`: raw blocks of T5's expanded length, corrupted into inputs of exactly `block_size` tokens.

    Raises:
        ValueError: bad `--noise_density` / `--mean_noise_span_length`, or a tokenizer without sentinels or EOS.
    """
    collator = DataCollatorForSpanCorruption(
        tokenizer=tokenizer,
        noise_density=args.noise_density,
        mean_noise_span_length=args.mean_noise_span_length,
        inputs_length=block_size,
    )
    return collator, collator.expanded_inputs_length


def get_objective(name: str) -> Objective:
    """Return the registered objective `name`.

    Raises:
        ValueError: an unknown name (the message lists the registered ones).
    """
    if name not in OBJECTIVES:
        raise ValueError(f"unknown objective {name!r}; {choice_hint(name, OBJECTIVES)}")
    return OBJECTIVES[name]


OBJECTIVES = {
    "clm": Objective(
        name="clm",
        auto_class=AutoModelForCausalLM,
        build_collator=causal_lm_collator,
        labels_in_blocks=True,
        shifts_labels=True,
        predicts_every_token=True,
        can_generate=True,
    ),
    "mlm": Objective(
        name="mlm",
        auto_class=AutoModelForMaskedLM,
        build_collator=masked_lm_collator,
        labels_in_blocks=False,
        shifts_labels=False,
        predicts_every_token=False,
        can_generate=False,
        flags={"mlm_probability": 0.15, "whole_word_mask": False},
    ),
    "span": Objective(
        name="span",
        auto_class=AutoModelForSeq2SeqLM,
        build_collator=span_corruption_collator,
        labels_in_blocks=False,
        shifts_labels=False,
        predicts_every_token=False,
        can_generate=True,
        flags={"noise_density": 0.15, "mean_noise_span_length": 3.0},
    ),
}
