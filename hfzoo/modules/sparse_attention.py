"""Attention with sparse patterns: a sliding (local) window.

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
"""

from __future__ import annotations

from collections.abc import Callable

from .attention import HfzooAttention


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
        """(query, key) pairs within the window `|i - j| <= w/2` over `seq_len` tokens (`hfzoo.training.flops`).

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
