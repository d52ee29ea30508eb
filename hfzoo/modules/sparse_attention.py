"""Attention with sparse patterns: a sliding (local) window, and BigBird's block-sparse pattern.

`SlidingWindowAttention` is `HfzooAttention` restricted to a local window (Beltagy et al. 2020,
"Longformer: The Long-Document Transformer", §3.1 "Sliding Window"; the local attention of Child et al.
2019 and Parmar et al. 2018): with `attention_window = w`, each token attends to the w/2 tokens on each
side of it and itself in a bidirectional stack, and to the w/2 tokens before it and itself in a causal
stack (Longformer's `attention_window`, an even number: "w/2 tokens on each side"). Registered as
`token_mixer="sliding_window"` in `hfzoo.modules.mixers.TOKEN_MIXERS`, in every family and direction, with
the KV cache.

The window is applied twice, so that every backend honours it: the entry's `mask_overlay` (`window_overlay`)
is intersected by the stack with its causal / bidirectional mask through `transformers.masking_utils` (the
banded mask eager and SDPA use; flex attention builds its block mask from it), and the mixer passes
`sliding_window = w/2 + 1` to the attention backend, which transformers' flash-attention path turns into
flash attention's native window `window_size = (w/2, w/2)` (left, right; the right side is cut by causality
in a causal stack). The KV cache is a plain `DynamicCache` (it keeps every key; the mask hides those
outside the window).

`BigBirdAttention` is `HfzooAttention` under BigBird's block-sparse pattern (Zaheer et al. 2020, "Big Bird:
Transformers for Longer Sequences", §2 and App. D, the ITC construction), `token_mixer="bigbird"`: the
sequence is cut into blocks of `bigbird_block_size` tokens; a query block attends to its window (itself and
its neighbouring blocks: 3 blocks), to the `bigbird_num_global_blocks` global blocks (the first ones and the
last ones of the sequence; 2 = the first and the last block, as BigBird-ITC), and to
`bigbird_num_random_blocks` random blocks; global blocks attend to every block. Random blocks are drawn per
layer and head (as the paper's code), from a generator seeded by the layer index and the sequence's number of
blocks, so the pattern is the same in training and evaluation and after save / load. It is expressed as a
dense mask (`bigbird_block_pattern` expanded to tokens), which eager and SDPA apply: at hfzoo's sizes the
dense scores cost less than the block gathering of the paper's kernels, and the result is the same.
Bidirectional stacks only (a global or random block may lie after the query).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

from .attention import HfzooAttention, add_bias_to_mask


def check_attention_window(config) -> None:
    """Refuse a bad `attention_window` (`TOKEN_MIXERS["sliding_window"].check_config`, run when the config is built).

    Raises:
        ValueError: `attention_window` not a positive even integer.
    """
    window = config.attention_window
    if not isinstance(window, int) or isinstance(window, bool) or window < 2 or window % 2:
        raise ValueError(
            f"attention_window must be a positive even integer (w/2 tokens on each side of a token, as Longformer), "
            f"got {window!r}"
        )


def window_overlay(config) -> Callable:
    """The local window as a transformers mask function: `|q_idx - kv_idx| <= attention_window / 2`.

    `TOKEN_MIXERS["sliding_window"].mask_overlay`: the stack intersects it with its causal (so `kv_idx <= q_idx`
    as well) or bidirectional mask. Indices are positions in the sequence (cached positions included), so the
    window slides along the KV cache in generation.

    Args:
        config: an hfzoo config with `attention_window`.

    Returns:
        `(batch_idx, head_idx, q_idx, kv_idx) -> bool` (True = may attend), on ints or index tensors.
    """
    reach = config.attention_window // 2

    def inside_window(batch_idx, head_idx, q_idx, kv_idx):
        return abs(q_idx - kv_idx) <= reach

    return inside_window


class SlidingWindowAttention(HfzooAttention):
    """Multi-head attention within a local window (Beltagy et al. 2020, §3.1), `token_mixer="sliding_window"`.

    `HfzooAttention` (same projections, positions, KV cache and backends) whose mask the stack restricts to
    the window (`window_overlay`), and which passes the window to the backend as `sliding_window` (flash
    attention's native window). Reads `config.attention_window` (w, even): `w/2` tokens on each side (the
    preceding side only in a causal stack).

    Args:
        config: an hfzoo config.
        layer_idx: the mixer's index among its stack's token mixers (its KV-cache layer).
        is_causal: the stack is causal.

    Shapes:
        `hidden_states` `(batch_size, q_len, hidden_size)` -> same shape (see `HfzooAttention.forward`).
    """

    def __init__(self, config, layer_idx: int, is_causal: bool) -> None:
        super().__init__(config, layer_idx, is_causal)
        self.reach = config.attention_window // 2

    @staticmethod
    def attention_pairs(config, seq_len: int) -> int:
        """(query, key) pairs within the window `|i - j| <= w/2` over `seq_len` tokens (`hfzoo.models.flops`).

        `L (2r + 1) - r (r + 1)` with `r = min(w/2, L - 1)`; `L ** 2` once the window covers the sequence. As
        for full attention, causal masking is not discounted (the symmetric band is counted in causal stacks).
        """
        reach = min(config.attention_window // 2, seq_len - 1)
        return seq_len * (2 * reach + 1) - reach * (reach + 1)

    def forward(self, hidden_states, *args, **kwargs):
        """`HfzooAttention.forward` with `sliding_window = attention_window / 2 + 1` for the attention backend.

        transformers' flash-attention path makes it flash attention's `window_size = (w/2, w/2)`; eager and
        SDPA ignore it (their mask carries the window). Arguments and returns as `HfzooAttention.forward`.
        """
        return super().forward(hidden_states, *args, sliding_window=self.reach + 1, **kwargs)


def check_bigbird_config(config) -> None:
    """Refuse bad BigBird fields (`TOKEN_MIXERS["bigbird"].check_config`, run when the config is built).

    Raises:
        ValueError: `bigbird_block_size` not a positive integer, or `bigbird_num_random_blocks` /
            `bigbird_num_global_blocks` not a non-negative integer.
    """
    minimum = {"bigbird_block_size": 1, "bigbird_num_random_blocks": 0, "bigbird_num_global_blocks": 0}
    for name, low in minimum.items():
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < low:
            kind = "a positive integer" if low else "a non-negative integer"
            raise ValueError(f"{name} must be {kind}, got {value!r}")


@functools.lru_cache(maxsize=512)
def bigbird_block_pattern(
    num_blocks: int, num_heads: int, num_random_blocks: int, num_global_blocks: int, seed: int
) -> torch.Tensor:
    """Which key blocks each query block attends to, per head (Zaheer et al. 2020, §2, App. D: BigBird-ITC).

    Query block i attends to the window blocks `|i - j| <= 1`, to the global blocks (the first
    `ceil(g / 2)` and the last `floor(g / 2)` blocks, `g = num_global_blocks`), and to `num_random_blocks`
    blocks drawn uniformly without replacement from the others (all of them when fewer remain); a global
    query block attends to every block. The draw is made per head from `torch.Generator().manual_seed(seed)`.
    Cached: do not modify the returned tensor.

    Args:
        num_blocks: blocks of the sequence (its last block may be shorter).
        num_heads: heads, each with its own random blocks.
        num_random_blocks: r.
        num_global_blocks: g.
        seed: seed of the random draw.

    Returns:
        `(num_heads, num_blocks, num_blocks)` bool on the CPU: `[h, i, j]` = query block i attends to key block j.
    """
    index = torch.arange(num_blocks)
    window = (index[:, None] - index[None, :]).abs() <= 1
    is_global = (index < (num_global_blocks + 1) // 2) | (index >= num_blocks - num_global_blocks // 2)
    fixed = window | is_global[:, None] | is_global[None, :]  # (num_blocks, num_blocks)
    pattern = fixed.expand(num_heads, -1, -1).clone()
    draws = min(num_random_blocks, num_blocks)
    if draws:
        scores = torch.rand(num_heads, num_blocks, num_blocks, generator=torch.Generator().manual_seed(seed))
        scores = scores.masked_fill(fixed, 2.0)  # candidates (scores < 1) first: the r smallest are the draw
        chosen = scores.topk(draws, dim=-1, largest=False).indices
        pattern |= torch.zeros_like(pattern).scatter(-1, chosen, True) & ~fixed
    return pattern


class BigBirdAttention(HfzooAttention):
    """Multi-head attention under BigBird's block-sparse pattern (Zaheer et al. 2020), `token_mixer="bigbird"`.

    `HfzooAttention` whose self-attention mask is restricted, in each layer, to the window + global + random
    block pattern of `bigbird_block_pattern` (seeded by the layer index), laid over each sequence's own tokens
    (blocks count from its first token, so padding never shifts them). Reads `bigbird_block_size`,
    `bigbird_num_random_blocks`, `bigbird_num_global_blocks`. Bidirectional stacks only; eager and SDPA.

    Args:
        config: an hfzoo config.
        layer_idx: the mixer's index among its stack's token mixers (seeds its random blocks).
        is_causal: must be False.

    Raises:
        ValueError: `is_causal=True` (the config refuses it before a model is built).

    Shapes:
        `hidden_states` `(batch_size, seq_len, hidden_size)` -> same shape (see `HfzooAttention.forward`).
    """

    def __init__(self, config, layer_idx: int, is_causal: bool) -> None:
        if is_causal:
            raise ValueError("BigBirdAttention's global and random blocks lie after the query: no causal stack")
        super().__init__(config, layer_idx, is_causal=False)
        self.block_size = config.bigbird_block_size
        self.num_random_blocks = config.bigbird_num_random_blocks
        self.num_global_blocks = config.bigbird_num_global_blocks

    def block_pattern(self, num_blocks: int) -> torch.Tensor:
        """This layer's `(num_heads, num_blocks, num_blocks)` bool block pattern for `num_blocks` blocks."""
        seed = 1_000_003 * self.layer_idx + num_blocks
        return bigbird_block_pattern(num_blocks, self.num_heads, self.num_random_blocks, self.num_global_blocks, seed)

    def token_pattern(self, padding_mask: torch.Tensor | None, seq_len: int, device: torch.device) -> torch.Tensor:
        """The block pattern laid over each sequence's tokens: may query i attend key j.

        Args:
            padding_mask: `(batch_size, seq_len)` bool, False at padding, or None.
            seq_len: tokens per row.
            device: where to build the result.

        Returns:
            `(batch_size or 1, num_heads, seq_len, seq_len)` bool. Keys at padding are never attended; a
            query at padding attends every real key (its output is never used).
        """
        real = torch.ones(1, seq_len, dtype=torch.bool, device=device) if padding_mask is None else padding_mask
        ranks = real.long().cumsum(-1) - 1  # each token's position among its row's tokens
        blocks = ranks.clamp(min=0) // self.block_size  # (batch, seq_len)
        rows = []
        for row, length in enumerate(real.sum(-1).tolist()):  # one pattern per row (not per token)
            pattern = self.block_pattern(max(1, math.ceil(length / self.block_size))).to(device)
            allowed = pattern[:, blocks[row, :, None], blocks[row, None, :]]  # (heads, seq_len, seq_len)
            allowed = (allowed | ~real[row, None, :, None]) & real[row, None, None, :]
            rows.append(allowed)
        return torch.stack(rows)

    def restrict_attention_mask(self, attention_mask, query, key, padding_mask):
        """The stack's mask with BigBird's pattern folded in, as an additive mask of the queries' dtype.

        Raises:
            ValueError: keys beyond the sequence's own (a cache, e.g. PEFT prefix tuning): the pattern
                covers the sequence's tokens only.
        """
        seq_len = query.shape[-2]
        if key.shape[-2] != seq_len:
            raise ValueError(
                f"token_mixer='bigbird' attends within the sequence ({seq_len} tokens), but got {key.shape[-2]} "
                "keys (a KV cache or prefix); BigBird's pattern is not defined for them"
            )
        allowed = self.token_pattern(padding_mask, seq_len, query.device)
        outside = torch.zeros(allowed.shape, dtype=query.dtype, device=query.device)
        outside = outside.masked_fill(~allowed, torch.finfo(query.dtype).min)
        return add_bias_to_mask(attention_mask, outside, query.dtype)

    @staticmethod
    def attention_pairs(config, seq_len: int) -> float:
        """(query, key) pairs of the pattern over `seq_len` tokens (`hfzoo.models.flops`): layer 0's, mean over heads.

        The other layers' random blocks differ only in whether they include the shorter last block. The
        dense-mask implementation computes every score; this counts those the pattern keeps (model FLOPs).
        """
        block = config.bigbird_block_size
        num_blocks = math.ceil(seq_len / block)
        pattern = bigbird_block_pattern(
            num_blocks,
            config.num_attention_heads,
            config.bigbird_num_random_blocks,
            config.bigbird_num_global_blocks,
            num_blocks,  # layer 0's seed
        )
        sizes = torch.full((num_blocks,), block, dtype=torch.float64)
        sizes[-1] = seq_len - block * (num_blocks - 1)
        return float(torch.einsum("hij,i,j->", pattern.double(), sizes, sizes)) / config.num_attention_heads
