"""One Transformer layer: its sublayers (`config.sublayer_pattern`) and their residual wiring.

The wiring follows `config.norm_position`, `rezero` and `fixup_init`.

Each sub-block F (token mixer, cross-attention, feed-forward) is wrapped by a `Residual`:
```
pre      (default; GPT-2, T5, Narang et al.'s baseline):  x = x + Dropout(F(Norm(x)))
post     (original Transformer, BERT):                     x = Norm(x + Dropout(F(x)))
sandwich (Ding et al. 2021, CogView §2.4):                 x = x + Dropout(Norm'(F(Norm(x))))
deepnorm (Wang et al. 2022, DeepNet eq. 1):                x = Norm(alpha * x + Dropout(F(x)))
rezero   (Bachlechner et al. 2020, eq. 3):                 F(.) -> a * F(.), scalar a initialised to 0
fixup    (Zhang et al. 2019, §3; with norm_type "none"):   F(.) -> s * F(. + b_in) + b_out, s=1, b=0 at init
```
`norm_type="none"` makes Norm an identity (ReZero alone, Fixup). Each placement is a `Residual` subclass
registered in `NORM_POSITIONS` at the bottom of this file; it carries its wiring (`forward`), whether the
stack ends with a final norm, and its initialisation rule: DeepNorm and Fixup rescale the initialisation
of the residual branches (`Residual.mark_branch_init`, applied by the models' `_init_weights`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import nn
from transformers import initialization as init
from transformers.cache_utils import Cache
from transformers.modeling_layers import GradientCheckpointingLayer

from .attention import HfzooAttention
from .experts import SparseMoeFeedForward, is_moe_layer
from .feed_forward import FeedForward
from .memory import ProductKeyMemory
from .mixers import TOKEN_MIXERS, build_token_mixer
from .norms import build_norm
from .universal import GRUResidualGate


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
    """Fixup's L: the number of residual branches in the whole network.

    One per sublayer of every stack (2 per layer with the interleaved pattern) plus one per
    cross-attention (after each token mixer of a cross-attending stack).

    Args:
        config: an hfzoo config (its `stack_layouts()` and `sublayer_pattern`).

    Returns:
        L, a positive integer.
    """
    total = 0
    for layout in config.stack_layouts():
        pattern = "".join(layer_sublayers(config.sublayer_pattern, layout.num_layers))
        total += len(pattern) + (pattern.count("s") if layout.has_cross_attention else 0)
    return total


def residual_branch_projections(block: nn.Module) -> tuple[list[nn.Linear], list[nn.Linear]]:
    """The projections of a residual branch that DeepNorm and Fixup initialise differently.

    Every sublayer block (token mixer, feed-forward, mixture of experts) names them in its method
    `residual_branch_projections()`: the projections on the branch's value path (DeepNorm and Fixup
    rescale them) and the branch's last projections (DeepNorm rescales them, Fixup zeroes them).

    Args:
        block: the module a `Residual` wraps.

    Returns:
        `(value_path, outputs)`, two lists of `nn.Linear`.

    Raises:
        TypeError: `block` does not define `residual_branch_projections`.
    """
    declare = getattr(block, "residual_branch_projections", None)
    if declare is None:
        raise TypeError(
            f"{type(block).__name__} does not define residual_branch_projections(), so DeepNorm / Fixup "
            "cannot rescale its initialisation; define it (see hfzoo.modules.layer.residual_branch_projections)"
        )
    return declare()


class Residual(nn.Module):
    """The residual connection around one sub-block F; subclasses are the norm placements of `NORM_POSITIONS`.

    The sub-block's normalization is owned by the layer (`self_attn_norm`, ...) and passed in, so the
    parameter names of pre-/post-LN checkpoints do not change. This base holds what every placement
    shares: the ReZero scalar `rezero_alpha` (`config.rezero`) and Fixup's scalar biases and multiplier
    `fixup_bias_in` / `fixup_scale` / `fixup_bias_out` (`config.fixup_init`, Zhang et al. 2019 Fig. 1),
    applied to the branch by `branch`. A placement subclass says where the norm goes (`forward`) and
    declares, as class attributes read by the stack and the config validation:

    - `final_norm`: the stack ends with a norm (pre-norm placements leave the residual stream unnormalised);
    - `needs_norm`: the placement is undefined with `norm_type="none"`;
    - `rescales_residual`: the placement scales the residual stream itself, so ReZero cannot be added;
    - `normalizes_input`: the sublayer sees the normalised stream (pre-norm placements), so states handed to
      it from elsewhere (the funnel's unpooled keys and values) are normalised the same way.

    With `config.residual_gating` (a `RESIDUAL_GATES` entry other than "none"), the sublayer's output passes
    through the gate `gate(inputs, output)` before the scalars (Mesh TensorFlow's gated Universal Transformer).

    Each placement also owns its initialisation rule (`branch_init_scales`, applied to the wrapped block
    by `mark_branch_init`).

    Args:
        config: an hfzoo config.
        is_decoder_side: the layer is in the decoder of an encoder-decoder (for DeepNorm's constants).

    Shapes:
        `hidden_states` `(batch_size, seq_len, hidden_size)` -> same shape.
    """

    final_norm: bool = True
    needs_norm: bool = False
    rescales_residual: bool = False
    normalizes_input: bool = False

    def __init__(self, config, is_decoder_side: bool = False) -> None:
        super().__init__()
        gate = RESIDUAL_GATES[config.residual_gating]
        self.gate = gate(config) if gate is not None else None
        self.rezero_alpha = nn.Parameter(torch.zeros(1)) if config.rezero else None
        if config.fixup_init:
            self.fixup_bias_in = nn.Parameter(torch.zeros(1))
            self.fixup_scale = nn.Parameter(torch.ones(1))
            self.fixup_bias_out = nn.Parameter(torch.zeros(1))
            self.fixup_num_branches = num_residual_branches(config)
        else:
            self.fixup_bias_in = self.fixup_scale = self.fixup_bias_out = self.fixup_num_branches = None

    def branch(self, inputs: torch.Tensor, sublayer: Callable, dropout: nn.Module) -> torch.Tensor:
        """`Dropout(alpha * (s * G(F(inputs + b_in)) + b_out))`: the residual branch with its scalars.

        `G` is `post_sublayer` (the identity, or sandwich's second norm); each scalar is present only
        when its scheme is configured (ReZero's `alpha`, Fixup's `s`, `b_in`, `b_out`).

        Args:
            inputs: `(batch_size, seq_len, hidden_size)`, the branch input (normalised or not).
            sublayer: maps `(batch_size, seq_len, hidden_size)` to the same shape.
            dropout: residual dropout.

        Returns:
            `(batch_size, seq_len, hidden_size)`.
        """
        if self.fixup_bias_in is not None:
            inputs = inputs + self.fixup_bias_in
        branch = self.post_sublayer(sublayer(inputs))
        if self.gate is not None:
            branch = self.gate(inputs, branch)
        if self.fixup_scale is not None:
            branch = branch * self.fixup_scale + self.fixup_bias_out
        if self.rezero_alpha is not None:
            branch = branch * self.rezero_alpha
        return dropout(branch)

    def post_sublayer(self, branch: torch.Tensor) -> torch.Tensor:
        """What a placement applies to the sublayer's output before the scalars (the identity here)."""
        return branch

    def forward(
        self, hidden_states: torch.Tensor, norm: nn.Module, sublayer: Callable, dropout: nn.Module
    ) -> torch.Tensor:
        """Apply `sublayer` with its residual connection (implemented by each placement).

        Args:
            hidden_states: `(batch_size, seq_len, hidden_size)`.
            norm: the sub-block's normalization (an identity with `norm_type="none"`).
            sublayer: maps `(batch_size, seq_len, hidden_size)` to the same shape.
            dropout: residual dropout.

        Returns:
            `(batch_size, seq_len, hidden_size)`.
        """
        raise NotImplementedError(f"{type(self).__name__} is not a norm placement; use a NORM_POSITIONS entry")

    def branch_init_scales(self) -> tuple[float, float] | None:
        """Initialisation scales `(value_path, output)` of the wrapped block's projections, or None (default init).

        The base rule is Fixup's (Zhang et al. 2019, §3, rules 2-3), when `fixup_init`: the branch's last
        projection is zero and the other projections on its value path are scaled by `L^(-1/(2m-2))`,
        with `m = 2` layers per branch and `L = num_residual_branches(config)`.
        """
        if self.fixup_num_branches is None:
            return None
        return self.fixup_num_branches ** (-1 / (2 * 2 - 2)), 0.0

    def mark_branch_init(self, block: nn.Module) -> None:
        """Tag the wrapped block's projections with the scale `branch_init_scales` gives them (no-op when None).

        Sets `residual_init_scale` on the `nn.Linear`s of `residual_branch_projections(block)`: the
        models' `_init_weights` then draws their weight from normal(0, `initializer_range * scale`), zero
        when the scale is 0, through transformers' `initialization` functions (which skip tensors that
        `from_pretrained` loaded). Tagging the projections themselves is needed because transformers
        initialises only modules that own tensors. Query and key projections are never tagged.

        Args:
            block: the module this residual wraps (attention, feed-forward, experts, a token mixer).

        Raises:
            TypeError: a rule applies and `block` does not declare its projections.
        """
        scales = self.branch_init_scales()
        if scales is None:
            return
        for projections, scale in zip(residual_branch_projections(block), scales, strict=True):
            for proj in projections:
                proj.residual_init_scale = scale

    def init_scalars(self) -> None:
        """Initialise the scalars (ReZero's at 0, Fixup's multiplier at 1 and biases at 0); called by `_init_weights`.

        Writes go through `transformers.initialization`, which skips tensors `from_pretrained` loaded.
        """
        if self.rezero_alpha is not None:
            init.zeros_(self.rezero_alpha)
        if self.fixup_scale is not None:
            init.zeros_(self.fixup_bias_in)
            init.ones_(self.fixup_scale)
            init.zeros_(self.fixup_bias_out)


class PreNormResidual(Residual):
    """Pre-LN (Xiong et al. 2020; GPT-2, T5): `x + Dropout(F(Norm(x)))`, and a final norm at the end of the stack."""

    normalizes_input = True

    def forward(
        self, hidden_states: torch.Tensor, norm: nn.Module, sublayer: Callable, dropout: nn.Module
    ) -> torch.Tensor:
        """`hidden_states + branch(norm(hidden_states))`; shapes and arguments as `Residual.forward`."""
        return hidden_states + self.branch(norm(hidden_states), sublayer, dropout)


class PostNormResidual(Residual):
    """Post-LN (Vaswani et al. 2017 §5.4; BERT): `Norm(x + Dropout(F(x)))`; no final norm (layers end normalised)."""

    final_norm = False

    def forward(
        self, hidden_states: torch.Tensor, norm: nn.Module, sublayer: Callable, dropout: nn.Module
    ) -> torch.Tensor:
        """`norm(hidden_states + branch(hidden_states))`; shapes and arguments as `Residual.forward`."""
        return norm(hidden_states + self.branch(hidden_states, sublayer, dropout))


class SandwichNormResidual(PreNormResidual):
    """Sandwich-LN (Ding et al. 2021, CogView §2.4): `x + Dropout(Norm'(F(Norm(x))))`, plus a final norm.

    `post_norm` is the second norm Norm', on the sublayer's output (its own parameters).
    """

    needs_norm = True

    def __init__(self, config, is_decoder_side: bool = False) -> None:
        super().__init__(config, is_decoder_side)
        self.post_norm = build_norm(config)

    def post_sublayer(self, branch: torch.Tensor) -> torch.Tensor:
        """Normalise the sublayer's output `(batch_size, seq_len, hidden_size)` with `post_norm`."""
        return self.post_norm(branch)


class DeepNormResidual(PostNormResidual):
    """DeepNorm (Wang et al. 2022, "DeepNet", eq. 1): `Norm(alpha * x + Dropout(F(x)))`, no final norm.

    `deepnorm_alpha` and `deepnorm_beta` (plain floats, `deepnorm_constants`) depend on the depth and on
    the side of an encoder-decoder. Initialisation (Algorithm 1 / torchscale): the value and output
    projections of each branch (v_proj, o_proj, every feed-forward projection) are drawn with their
    standard deviation scaled by beta; q_proj and k_proj keep theirs.
    """

    needs_norm = True
    rescales_residual = True

    def __init__(self, config, is_decoder_side: bool = False) -> None:
        super().__init__(config, is_decoder_side)
        self.deepnorm_alpha, self.deepnorm_beta = deepnorm_constants(config, is_decoder_side)

    def forward(
        self, hidden_states: torch.Tensor, norm: nn.Module, sublayer: Callable, dropout: nn.Module
    ) -> torch.Tensor:
        """`norm(alpha * hidden_states + branch(hidden_states))`; shapes and arguments as `Residual.forward`."""
        return norm(hidden_states * self.deepnorm_alpha + self.branch(hidden_states, sublayer, dropout))

    def branch_init_scales(self) -> tuple[float, float]:
        """DeepNorm's rule: beta for the value path and the output projections."""
        return self.deepnorm_beta, self.deepnorm_beta

    def extra_repr(self) -> str:
        """Show alpha and beta in `print(model)`."""
        return f"alpha={self.deepnorm_alpha:.4g}, beta={self.deepnorm_beta:.4g}"


def build_residual(config, is_decoder_side: bool = False) -> Residual:
    """The residual wiring of `config.norm_position` (a `NORM_POSITIONS` entry) for one sub-block.

    Args:
        config: an hfzoo config (validated).
        is_decoder_side: the layer is in the decoder of an encoder-decoder (DeepNorm's constants).

    Returns:
        A `Residual` subclass instance.
    """
    return NORM_POSITIONS[config.norm_position](config, is_decoder_side)


class HfzooLayer(GradientCheckpointingLayer):
    """Token mixer, (cross-attention,) feed-forward, each wrapped in a residual connection with normalization.

    A layer holds the sublayers of its piece of `config.sublayer_pattern` (`layer_sublayers`): `"sf"` (the
    Transformer layer: token mixer then feed-forward), `"s"` or `"f"`. The token mixer `self_attn` is
    `config.token_mixer`'s (`hfzoo.modules.mixers.TOKEN_MIXERS`; self-attention by default), followed in
    a cross-attending layer by `cross_attn`; the feed-forward `mlp` is a `FeedForward`, or a
    `SparseMoeFeedForward` on the feed-forward sublayers selected by `config.num_experts` /
    `moe_layer_interval` (`hfzoo.modules.experts.is_moe_layer`). Each sub-block has its norm
    (`self_attn_norm`, `cross_attn_norm`, `mlp_norm`) and a `Residual` (`*_residual`, the
    `config.norm_position` entry of `NORM_POSITIONS`); absent sub-blocks are None. Subclassing
    `GradientCheckpointingLayer` makes `model.activation_checkpointing_enable()` (formerly
    `gradient_checkpointing_enable`) recompute this layer in the backward pass.

    Args:
        config: an hfzoo config.
        layer_idx: index of the layer in its stack.
        is_causal: causal token mixing (decoder) or bidirectional (encoder).
        has_cross_attention: add a cross-attention sub-block after the token mixer (the decoder of an
            encoder-decoder, Vaswani et al. 2017 §3.1).
        sublayers: `"sf"`, `"s"` or `"f"`.
        token_mixer: a key of `TOKEN_MIXERS` (default `config.token_mixer`); its entry's `cross_attention`
            class (default `HfzooAttention`) builds the cross-attention.
        mixer_idx: index of this layer's token mixer among its stack's (its KV-cache layer, also used by the
            cross-attention); default `layer_idx`.
        ffn_idx: index of this layer's feed-forward among its stack's (chooses the MoE ones); default `layer_idx`.
        feed_forward: the feed-forward block, a key of `FEED_FORWARD_BLOCKS` (`StackLayout.feed_forward_kinds`);
            None: `experts` on the layers `is_moe_layer` selects, else `dense`.

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
        feed_forward: str | None = None,
    ) -> None:
        super().__init__()
        mixer_idx = layer_idx if mixer_idx is None else mixer_idx
        ffn_idx = layer_idx if ffn_idx is None else ffn_idx
        token_mixer = token_mixer or config.token_mixer
        if feed_forward is None:
            feed_forward = "experts" if is_moe_layer(config, ffn_idx) else "dense"
        self.self_attn = self.self_attn_norm = self.self_attn_residual = None
        self.cross_attn = self.cross_attn_norm = self.cross_attn_residual = None
        self.mlp = self.mlp_norm = self.mlp_residual = None
        if "s" in sublayers:
            self.self_attn = build_token_mixer(config, token_mixer, mixer_idx, is_causal)
            self.self_attn_norm = build_norm(config)
            self.self_attn_residual = build_residual(config, has_cross_attention)
            self.self_attn_residual.mark_branch_init(self.self_attn)
            if has_cross_attention:
                cross_attention = TOKEN_MIXERS[token_mixer].cross_attention or HfzooAttention
                self.cross_attn = cross_attention(config, mixer_idx, is_causal=False, is_cross_attention=True)
                self.cross_attn_norm = build_norm(config)
                self.cross_attn_residual = build_residual(config, has_cross_attention)
                self.cross_attn_residual.mark_branch_init(self.cross_attn)
        if "f" in sublayers:
            self.mlp = FEED_FORWARD_BLOCKS[feed_forward](config)
            self.mlp_norm = build_norm(config)
            self.mlp_residual = build_residual(config, has_cross_attention)
            self.mlp_residual.mark_branch_init(self.mlp)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    @staticmethod
    def num_cache_layers(sublayers: str, is_causal: bool) -> int:
        """KV-cache layers of one layer: 1 with a token mixer (`"s"` in `sublayers`), else 0."""
        return int("s" in sublayers)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        padding_mask: torch.Tensor | None = None,
        key_value_states: torch.Tensor | None = None,
        **kwargs,
    ) -> torch.Tensor:
        """Run the layer.

        Args:
            hidden_states: `(batch_size, seq_len, hidden_size)`.
            attention_mask: backend-specific self-attention mask (see `HfzooAttention`).
            cache: a transformers `Cache` (`EncoderDecoderCache` with cross-attention), updated in place.
            encoder_hidden_states: `(batch_size, src_len, hidden_size)` (layers with cross-attention).
            encoder_attention_mask: backend-specific cross-attention mask over the encoder outputs.
            padding_mask: `(batch_size, seq_len)` bool, False for padding, or None; read by the token mixer
                and by the feed-forward blocks that take it (`uses_padding_mask`: a mixture of experts never
                routes padding nor counts it against capacity; the memory's batch norm leaves it out).
            key_value_states: `(batch_size, kv_len, hidden_size)`, the unpooled states the token mixer's keys
                and values come from when `hidden_states` are their pooled copy (the funnel's first layer of a
                block, Dai et al. 2020 §2.2), normalised as the mixer's input is (`Residual.normalizes_input`);
                else None.
            **kwargs: position inputs of the token mixer (`position_embeddings`, `position_bias`) and
                attention-backend options.

        Returns:
            `(batch_size, seq_len, hidden_size)`.
        """
        if self.self_attn is not None:
            mixer_kwargs = {}
            if key_value_states is not None:
                if self.self_attn_residual.normalizes_input:
                    key_value_states = self.self_attn_norm(key_value_states)
                mixer_kwargs["key_value_states"] = key_value_states

            def mix(x: torch.Tensor) -> torch.Tensor:
                return self.self_attn(
                    x,
                    attention_mask=attention_mask,
                    cache=cache,
                    padding_mask=padding_mask,
                    **mixer_kwargs,
                    **kwargs,
                )[0]

            hidden_states = self.self_attn_residual(hidden_states, self.self_attn_norm, mix, self.dropout)
        if self.cross_attn is not None:

            def cross_attend(x: torch.Tensor) -> torch.Tensor:
                return self.cross_attn(
                    x,
                    attention_mask=encoder_attention_mask,
                    cache=cache,
                    key_value_states=encoder_hidden_states,
                    **kwargs,
                )[0]

            hidden_states = self.cross_attn_residual(hidden_states, self.cross_attn_norm, cross_attend, self.dropout)
        if self.mlp is not None:
            mlp = self.mlp
            if getattr(mlp, "uses_padding_mask", False):
                mlp = partial(mlp, padding_mask=padding_mask)
            hidden_states = self.mlp_residual(hidden_states, self.mlp_norm, mlp, self.dropout)
        return hidden_states


def layer_sublayers(pattern: str | None, num_layers: int) -> list[str]:
    """Split a sublayer pattern into the layers of a stack (Press et al. 2020, "Reordering their Sublayers").

    `s` is a token-mixer sublayer (self-attention unless `config.token_mixer` says otherwise), `f` a
    feed-forward sublayer; a stack of N layers has 2N sublayers. The pattern is read left to right and
    each `sf` becomes one layer (so the interleaved default `sfsf...` gives exactly today's N layers,
    module names and checkpoint keys); any other letter is a layer of its own (`s` or `f`). The
    sandwich `sssfsfff` (N=4, k=2) gives layers `s, s, sf, sf, f, f`.

    Args:
        pattern: a string over `SUBLAYERS` (validated by the config), or None for `"sf" * num_layers`.
        num_layers: the stack's N.

    Returns:
        One string per layer: `"sf"`, `"s"` or `"f"`.
    """
    if pattern is None:
        return ["sf"] * num_layers
    layers, i = [], 0
    while i < len(pattern):
        piece = "sf" if pattern.startswith("sf", i) else pattern[i]
        layers.append(piece)
        i += len(piece)
    return layers


def sandwich_pattern(num_layers: int, coefficient: int) -> str:
    """The sandwich Transformer's sublayer pattern `s^k (sf)^(n-k) f^k` (Press et al. 2020), 2n letters.

    Args:
        num_layers: n, the number of layers (2n sublayers).
        coefficient: k, the sandwich coefficient, `0 <= k <= n` (0 is the interleaved Transformer).

    Returns:
        e.g. `sandwich_pattern(4, 2) == "sssfsfff"`, for `config.sublayer_pattern`.

    Raises:
        ValueError: `coefficient` outside `[0, num_layers]`.
    """
    if not 0 <= coefficient <= num_layers:
        raise ValueError(f"sandwich coefficient k={coefficient} must be in [0, num_layers={num_layers}]")
    return "s" * coefficient + "sf" * (num_layers - coefficient) + "f" * coefficient


# Placements of the norms around each sub-block: each entry is a `Residual` subclass that wires the
# residual connection, says whether the stack ends with a final norm, and owns its initialisation rule.
NORM_POSITIONS = {
    "pre": PreNormResidual,  # Xiong et al. 2020 ("pre-LN"); GPT-2, T5
    "post": PostNormResidual,  # Vaswani et al. 2017 §5.4; BERT
    "sandwich": SandwichNormResidual,  # Ding et al. 2021 (CogView) §2.4
    "deepnorm": DeepNormResidual,  # Wang et al. 2022 (DeepNet) eq. 1
}

# Gates of each residual branch's output, selected by `config.residual_gating` (None: no gate).
RESIDUAL_GATES = {
    "none": None,
    "gru": GRUResidualGate,  # Mesh TensorFlow's gated Universal Transformer (Narang et al. 2021)
}

# Feed-forward blocks of the `f` sublayers (which one a sublayer gets: `StackLayout.feed_forward_kinds` in stack.py).
FEED_FORWARD_BLOCKS = {
    "dense": FeedForward,  # Vaswani et al. 2017 §3.3 (gated: Shazeer 2020)
    "experts": SparseMoeFeedForward,  # Shazeer et al. 2017; Fedus et al. 2021 (config.num_experts)
    "product_key_memory": ProductKeyMemory,  # Lample et al. 2019 (config.memory_layers)
}

# The letters of `config.sublayer_pattern` (Press et al. 2020): the sublayer kinds a layer is built from.
SUBLAYERS = {
    "s": "token mixer (config.token_mixer: self-attention by default; + cross-attention in a cross-attending stack)",
    "f": "feed-forward (FeedForward, or SparseMoeFeedForward with experts)",
}
