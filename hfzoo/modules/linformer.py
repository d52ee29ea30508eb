"""Linformer attention (Wang et al. 2020, "Linformer: Self-Attention with Linear Complexity").

`LinformerAttention` is multi-head attention whose keys and values are projected along the sequence
dimension from n positions to k (§4, eq. 7): `head_i = Attention(Q W_i^Q, E_i K W_i^K, F_i V W_i^V)`, with
`E_i, F_i` of shape `(k, n)`, so attention costs O(n k) instead of O(n^2). It is registered as
`token_mixer="linformer"` in `hfzoo.modules.mixers.TOKEN_MIXERS` and reads two config fields:

- `linformer_k`: the projected length k (Wang et al. use k = 128 or 256 for n = 512);
- `linformer_sharing`: the paper's parameter sharing (§4, "Additional efficiency techniques"): `"headwise"`
  (one E and one F per layer shared by its heads; the paper's released code's default) or `"key_value"`
  (one projection per layer for both keys and values, E = F). Layerwise sharing (one projection for every
  layer) is not offered.

The projections map `max_position_embeddings` positions to k (the paper's n); a shorter sequence of L
tokens uses their first L columns, as the paper's code does. Bidirectional stacks only (the paper
pretrains bidirectional encoders): E and F mix every position's key into every projected key, so in a
causal stack a token would see later ones, and a growing KV cache has no fixed n to project.

Padding: keys and values of padding positions are zeroed before the projection (the paper's code lets
padding into the projection), and each row's tokens are moved to the first columns in their order, so a
padded row gives the same outputs as the same row without padding, whatever side the padding is on.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ..choices import choice_hint
from .attention import HfzooAttention, eager_attention_forward

#: `config.linformer_sharing` -> what it shares (Wang et al. 2020 §4).
LINFORMER_SHARING = {
    "headwise": "one E (keys) and one F (values) per layer, shared by its heads",
    "key_value": "one projection per layer for keys and values (E = F), shared by its heads",
}


def check_linformer_config(config) -> None:
    """Refuse bad Linformer fields (`TOKEN_MIXERS["linformer"].check_config`, run when the config is built).

    Raises:
        ValueError: `linformer_k` not a positive integer or above `max_position_embeddings` (no compression
            left), or `linformer_sharing` not a key of `LINFORMER_SHARING`.
    """
    k = config.linformer_k
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(f"linformer_k must be a positive integer (the projected length k), got {k!r}")
    if k > config.max_position_embeddings:
        raise ValueError(
            f"linformer_k={k} exceeds max_position_embeddings={config.max_position_embeddings}, the sequence "
            "length the projections compress; choose linformer_k <= max_position_embeddings"
        )
    if config.linformer_sharing not in LINFORMER_SHARING:
        raise ValueError(
            f"linformer_sharing={config.linformer_sharing!r} is not supported; "
            f"{choice_hint(config.linformer_sharing, LINFORMER_SHARING)}"
        )


class SequenceProjection(nn.Linear):
    """Linformer's E or F: a linear map along the sequence from `max_len` positions to k (Wang et al. 2020, eq. 7).

    An `nn.Linear(max_len, k, bias=False)` (initialised as every hfzoo linear layer) applied to the last
    dimension of its input, which holds positions; an input of L <= max_len positions uses the first L
    columns of the weight.

    Args:
        max_len: n, the longest sequence (tokens).
        projected_len: k.

    Shapes:
        `(..., seq_len)` -> `(..., projected_len)`.
    """

    def __init__(self, max_len: int, projected_len: int) -> None:
        super().__init__(max_len, projected_len, bias=False)

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        """Project the positions (last dimension) of `states` to k; `(..., seq_len)` -> `(..., projected_len)`."""
        return nn.functional.linear(states, self.weight[:, : states.shape[-1]])


class LinformerAttention(HfzooAttention):
    """Multi-head attention over keys and values projected to `linformer_k` positions (Wang et al. 2020, eq. 7).

    `q_proj`, `k_proj`, `v_proj`, `o_proj` as `HfzooAttention`; `key_projection` (E) and `value_projection`
    (F; None with `linformer_sharing="key_value"`, where E serves both) are `SequenceProjection`s shared by
    the heads. The attention itself goes through transformers' attention interface without a mask
    (`config._attn_implementation`: eager, SDPA, flash, ...). Bidirectional stacks only, no KV cache.

    Args:
        config: an hfzoo config (`linformer_k`, `linformer_sharing`, `max_position_embeddings`, and the
            attention fields of `HfzooAttention`).
        layer_idx: the mixer's index among its stack's token mixers.
        is_causal: must be False.

    Raises:
        ValueError: `is_causal=True` (the config refuses it before a model is built).

    Shapes:
        `hidden_states` `(batch_size, seq_len, hidden_size)` -> same shape; attention weights
        `(batch_size, num_heads, seq_len, linformer_k)` (eager only).
    """

    def __init__(self, config, layer_idx: int, is_causal: bool) -> None:
        if is_causal:
            raise ValueError("LinformerAttention projects keys along the sequence and cannot run in a causal stack")
        super().__init__(config, layer_idx, is_causal=False)
        self.max_len = config.max_position_embeddings
        self.key_projection = SequenceProjection(self.max_len, config.linformer_k)
        self.value_projection = (
            None if config.linformer_sharing == "key_value" else SequenceProjection(self.max_len, config.linformer_k)
        )

    @staticmethod
    def mixer_weights(config) -> int:
        """q, k, v, o plus E and F, each applied to every head's keys or values: `k * d_attn` per token each."""
        width = config.num_attention_heads * config.head_dim
        return HfzooAttention.mixer_weights(config) + 2 * config.linformer_k * width

    @staticmethod
    def attention_pairs(config, seq_len: int) -> int:
        """`seq_len * linformer_k`: every query against the k projected keys."""
        return seq_len * config.linformer_k

    def compress(
        self, states: torch.Tensor, projection: SequenceProjection, padding_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """Project keys or values along the sequence: `E K` (or `F V`), padding left out.

        Args:
            states: `(batch_size, num_heads, seq_len, head_dim)`.
            projection: E or F.
            padding_mask: `(batch_size, seq_len)` bool, False at padding, or None.

        Returns:
            `(batch_size, num_heads, linformer_k, head_dim)`.
        """
        states = states.transpose(2, 3)  # (batch, heads, head_dim, seq_len): positions last
        if padding_mask is not None and not bool(padding_mask.all()):
            # Zero the padding and move each row's tokens to its first columns (in order): the projection
            # then sees exactly what it sees for the row without padding.
            states = states * padding_mask[:, None, None, :].to(states.dtype)
            ranks = (padding_mask.long().cumsum(-1) - 1).clamp(min=0)[:, None, None, :].expand_as(states)
            states = torch.zeros_like(states).scatter_add(-1, ranks, states)
        return projection(states).transpose(2, 3)  # (batch, heads, k, head_dim)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache=None,
        padding_mask: torch.Tensor | None = None,
        position_embeddings=None,
        position_bias=None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend from every position to the k projected keys and values.

        Args:
            hidden_states: `(batch_size, seq_len, hidden_size)`, `seq_len <= max_position_embeddings`.
            attention_mask: unused (padding is left out of the projections through `padding_mask`).
            cache: must be None: the projections are defined over the sequence's own keys, which a
                cache or a prefix would extend.
            padding_mask: `(batch_size, seq_len)` bool, False at padding, or None.
            position_embeddings: unused (the config refuses rotary positions with this mixer).
            position_bias: unused (the config refuses score biases with this mixer).
            **kwargs: forwarded to the attention backend.

        Returns:
            `(attn_output, attn_weights)`: `(batch_size, seq_len, hidden_size)` and
            `(batch_size, num_heads, seq_len, linformer_k)` (None for fused backends).

        Raises:
            ValueError: a sequence longer than `max_position_embeddings` (the projections' n); `cache`
                given (e.g. PEFT prefix tuning, which would otherwise be ignored).
        """
        if cache is not None:
            raise ValueError(
                "token_mixer='linformer' projects the sequence's own keys and values, so a cache or a prefix (PEFT "
                "prefix tuning) cannot extend them; finetune with LoRA or fully instead"
            )
        batch_size, seq_len, _ = hidden_states.shape
        if seq_len > self.max_len:
            raise ValueError(
                f"sequence of {seq_len} tokens is longer than max_position_embeddings={self.max_len}, the length "
                "Linformer's sequence projections were built for"
            )
        # (batch, seq_len, hidden) -> (batch, heads, seq_len, head_dim)
        query = self._project_query(hidden_states)
        key, value = self._project_key_value(hidden_states)
        key = self.compress(key, self.key_projection, padding_mask)
        value_projection = self.key_projection if self.value_projection is None else self.value_projection
        value = self.compress(value, value_projection, padding_mask)
        dropout = self.config.attention_probs_dropout_prob if self.training else 0.0
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        output, weights = attention(self, query, key, value, None, dropout=dropout, scaling=self.scaling, **kwargs)
        output = output.reshape(batch_size, seq_len, -1).contiguous()  # (batch, seq_len, heads * head_dim)
        return self.o_proj(output), weights
