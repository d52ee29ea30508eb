"""Multi-head attention through transformers' attention interface.

`HfzooAttention` projects queries, keys and values, updates a transformers `Cache` when one is given,
and calls the backend named by `config._attn_implementation` ("eager", "sdpa", "flash_attention_2",
"flex_attention", ... as registered in `transformers.modeling_utils.ALL_ATTENTION_FUNCTIONS`).
`eager_attention_forward` below is the reference implementation every backend must agree with.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.cache_utils import Cache
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
    """Multi-head self-attention (Vaswani et al. 2017, §3.2.2) with a pluggable backend and KV cache.

    Reads `hidden_size`, `num_attention_heads`, `head_dim` (T5's d_kv; defaults to
    `hidden_size // num_attention_heads`), `attention_bias` and `attention_probs_dropout_prob`.
    The projections are named `q_proj`, `k_proj`, `v_proj`, `o_proj` (PEFT's usual `target_modules`).

    Args:
        config: an hfzoo config.
        layer_idx: index of the layer, used to address the `Cache`.
        is_causal: whether the attention is causal (decoders); the mask itself comes from the model,
            this flag lets SDPA/flash backends use their causal kernels when no mask is needed.

    Shapes:
        `hidden_states` `(batch_size, q_len, hidden_size)` -> `(batch_size, q_len, hidden_size)`.
    """

    def __init__(self, config, layer_idx: int, is_causal: bool) -> None:
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.is_causal = is_causal
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.scaling = self.head_dim**-0.5
        inner = self.num_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, inner, bias=config.attention_bias)
        self.k_proj = nn.Linear(config.hidden_size, inner, bias=config.attention_bias)
        self.v_proj = nn.Linear(config.hidden_size, inner, bias=config.attention_bias)
        self.o_proj = nn.Linear(inner, config.hidden_size, bias=config.attention_bias)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend from `hidden_states` to itself (plus the cached keys/values of earlier steps).

        Args:
            hidden_states: `(batch_size, q_len, hidden_size)`.
            attention_mask: the backend-specific mask from `transformers.masking_utils` (None when the
                backend can rely on `is_causal` alone).
            past_key_values: a transformers `Cache`; this layer's keys/values are appended to it.
            **kwargs: forwarded to the attention backend.

        Returns:
            `(attn_output, attn_weights)`: `(batch_size, q_len, hidden_size)` and the attention
            probabilities `(batch_size, num_heads, q_len, kv_len)` (None for fused backends).
        """
        batch_size, q_len, _ = hidden_states.shape
        shape = (batch_size, q_len, self.num_heads, self.head_dim)
        # (batch, q_len, hidden) -> (batch, heads, q_len, head_dim)
        query = self.q_proj(hidden_states).view(shape).transpose(1, 2)
        key = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        value = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        if past_key_values is not None:
            key, value = past_key_values.update(key, value, self.layer_idx)
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
