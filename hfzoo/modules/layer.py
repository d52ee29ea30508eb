"""One Transformer layer and its residual wiring (`config.norm_position`, `rezero`, `fixup_init`).

Each sub-block F (self-attention, cross-attention, feed-forward) is wrapped by a `Residual`:
```
pre      (default; GPT-2, T5, Narang et al.'s baseline):  x = x + Dropout(F(Norm(x)))
post     (original Transformer, BERT):                     x = Norm(x + Dropout(F(x)))
sandwich (Ding et al. 2021, CogView §2.4):                 x = x + Dropout(Norm'(F(Norm(x))))
deepnorm (Wang et al. 2022, DeepNet eq. 1):                x = Norm(alpha * x + Dropout(F(x)))
rezero   (Bachlechner et al. 2020, eq. 3):                 F(.) -> a * F(.), scalar a initialised to 0
fixup    (Zhang et al. 2019, §3; with norm_type "none"):   F(.) -> s * F(. + b_in) + b_out, s=1, b=0 at init
```
`norm_type="none"` makes Norm an identity (ReZero alone, Fixup). DeepNorm and Fixup also rescale the
initialisation of the residual branches (`mark_residual_branch_init`, applied by the models' `_init_weights`).
Options are registered in `NORM_POSITIONS` at the bottom of this file.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn
from transformers.cache_utils import Cache
from transformers.modeling_layers import GradientCheckpointingLayer

from .attention import HfzooAttention
from .experts import SparseMoeFeedForward, is_moe_layer
from .feed_forward import FeedForward
from .norms import build_norm


def deepnorm_constants(config, is_decoder_side: bool) -> tuple[float, float]:
    """DeepNorm's residual scale alpha and initialisation gain beta (Wang et al. 2022, "DeepNet", Fig. 2 / Table 1).

    Encoder-only and decoder-only with N layers: alpha = (2N)^(1/4), beta = (8N)^(-1/4). Encoder-decoder
    with N encoder and M decoder layers: encoder alpha = 0.81 (N^4 M)^(1/16), beta = 0.87 (N^4 M)^(-1/16);
    decoder alpha = (3M)^(1/4), beta = (12M)^(-1/4).

    Args:
        config: an hfzoo config (`num_hidden_layers`; `num_decoder_layers` for the encoder-decoder).
        is_decoder_side: the layer belongs to the decoder of an encoder-decoder (has cross-attention).

    Returns:
        `(alpha, beta)`.
    """
    if getattr(config, "is_encoder_decoder", False):
        n, m = config.num_hidden_layers, config.num_decoder_layers
        if is_decoder_side:
            return (3 * m) ** 0.25, (12 * m) ** -0.25
        return 0.81 * (n**4 * m) ** (1 / 16), 0.87 * (n**4 * m) ** (-1 / 16)
    n = config.num_hidden_layers
    return (2 * n) ** 0.25, (8 * n) ** -0.25


def num_residual_branches(config) -> int:
    """Fixup's L: the number of residual branches in the whole network (2 per layer, 3 with cross-attention)."""
    if getattr(config, "is_encoder_decoder", False):
        return 2 * config.num_hidden_layers + 3 * config.num_decoder_layers
    return 2 * config.num_hidden_layers


class Residual(nn.Module):
    """The residual connection around one sub-block, wired by `config.norm_position` (see the module docstring).

    The sub-block's normalization is owned by the layer (`self_attn_norm`, ...) and passed in, so the
    parameter names of pre-/post-LN checkpoints do not change; this module holds only what the variant
    adds: `post_norm` (sandwich), `rezero_alpha` (ReZero), `fixup_bias_in` / `fixup_scale` /
    `fixup_bias_out` (Fixup's scalar biases and multiplier, Zhang et al. 2019 Fig. 1), and the DeepNorm
    constants `deepnorm_alpha` / `deepnorm_beta` (plain floats).

    Args:
        config: an hfzoo config.
        is_decoder_side: the layer is in the decoder of an encoder-decoder (for DeepNorm's constants).

    Shapes:
        `hidden_states` `(batch_size, seq_len, hidden_size)` -> same shape.
    """

    def __init__(self, config, is_decoder_side: bool = False) -> None:
        super().__init__()
        self.norm_position = config.norm_position
        self.post_norm = build_norm(config) if config.norm_position == "sandwich" else None
        self.rezero_alpha = nn.Parameter(torch.zeros(1)) if config.rezero else None
        if config.fixup_init:
            self.fixup_bias_in = nn.Parameter(torch.zeros(1))
            self.fixup_scale = nn.Parameter(torch.ones(1))
            self.fixup_bias_out = nn.Parameter(torch.zeros(1))
        else:
            self.fixup_bias_in = self.fixup_scale = self.fixup_bias_out = None
        self.deepnorm_alpha, self.deepnorm_beta = (
            deepnorm_constants(config, is_decoder_side) if config.norm_position == "deepnorm" else (1.0, 1.0)
        )

    def forward(
        self, hidden_states: torch.Tensor, norm: nn.Module, sublayer: Callable, dropout: nn.Module
    ) -> torch.Tensor:
        """Apply `sublayer` with its residual connection.

        Args:
            hidden_states: `(batch_size, seq_len, hidden_size)`.
            norm: the sub-block's normalization (an identity with `norm_type="none"`).
            sublayer: maps `(batch_size, seq_len, hidden_size)` to the same shape.
            dropout: residual dropout.

        Returns:
            `(batch_size, seq_len, hidden_size)`.
        """
        normalize_input = self.norm_position in ("pre", "sandwich")
        branch = norm(hidden_states) if normalize_input else hidden_states
        if self.fixup_bias_in is not None:
            branch = branch + self.fixup_bias_in
        branch = sublayer(branch)
        if self.post_norm is not None:
            branch = self.post_norm(branch)
        if self.fixup_scale is not None:
            branch = branch * self.fixup_scale + self.fixup_bias_out
        if self.rezero_alpha is not None:
            branch = branch * self.rezero_alpha
        branch = dropout(branch)
        if normalize_input:
            return hidden_states + branch
        return norm(hidden_states * self.deepnorm_alpha + branch)

    def extra_repr(self) -> str:
        """Show the placement (and DeepNorm's alpha) in `print(model)`."""
        alpha = f", alpha={self.deepnorm_alpha:.4g}" if self.norm_position == "deepnorm" else ""
        return f"norm_position={self.norm_position}{alpha}"


def mark_residual_branch_init(layer: HfzooLayer, config) -> None:
    """Tag the projections whose initialisation DeepNorm or Fixup rescales (no-op otherwise).

    Sets `residual_init_scale` on those `nn.Linear`s: the models' `_init_weights` then draws their weight
    from normal(0, `initializer_range * residual_init_scale`), zero when the scale is 0, through
    transformers' `initialization` functions (which skip tensors that `from_pretrained` loaded). Tagging
    the projections themselves is needed because transformers initialises only modules that own tensors.

    - DeepNorm (Wang et al. 2022, Algorithm 1 / torchscale): v_proj, o_proj and the feed-forward
      projections (every expert's) scaled by beta; q_proj and k_proj unchanged.
    - Fixup (Zhang et al. 2019, §3, rules 2-3): the last projection of each branch (o_proj, down_proj)
      zero, the others on the branch's value path (v_proj, up_proj, gate_proj) scaled by L^(-1/(2m-2)) with
      m = 2 layers per branch and L = `num_residual_branches(config)`; q_proj/k_proj unchanged. The
      output layer is not zeroed (it is usually tied to the input embeddings).

    Args:
        layer: an `HfzooLayer` being built.
        config: its config.
    """
    if config.norm_position == "deepnorm":
        first = last = layer.mlp_residual.deepnorm_beta
    elif config.fixup_init:
        first, last = num_residual_branches(config) ** (-1 / (2 * 2 - 2)), 0.0
    else:
        return
    for attn in (layer.self_attn, layer.cross_attn):
        if attn is not None:
            attn.v_proj.residual_init_scale = first
            attn.o_proj.residual_init_scale = last
    for mlp in _feed_forwards(layer.mlp):
        for proj in (mlp.gate_proj, mlp.up_proj):
            if proj is not None:
                proj.residual_init_scale = first
        mlp.down_proj.residual_init_scale = last


def _feed_forwards(mlp: nn.Module) -> list[FeedForward]:
    """The dense feed-forward blocks of a layer's `mlp` (the experts of a mixture-of-experts block)."""
    return list(mlp.experts) if isinstance(mlp, SparseMoeFeedForward) else [mlp]


class HfzooLayer(GradientCheckpointingLayer):
    """Self-attention, (cross-attention,) feed-forward, each wrapped in a residual connection with normalization.

    Each sub-block has its norm (`self_attn_norm`, `cross_attn_norm`, `mlp_norm`) and a `Residual`
    (`*_residual`) that wires it by `config.norm_position` and holds the ReZero / Fixup scalars. The
    feed-forward `mlp` is a `FeedForward`, or a `SparseMoeFeedForward` on the layers selected by
    `config.num_experts` / `moe_layer_interval` (`hfzoo.modules.experts.is_moe_layer`).
    Subclassing `GradientCheckpointingLayer` makes `model.gradient_checkpointing_enable()` recompute
    this layer in the backward pass.

    Args:
        config: an hfzoo config.
        layer_idx: index of the layer in its stack (for the KV cache and the choice of MoE layers).
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
        self.self_attn_residual = Residual(config, has_cross_attention)
        if has_cross_attention:
            self.cross_attn = HfzooAttention(config, layer_idx, is_causal=False, is_cross_attention=True)
            self.cross_attn_norm = build_norm(config)
            self.cross_attn_residual = Residual(config, has_cross_attention)
        else:
            self.cross_attn = self.cross_attn_norm = self.cross_attn_residual = None
        self.mlp = SparseMoeFeedForward(config) if is_moe_layer(config, layer_idx) else FeedForward(config)
        self.mlp_norm = build_norm(config)
        self.mlp_residual = Residual(config, has_cross_attention)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        mark_residual_branch_init(self, config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        padding_mask: torch.Tensor | None = None,
        **kwargs,
    ) -> torch.Tensor:
        """Run the layer.

        Args:
            hidden_states: `(batch_size, seq_len, hidden_size)`.
            attention_mask: backend-specific self-attention mask (see `HfzooAttention`).
            past_key_values: a transformers `Cache` (`EncoderDecoderCache` with cross-attention), updated in place.
            encoder_hidden_states: `(batch_size, src_len, hidden_size)` (layers with cross-attention).
            encoder_attention_mask: backend-specific cross-attention mask over the encoder outputs.
            padding_mask: `(batch_size, seq_len)` bool, False for padding, or None; read only by a
                mixture-of-experts feed-forward (padding is never routed nor counted against capacity).
            **kwargs: forwarded to the attention backend.

        Returns:
            `(batch_size, seq_len, hidden_size)`.
        """

        def attend(x: torch.Tensor) -> torch.Tensor:
            return self.self_attn(x, attention_mask=attention_mask, past_key_values=past_key_values, **kwargs)[0]

        hidden_states = self.self_attn_residual(hidden_states, self.self_attn_norm, attend, self.dropout)
        if self.cross_attn is not None:

            def cross_attend(x: torch.Tensor) -> torch.Tensor:
                return self.cross_attn(
                    x,
                    attention_mask=encoder_attention_mask,
                    past_key_values=past_key_values,
                    key_value_states=encoder_hidden_states,
                    **kwargs,
                )[0]

            hidden_states = self.cross_attn_residual(hidden_states, self.cross_attn_norm, cross_attend, self.dropout)
        mlp = partial(self.mlp, padding_mask=padding_mask) if isinstance(self.mlp, SparseMoeFeedForward) else self.mlp
        return self.mlp_residual(hidden_states, self.mlp_norm, mlp, self.dropout)


# Placements of the norms around each sub-block (see `Residual.forward`), and whether the stack ends
# with a final norm (pre-norm placements leave the residual stream unnormalised).
NORM_POSITIONS = {
    "pre": {"final_norm": True},  # Xiong et al. 2020 ("pre-LN"); GPT-2, T5
    "post": {"final_norm": False},  # Vaswani et al. 2017 §5.4; BERT
    "sandwich": {"final_norm": True},  # Ding et al. 2021 (CogView) §2.4
    "deepnorm": {"final_norm": False},  # Wang et al. 2022 (DeepNet) eq. 1
}
