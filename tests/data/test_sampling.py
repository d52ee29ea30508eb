"""The length-grouped training order: a permutation per epoch, reproducible, less padding than a plain shuffle."""

import numpy as np
import pytest
import torch

from hfzoo.data.sampling import EpochLengthGroupedSampler


def _padded_tokens(order: list[int], lengths: list[int], batch_size: int) -> int:
    """Tokens after padding every batch of `order` to its longest example (DataCollatorWithPadding)."""
    return sum(max(lengths[i] for i in order[s : s + batch_size]) * len(order[s : s + batch_size])
               for s in range(0, len(order), batch_size))  # fmt: skip


@pytest.fixture
def lengths() -> list[int]:
    # skewed like GLUE sentences (most short, a long tail), as many as the study's SST-2 subset
    return (np.random.default_rng(0).lognormal(mean=2.8, sigma=0.6, size=4000).astype(int) + 1).tolist()


def test_every_epoch_is_a_permutation_drawn_from_seed_and_epoch(lengths):
    sampler = EpochLengthGroupedSampler(32, lengths, seed=7)
    epochs = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        epochs.append(list(sampler))
        assert sorted(epochs[-1]) == list(range(len(lengths)))
    assert len({tuple(order) for order in epochs}) == 3  # a new order every epoch
    again = EpochLengthGroupedSampler(32, lengths, seed=7)
    again.set_epoch(1)
    assert list(again) == epochs[1]  # what a resumed run draws: no state but (seed, epoch)
    assert list(again) == epochs[1]  # iterating twice does not advance anything
    other = EpochLengthGroupedSampler(32, lengths, seed=8)
    other.set_epoch(1)
    assert list(other) != epochs[1]


def test_grouping_cuts_padding_against_a_plain_shuffle(lengths):
    batch_size = 32
    grouped = _padded_tokens(list(EpochLengthGroupedSampler(batch_size, lengths, seed=0)), lengths, batch_size)
    shuffled = [
        _padded_tokens(
            torch.randperm(len(lengths), generator=torch.Generator().manual_seed(s)).tolist(), lengths, batch_size
        )
        for s in range(5)
    ]
    real = sum(lengths)
    assert grouped / real < 1.25 and min(shuffled) / real > 2 * grouped / real


@pytest.mark.parametrize("batch_size, lengths, match", [(0, [3, 4], "batch_size"), (4, [], "lengths is empty")])
def test_bad_arguments_are_refused(batch_size, lengths, match):
    with pytest.raises(ValueError, match=match):
        EpochLengthGroupedSampler(batch_size, lengths, seed=0)
