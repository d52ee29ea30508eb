"""Multi-head attention through transformers' attention interface.

`HfzooAttention` projects queries, keys and values, updates a transformers `Cache` when one is given,
and calls the backend named by `config._attn_implementation` ("eager", "sdpa", "flash_attention_2",
"flex_attention", ... as registered in `transformers.modeling_utils.ALL_ATTENTION_FUNCTIONS`).
`eager_attention_forward` below is the reference implementation every backend must agree with.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.cache_utils import Cache, EncoderDecoderCache
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    position_bias: torch.Tensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention, written out (Vaswani et al. 2017, §3.2.1, eq. 1).

    `softmax(Q K^T * scaling + position_bias + mask) V`, softmax in float32.

    Args:
        module: the calling attention module (for `training`).
        query: `(batch_size, num_heads, q_len, head_dim)`.
        key: `(batch_size, num_heads, kv_len, head_dim)`.
        value: `(batch_size, num_heads, kv_len, head_dim)`.
        attention_mask: additive float mask broadcastable to `(batch_size, num_heads, q_len, kv_len)`
            (0 where attending, the dtype's minimum where masked), as built by `transformers.masking_utils`
            for the eager backend; or None.
        scaling: multiplier of the scores, usually `head_dim ** -0.5`.
        dropout: dropout probability on the attention weights (applied only in training).
        position_bias: optional additive score bias `(batch_size or 1, num_heads, q_len, kv_len)`.
        **kwargs: ignored backend options.

    Returns:
        `(attn_output, attn_weights)`: `(batch_size, q_len, num_heads, head_dim)` and
        `(batch_size, num_heads, q_len, kv_len)`.
    """
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling  # (batch, heads, q_len, kv_len)
    if position_bias is not None:
        scores = scores + position_bias
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, :, : key.shape[-2]]
    weights = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()  # (batch, q_len, heads, head_dim)
    return output, weights


class HfzooAttention(nn.Module):
    """Multi-head attention (Vaswani et al. 2017, §3.2.2) with a pluggable backend and KV cache.

    Self-attention, or cross-attention to encoder outputs when `is_cross_attention`. Reads
    `hidden_size`, `num_attention_heads`, `head_dim` (T5's d_kv; defaults to
    `hidden_size // num_attention_heads`), `attention_bias` and `attention_probs_dropout_prob`.
    The projections are named `q_proj`, `k_proj`, `v_proj`, `o_proj` (PEFT's usual `target_modules`).

    Args:
        config: an hfzoo config.
        layer_idx: index of the layer, used to address the `Cache`.
        is_causal: whether the attention is causal (decoder self-attention); the mask itself comes
            from the model, this flag lets SDPA/flash backends use their causal kernels when no mask
            is needed.
        is_cross_attention: keys/values come from `key_value_states` (encoder outputs).

    Shapes:
        `hidden_states` `(batch_size, q_len, hidden_size)` -> `(batch_size, q_len, hidden_size)`.
    """

    def __init__(self, config, layer_idx: int, is_causal: bool, is_cross_attention: bool = False) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.is_causal = is_causal and not is_cross_attention
        self.is_cross_attention = is_cross_attention
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        inner = self.num_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, inner, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, inner, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, inner, bias=config.attention_bias)
        self.o_proj = nn.Linear(inner, config.hidden_size, bias=config.attention_bias)

    def _project_key_value(self, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (*states.shape[:-1], self.num_heads, self.head_dim)
        # (batch, kv_len, hidden) -> (batch, heads, kv_len, head_dim)
        return self.k_proj(states).view(shape).transpose(1, 2), self.v_proj(states).view(shape).transpose(1, 2)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        key_value_states: torch.Tensor | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend from `hidden_states` to itself (plus cached keys/values) or to `key_value_states`.

        Args:
            hidden_states: `(batch_size, q_len, hidden_size)`.
            attention_mask: the backend-specific mask from `transformers.masking_utils` (None when the
                backend can rely on `is_causal` alone).
            past_key_values: a transformers `Cache`, updated in place. For an `EncoderDecoderCache`,
                self-attention uses its `self_attention_cache`; cross-attention stores the encoder's
                keys/values in its `cross_attention_cache` once and reuses them at later steps.
            key_value_states: `(batch_size, kv_len, hidden_size)` encoder outputs (cross-attention).
            **kwargs: forwarded to the attention backend.

        Returns:
            `(attn_output, attn_weights)`: `(batch_size, q_len, hidden_size)` and the attention
            probabilities `(batch_size, num_heads, q_len, kv_len)` (None for fused backends).

        Raises:
            ValueError: a cross-attention module called without `key_value_states`.
        """
        batch_size, q_len, _ = hidden_states.shape
        # (batch, q_len, hidden) -> (batch, heads, q_len, head_dim)
        query = self.q_proj(hidden_states).view(batch_size, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        if self.is_cross_attention:
            if key_value_states is None:
                raise ValueError("cross-attention needs key_value_states (the encoder outputs)")
            cache = past_key_values.cross_attention_cache if isinstance(past_key_values, EncoderDecoderCache) else None
            if cache is not None and past_key_values.is_updated.get(self.layer_idx):
                key, value = cache.layers[self.layer_idx].keys, cache.layers[self.layer_idx].values
            else:
                key, value = self._project_key_value(key_value_states)
                if cache is not None:
                    key, value = cache.update(key, value, self.layer_idx)
                    past_key_values.is_updated[self.layer_idx] = True
        else:
            key, value = self._project_key_value(hidden_states)
            cache = (
                past_key_values.self_attention_cache
                if isinstance(past_key_values, EncoderDecoderCache)
                else past_key_values
            )
            if cache is not None:
                key, value = cache.update(key, value, self.layer_idx)
        attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
        output, weights = attention(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=self.config.attention_probs_dropout_prob if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )
        output = output.reshape(batch_size, q_len, -1).contiguous()  # (batch, q_len, heads * head_dim)
        return self.o_proj(output), weights
