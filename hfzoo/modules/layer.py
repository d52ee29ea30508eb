"""One Transformer layer and its residual wiring (`config.norm_position`).

```
pre  (default; GPT-2, T5, Narang et al.'s baseline):  x = x + Dropout(Sublayer(Norm(x)))
post (original Transformer, BERT):                     x = Norm(x + Dropout(Sublayer(x)))
```
Options are registered in `NORM_POSITIONS` at the bottom of this file.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from transformers.cache_utils import Cache
from transformers.modeling_layers import GradientCheckpointingLayer

from .attention import HfzooAttention
from .feed_forward import FeedForward
from .norms import build_norm


def pre_norm_residual(
    hidden_states: torch.Tensor, norm: nn.Module, sublayer: Callable, dropout: nn.Module
) -> torch.Tensor:
    """`x + dropout(sublayer(norm(x)))`: layer norm before the sub-block (Xiong et al. 2020, "pre-LN").

    Args:
        hidden_states: `(batch_size, seq_len, hidden_size)`.
        norm: the sub-block's normalization.
        sublayer: maps `(batch_size, seq_len, hidden_size)` to the same shape.
        dropout: residual dropout.

    Returns:
        `(batch_size, seq_len, hidden_size)`.
    """
    return hidden_states + dropout(sublayer(norm(hidden_states)))


def post_norm_residual(
    hidden_states: torch.Tensor, norm: nn.Module, sublayer: Callable, dropout: nn.Module
) -> torch.Tensor:
    """`norm(x + dropout(sublayer(x)))`: the original Transformer's "post-LN" (Vaswani et al. 2017, §5.4).

    Args and returns as `pre_norm_residual`.
    """
    return norm(hidden_states + dropout(sublayer(hidden_states)))


class HfzooLayer(GradientCheckpointingLayer):
    """Self-attention, (cross-attention,) feed-forward, each wrapped in a residual connection with normalization.

    Subclassing `GradientCheckpointingLayer` makes `model.gradient_checkpointing_enable()` recompute
    this layer in the backward pass.

    Args:
        config: an hfzoo config.
        layer_idx: index of the layer (for the KV cache).
        is_causal: causal self-attention (decoder) or bidirectional (encoder).
        has_cross_attention: add a cross-attention sub-block between self-attention and the
            feed-forward (the decoder of an encoder-decoder, Vaswani et al. 2017 §3.1).

    Shapes:
        `hidden_states` `(batch_size, seq_len, hidden_size)` -> same shape.
    """

    def __init__(self, config, layer_idx: int, is_causal: bool, has_cross_attention: bool = False) -> None:
        super().__init__()
        self.self_attn = HfzooAttention(config, layer_idx, is_causal=is_causal)
        self.self_attn_norm = build_norm(config)
        if has_cross_attention:
            self.cross_attn = HfzooAttention(config, layer_idx, is_causal=False, is_cross_attention=True)
            self.cross_attn_norm = build_norm(config)
        else:
            self.cross_attn = self.cross_attn_norm = None
        self.mlp = FeedForward(config)
        self.mlp_norm = build_norm(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.residual = NORM_POSITIONS[config.norm_position]

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        **kwargs,
    ) -> torch.Tensor:
        """Run the layer.

        Args:
            hidden_states: `(batch_size, seq_len, hidden_size)`.
            attention_mask: backend-specific self-attention mask (see `HfzooAttention`).
            past_key_values: a transformers `Cache` (`EncoderDecoderCache` with cross-attention), updated in place.
            encoder_hidden_states: `(batch_size, src_len, hidden_size)` (layers with cross-attention).
            encoder_attention_mask: backend-specific cross-attention mask over the encoder outputs.
            **kwargs: forwarded to the attention backend.

        Returns:
            `(batch_size, seq_len, hidden_size)`.
        """

        def attend(x: torch.Tensor) -> torch.Tensor:
            return self.self_attn(x, attention_mask=attention_mask, past_key_values=past_key_values, **kwargs)[0]

        hidden_states = self.residual(hidden_states, self.self_attn_norm, attend, self.dropout)
        if self.cross_attn is not None:

            def cross_attend(x: torch.Tensor) -> torch.Tensor:
                return self.cross_attn(
                    x,
                    attention_mask=encoder_attention_mask,
                    past_key_values=past_key_values,
                    key_value_states=encoder_hidden_states,
                    **kwargs,
                )[0]

            hidden_states = self.residual(hidden_states, self.cross_attn_norm, cross_attend, self.dropout)
        return self.residual(hidden_states, self.mlp_norm, self.mlp, self.dropout)


NORM_POSITIONS = {
    "pre": pre_norm_residual,
    "post": post_norm_residual,
}
