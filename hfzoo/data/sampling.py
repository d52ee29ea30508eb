"""Training-order samplers: examples of similar length batched together, reproducibly per epoch.

Batching examples of similar length cuts the padding that `DataCollatorWithPadding` adds to every batch's
longest example (on SST-2 with batches of 32, about 3x the real tokens when shuffled plainly, 1.06x grouped).
The grouping is transformers' own (`transformers.trainer_pt_utils.LengthGroupedSampler`, what
`TrainingArguments(group_by_length=True)` uses); this module only seeds it per epoch, as accelerate's
`SeedableRandomSampler` seeds a plain shuffle, so that a resumed run draws the same order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from transformers.trainer_pt_utils import LengthGroupedSampler

__all__ = ["EpochLengthGroupedSampler"]


class EpochLengthGroupedSampler(LengthGroupedSampler):
    """transformers' `LengthGroupedSampler`, its shuffle seeded with `seed + epoch` at every epoch.

    Each epoch is a random permutation of all indices, cut into mega-batches of `mega_batch_mult x
    batch_size` examples (transformers' default: 50, or fewer so that there are at least 4), each sorted by
    length, longest first; the batch holding the longest example comes first.

    Args:
        batch_size: examples per batch (per process).
        lengths: the length (tokens) of every example.
        seed: the shuffle of epoch `e` is drawn from `torch.Generator().manual_seed(seed + e)`.

    Raises:
        ValueError: an empty `lengths`, or a `batch_size` below 1.
    """

    def __init__(self, batch_size: int, lengths: Sequence[int], seed: int):
        if batch_size < 1:
            raise ValueError(f"batch_size must be a positive number of examples, got {batch_size}")
        if len(lengths) == 0:
            raise ValueError("lengths is empty: length grouping needs at least one example")
        super().__init__(batch_size, lengths=list(lengths), generator=torch.Generator())
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Draw the order of epoch `epoch` next (accelerate's data loaders call this every epoch)."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        self.generator.manual_seed(self.seed + self.epoch)
        return super().__iter__()
