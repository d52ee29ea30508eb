"""The Evolved Transformer's cells (So et al. 2019, "The Evolved Transformer", Fig. 3; tensor2tensor's code).

`EvolvedTransformerLayer` replaces `HfzooLayer` when `config.layer_type="evolved_transformer"`
(`hfzoo.modules.stack.LAYER_TYPES`): one layer is one searched cell, the encoder cell in a bidirectional
stack and the decoder cell in a causal one. Every block is pre-norm with a residual connection
(`x + Dropout(block(Norm(x)))`), as the paper's cells:

```
encoder cell                                   decoder cell
  GLU: value(h) * sigmoid(gate(h))               wide self-attention (2 H heads)  +  cross-attention
  conv branches:                                 conv branches (causal):
    ReLU(Linear d -> 4d) + ReLU(conv 3x1 d -> d/2)   ReLU(sep conv 11x1 d -> 2d) + sep conv 7x1 d -> d/2
    Norm, sep conv 9x1 4d -> d/2 (padded to d)       Norm, sep conv 7x1 2d -> d
  self-attention (H heads)                       self-attention (H heads)
  feed-forward: d -> d_ff (hidden_act) -> d      cross-attention
                                                 feed-forward: d -> d_ff Swish, Norm, -> d
```

Narrower branches are zero-padded to the wider one before they are summed (tensor2tensor). A separable
convolution is a depthwise convolution (one kernel per channel) followed by a pointwise projection; padding
positions are zeroed before each convolution, as tensor2tensor masks them. The wide attention has twice
`num_attention_heads` heads of `head_dim` (Mesh TensorFlow's `DecoderAttentionLayer`, which Narang et al.
2021 ran; a shared score bias is repeated for its second half of heads). In the decoder-only model the
decoder cell has no cross-attention (tensor2tensor without `encoder_output`).

KV cache: a decoder cell owns three self-attention cache layers (`mixer_idx`, `+ 1`, `+ 2`): the wide
attention's keys and values, the conv branches' inputs (with their padding indicator), the self-attention's;
its two cross-attentions use cross-attention cache layers `mixer_idx` and `mixer_idx + 2`.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from transformers import initialization as init
from transformers.cache_utils import Cache, EncoderDecoderCache
from transformers.modeling_layers import GradientCheckpointingLayer

from .attention import HfzooAttention
from .convolutions import depthwise_convolution, update_cached_window
from .feed_forward import FeedForward
from .norms import build_norm
from .positions import repeat_score_bias_heads

#: The widths of the decoder cell's causal convolutions: its output at t reads inputs t - 16 ... t.
DECODER_RECEPTIVE_FIELD = (11 - 1) + (7 - 1)


class SeparableConvolution(nn.Module):
    """A depthwise-separable 1-D convolution (Chollet 2017): a per-channel kernel, then a pointwise projection.

    `pointwise(depthwise(x))`: `kernel` is `(in_channels, kernel_size)`, initialised normal(0, kernel_size ** -0.5)
    (variance-preserving, as Mesh TensorFlow's separable convolutions), `pointwise` an `nn.Linear`.

    Args:
        in_channels: input width.
        out_channels: output width.
        kernel_size: kernel width (tokens).
        bias: a bias in the pointwise projection.

    Shapes:
        `padded` `(batch_size, seq_len + kernel_size - 1, in_channels)` -> `(batch_size, seq_len, out_channels)`.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, bias: bool) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.kernel = nn.Parameter(torch.empty(in_channels, kernel_size))
        self.pointwise = nn.Linear(in_channels, out_channels, bias=bias)

    def init_parameters(self, initializer_range: float) -> None:
        """Draw `kernel` from normal(0, kernel_size ** -0.5) (called by the models' `_init_weights`)."""
        init.normal_(self.kernel, mean=0.0, std=self.kernel_size**-0.5)

    def forward(self, padded: torch.Tensor) -> torch.Tensor:
        """Convolve the zero-padded input ("valid" positions) and project it."""
        return self.pointwise(depthwise_convolution(padded, self.kernel))


def _zero_padding(states: torch.Tensor, nonpadding: torch.Tensor | None) -> torch.Tensor:
    """`states` `(batch, len, width)` with the padding positions (`nonpadding` `(batch, len, 1)` == 0) zeroed."""
    return states if nonpadding is None else states * nonpadding.to(states.dtype)


def _pad_time(states: torch.Tensor, left: int, right: int = 0) -> torch.Tensor:
    """Zero-pad `(batch, len, width)` along the sequence."""
    return F.pad(states, (0, 0, left, right))


def _pad_width(states: torch.Tensor, width: int) -> torch.Tensor:
    """Zero-pad the last dimension to `width` (tensor2tensor's sum of branches of different widths)."""
    return F.pad(states, (0, width - states.shape[-1]))


class ConfigView:
    """A read-through view of a config with some fields replaced (the wide attention's heads, a wider norm).

    Every other attribute is read from the live config, so a later `set_attn_implementation` reaches an
    attention built with a view (a copy of the config would keep the old backend).

    Args:
        config: the model's config.
        **overrides: the fields this view replaces, e.g. `num_attention_heads=24`.
    """

    def __init__(self, config, **overrides) -> None:
        self._config = config
        self.__dict__.update(overrides)

    def __getattr__(self, name: str):
        if name == "_config" or name.startswith("__"):  # not set yet (copy, unpickling); no dunder forwarding
            raise AttributeError(name)
        return getattr(self._config, name)


def _norm(config, size: int) -> nn.Module:
    """`config.norm_type`'s normalization over `size` features (`hfzoo.modules.norms.build_norm`)."""
    return build_norm(ConfigView(config, hidden_size=size))


class EvolvedTransformerLayer(GradientCheckpointingLayer):
    """One Evolved Transformer cell (So et al. 2019, Fig. 3): the encoder cell, or the decoder cell when causal.

    Modules (encoder cell): `glu_norm`, `glu_value`, `glu_gate`; `conv_norm`, `conv_left` (d -> 4d),
    `conv_right` (3x1, d -> d/2), `conv_mid_norm` (over 4d), `conv_out` (separable 9x1, 4d -> d/2);
    `self_attn_norm`, `self_attn`; `mlp_norm`, `mlp` (a `FeedForward`: `intermediate_size`, `hidden_act`).
    Decoder cell: `wide_attn_norm`, `wide_attn` (2 x `num_attention_heads`) and `wide_cross_attn`;
    `conv_norm`, `conv_left` (separable 11x1, d -> 2d), `conv_right` (separable 7x1, d -> d/2),
    `conv_mid_norm` (over 2d), `conv_out` (separable 7x1, 2d -> d); `self_attn_norm`, `self_attn`;
    `cross_attn_norm`, `cross_attn`; `mlp_norm`, `mlp_up` (d -> d_ff, Swish), `mlp_mid_norm`, `mlp_down`.
    The cells' own projections and convolutions carry biases when `config.mlp_bias`; the attentions follow
    `attention_bias`. Norms are `config.norm_type`'s; `hidden_dropout_prob` drops every branch output.

    Args:
        config: an hfzoo config (validated: `check_config`).
        layer_idx: index of the cell in its stack.
        is_causal: the decoder cell (causal), or the encoder cell.
        has_cross_attention: the decoder cell attends to the encoder (encoder-decoder).
        sublayers: unused (the cell fixes its blocks; `sublayer_pattern` is refused).
        token_mixer: unused (the cell's attentions are self-attention).
        mixer_idx: its first KV-cache layer (see the module docstring); default `layer_idx`.
        ffn_idx: unused (experts are refused).

    Shapes:
        `hidden_states` `(batch_size, seq_len, hidden_size)` -> same shape.
    """

    def __init__(
        self,
        config,
        layer_idx: int,
        is_causal: bool,
        has_cross_attention: bool = False,
        sublayers: str = "sf",
        token_mixer: str | None = None,
        mixer_idx: int | None = None,
        ffn_idx: int | None = None,
    ) -> None:
        super().__init__()
        hidden, bias = config.hidden_size, config.mlp_bias
        cache_idx = layer_idx if mixer_idx is None else mixer_idx
        self.is_causal = is_causal
        self.has_cross_attention = has_cross_attention
        self.conv_cache_idx = cache_idx + 1
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.wide_attn = self.wide_cross_attn = self.cross_attn = self.glu_value = None
        if is_causal:
            wide = ConfigView(  # twice the heads, keys and values included (no grouped-query attention here)
                config, num_attention_heads=2 * config.num_attention_heads, num_key_value_heads=None
            )
            self.wide_attn_norm = build_norm(config)
            self.wide_attn = HfzooAttention(wide, cache_idx, is_causal=True)
            if has_cross_attention:
                self.wide_cross_attn = HfzooAttention(config, cache_idx, is_causal=False, is_cross_attention=True)
            self.conv_left = SeparableConvolution(hidden, 2 * hidden, 11, bias)
            self.conv_right = SeparableConvolution(hidden, hidden // 2, 7, bias)
            self.conv_mid_norm = _norm(config, 2 * hidden)
            self.conv_out = SeparableConvolution(2 * hidden, hidden, 7, bias)
        else:
            self.glu_norm = build_norm(config)
            self.glu_value = nn.Linear(hidden, hidden, bias=bias)
            self.glu_gate = nn.Linear(hidden, hidden, bias=bias)
            self.conv_left = nn.Linear(hidden, 4 * hidden, bias=bias)
            self.conv_right = nn.Conv1d(hidden, hidden // 2, 3, bias=bias)
            self.conv_mid_norm = _norm(config, 4 * hidden)
            self.conv_out = SeparableConvolution(4 * hidden, hidden // 2, 9, bias)
        self.conv_norm = build_norm(config)
        self.self_attn_norm = build_norm(config)
        self.self_attn = HfzooAttention(config, cache_idx + 2 if is_causal else cache_idx, is_causal=is_causal)
        if has_cross_attention:
            self.cross_attn_norm = build_norm(config)
            self.cross_attn = HfzooAttention(config, cache_idx + 2, is_causal=False, is_cross_attention=True)
        self.mlp_norm = build_norm(config)
        if is_causal:
            self.mlp_up = nn.Linear(hidden, config.intermediate_size, bias=bias)
            self.mlp_mid_norm = _norm(config, config.intermediate_size)
            self.mlp_down = nn.Linear(config.intermediate_size, hidden, bias=bias)
        else:
            self.mlp = FeedForward(config)

    @staticmethod
    def num_cache_layers(sublayers: str, is_causal: bool) -> int:
        """Self-attention cache layers of one cell: 3 in the decoder cell (module docstring), 1 in the encoder's."""
        return 3 if is_causal else 1

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        padding_mask: torch.Tensor | None = None,
        **kwargs,
    ) -> torch.Tensor:
        """Run the cell; arguments as `hfzoo.modules.layer.HfzooLayer.forward`.

        Args:
            hidden_states: `(batch_size, seq_len, hidden_size)`.
            attention_mask: backend-specific self-attention mask.
            cache: a transformers `Cache` (`EncoderDecoderCache` with cross-attention), updated in place.
            encoder_hidden_states: `(batch_size, src_len, hidden_size)` (cells with cross-attention).
            encoder_attention_mask: backend-specific cross-attention mask.
            padding_mask: `(batch_size, seq_len)` bool, False at padding, or None.
            **kwargs: position inputs of the attentions (`position_embeddings`, `position_bias`) and
                attention-backend options.

        Returns:
            `(batch_size, seq_len, hidden_size)`.
        """
        x = hidden_states
        nonpadding = None if padding_mask is None else padding_mask[..., None]

        def attend(attention, states, mask, **extra):
            return self.dropout(attention(states, attention_mask=mask, cache=cache, **extra)[0])

        cross = {"key_value_states": encoder_hidden_states}
        if self.is_causal:
            h = self.wide_attn_norm(x)
            wide_kwargs = {**kwargs, "position_bias": repeat_score_bias_heads(kwargs.get("position_bias"), 2)}
            x = x + attend(self.wide_attn, h, attention_mask, **wide_kwargs)
            if self.wide_cross_attn is not None:
                x = x + attend(self.wide_cross_attn, h, encoder_attention_mask, **cross, **kwargs)
            x = x + self.dropout(self._decoder_convolutions(self.conv_norm(x), nonpadding, cache))
        else:
            h = self.glu_norm(x)
            x = x + self.dropout(self.glu_value(h) * torch.sigmoid(self.glu_gate(h)))
            x = x + self.dropout(self._encoder_convolutions(self.conv_norm(x), nonpadding))
        x = x + attend(self.self_attn, self.self_attn_norm(x), attention_mask, padding_mask=padding_mask, **kwargs)
        if self.cross_attn is not None:
            x = x + attend(self.cross_attn, self.cross_attn_norm(x), encoder_attention_mask, **cross, **kwargs)
        h = self.mlp_norm(x)
        if self.is_causal:
            h = self.mlp_down(self.mlp_mid_norm(self.dropout(F.silu(self.mlp_up(h)))))
        else:
            h = self.mlp(h)
        return x + self.dropout(h)

    def _encoder_convolutions(self, h: torch.Tensor, nonpadding: torch.Tensor | None) -> torch.Tensor:
        """The encoder cell's conv branches (So et al. Fig. 3, left) on normalized `(batch, len, d)`."""
        hidden = h.shape[-1]
        h = _zero_padding(h, nonpadding)
        left = self.dropout(F.relu(self.conv_left(h)))  # (batch, len, 4d)
        right = self.conv_right(_pad_time(h, 1, 1).transpose(1, 2)).transpose(1, 2)  # 3x1, "same": (batch, len, d/2)
        h = left + _pad_width(self.dropout(F.relu(right)), 4 * hidden)
        h = _zero_padding(self.conv_mid_norm(h), nonpadding)
        return _pad_width(self.conv_out(_pad_time(h, 4, 4)), hidden)  # separable 9x1, "same"

    def _decoder_convolutions(
        self, h: torch.Tensor, nonpadding: torch.Tensor | None, cache: Cache | None
    ) -> torch.Tensor:
        """The decoder cell's causal conv branches (So et al. Fig. 3, right) on normalized `(batch, q_len, d)`.

        With a cache, the branch inputs and their padding indicator are appended to the cell's conv cache layer
        and the new outputs are computed from the last `q_len + DECODER_RECEPTIVE_FIELD` of them (zeros before the
        sequence's start; read by position, so a static cache gives the same, `update_cached_window`).
        """
        batch_size, q_len, hidden = h.shape
        if nonpadding is None:
            nonpadding = h.new_ones(batch_size, q_len, 1)
        nonpadding = nonpadding.to(h.dtype)
        h = _zero_padding(h, nonpadding)
        if isinstance(cache, EncoderDecoderCache):
            cache = cache.self_attention_cache
        if cache is not None:
            # zeros before the start of the sequence, as the convolutions' own padding (indicator 0)
            h, nonpadding = update_cached_window(
                cache, h[:, None], nonpadding[:, None], self.conv_cache_idx, DECODER_RECEPTIVE_FIELD
            )
        left = self.dropout(F.relu(self.conv_left(_pad_time(h, 10))))  # (batch, len, 2d)
        right = self.dropout(self.conv_right(_pad_time(h, 6)))  # (batch, len, d/2)
        h = _zero_padding(self.conv_mid_norm(left + _pad_width(right, 2 * hidden)), nonpadding)
        return self.conv_out(_pad_time(h, 6))[:, -q_len:]  # the new positions

    @staticmethod
    def check_config(config) -> None:
        """Refuse what the Evolved Transformer's fixed cells do not take (called when the config is built).

        Raises:
            ValueError: a `sublayer_pattern`, a token mixer other than self-attention, `norm_position` other than
                `pre`, `norm_type="none"`, ReZero, Fixup, experts, a gated feed-forward, block sharing, an odd
                `hidden_size` (the branches are d / 2 wide), a layer stack other than the standard one, residual
                gates or product key memories; each message names the field.
        """
        name = "layer_type='evolved_transformer'"
        refused = {
            "sublayer_pattern": (config.sublayer_pattern is not None, "its cells fix their own blocks"),
            "token_mixer": (config.token_mixer != "self_attention", "its cells use self-attention"),
            "decoder_token_mixer": (
                getattr(config, "decoder_token_mixer", None) not in (None, "self_attention"),
                "its cells use self-attention",
            ),
            "norm_position": (config.norm_position != "pre", "its cells are pre-norm"),
            "norm_type": (config.norm_type == "none", "its conv branches normalize their hidden states"),
            "rezero": (config.rezero, "its residual connections are plain"),
            "fixup_init": (config.fixup_init, "its residual connections are plain"),
            "num_experts": (config.num_experts > 0, "its feed-forward blocks are dense"),
            "gated_mlp": (config.gated_mlp, "its feed-forward blocks are ReLU (encoder) and Swish (decoder)"),
            "block_sharing": (config.block_sharing != "none", "each cell has its own parameters"),
            "hidden_size": (config.hidden_size % 2 == 1, "its conv branches are hidden_size / 2 wide"),
            "layer_stack": (config.layer_stack != "standard", "its cells are applied once each, in order"),
            "decoder_layer_stack": (
                getattr(config, "decoder_layer_stack", None) not in (None, "standard"),
                "its cells are applied once each, in order",
            ),
            "residual_gating": (config.residual_gating != "none", "its residual connections are plain"),
            "memory_layers": (config.memory_layers is not None, "its feed-forward blocks are dense"),
            "decoder_memory_layers": (
                getattr(config, "decoder_memory_layers", None) is not None,
                "its feed-forward blocks are dense",
            ),
        }
        for field, (bad, reason) in refused.items():
            if bad:
                raise ValueError(f"{field}={getattr(config, field)!r} is not supported with {name}: {reason}")

    @staticmethod
    def training_flops(config, is_causal: bool, has_cross_attention: bool) -> tuple[int, int, int, int]:
        """Training-FLOP terms of one cell for `hfzoo.models.flops` (weights: 6 FLOPs per token each).

        Returns:
            `(weights, self_pair_flops, cross_pair_flops, cross_key_value_weights)`: the matrix-product weights a
            token of this stack passes (depthwise convolutions are elementwise work, not counted), the FLOPs
            per (query, key) pair of its self-attentions and of its cross-attentions, and the cross-attentions'
            key / value weights that every encoder token passes.
        """
        hidden, d_ff = config.hidden_size, config.intermediate_size
        width = config.num_attention_heads * config.head_dim
        attention = 4 * hidden * width
        feed_forward = 2 * hidden * d_ff
        if not is_causal:
            glu = 2 * hidden * hidden
            branches = hidden * 4 * hidden + 3 * hidden * (hidden // 2) + 4 * hidden * (hidden // 2)
            return glu + branches + attention + feed_forward, 12 * width, 0, 0
        branches = hidden * 2 * hidden + hidden * (hidden // 2) + 2 * hidden * hidden
        weights = 2 * attention + branches + attention + feed_forward  # wide attention: 2 x the heads
        crossings = 2 if has_cross_attention else 0
        weights += crossings * 2 * hidden * width  # q and o of each cross-attention
        return weights, 12 * width * 3, 12 * width * crossings, crossings * 2 * hidden * width
