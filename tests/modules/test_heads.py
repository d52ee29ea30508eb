"""The pooling of the classification heads, against a plain loop over each row's ids."""

import pytest
import torch

from hfzoo.modules.heads import last_eos_pool, last_token_pool

PAD, EOS = 0, 1


def rows_of_ids():
    """Right- and left-padded rows, an eos in the middle of a row, and a row of only real tokens."""
    return torch.tensor(
        [
            [5, 6, 7, EOS, PAD, PAD],
            [PAD, PAD, 8, 9, 3, EOS],
            [4, EOS, 5, 6, EOS, PAD],
            [4, 5, 6, 7, 8, EOS],
        ]
    )


def test_last_eos_pool_takes_each_rows_rightmost_eos():
    ids = rows_of_ids()
    hidden = torch.randn(ids.shape[0], ids.shape[1], 3)
    expected = torch.stack([hidden[i, max(j for j, t in enumerate(row) if t == EOS)] for i, row in enumerate(ids)])
    torch.testing.assert_close(last_eos_pool(hidden, ids, EOS), expected, rtol=0, atol=0)


def test_last_token_pool_takes_each_rows_rightmost_real_token():
    ids = rows_of_ids()
    hidden = torch.randn(ids.shape[0], ids.shape[1], 3)
    expected = torch.stack([hidden[i, max(j for j, t in enumerate(row) if t != PAD)] for i, row in enumerate(ids)])
    torch.testing.assert_close(last_token_pool(hidden, ids, PAD), expected, rtol=0, atol=0)
    with pytest.raises(ValueError, match="no padding token"):
        last_token_pool(hidden, ids, None)
