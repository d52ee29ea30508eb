"""Token mixers: the sublayer that mixes information across positions, selected by `config.token_mixer`.

Self-attention is the Transformer's token mixer; what replaces it (synthesizers, convolutions, Fourier
mixing, low-rank or sparse attention) plugs in here, the way feed-forward variants plug into
`FeedForward`: one class + one `TOKEN_MIXERS` entry (a `TokenMixer` record, at the bottom of this file)
saying where the mixer is defined. The config validation (`HfzooConfig`), the stack and the attention
backend check read that record; no other file names a mixer.

The contract of a mixer class (`HfzooAttention` is the reference):

- `__init__(config, layer_idx, is_causal)`: `layer_idx` is the mixer's index among its stack's mixer
  sublayers (the KV-cache layer it owns); `is_causal` is the stack's direction. Parameters are created
  here only (no lazy creation) and initialised by `HfzooPreTrainedModel._init_weights` (use `nn.Linear`,
  `nn.Embedding`, ... or extend `_init_weights`).
- `forward(hidden_states, attention_mask=None, cache=None, padding_mask=None,
  position_embeddings=None, position_bias=None, **kwargs) -> (output, weights)`: `hidden_states` and
  `output` are `(batch_size, seq_len, hidden_size)`; `attention_mask` is the backend-specific mask from
  `transformers.masking_utils` (causal in a causal stack); `padding_mask` is `(batch_size, seq_len)` bool,
  False at padding (None: no padding); `cache` a transformers `Cache` (mixers with
  `kv_cache=True` store their state at `layer_idx`); `position_embeddings` / `position_bias` are the
  stack's rotary angles / shared score bias (`hfzoo.modules.positions`); `weights` are the mixing
  weights `(batch_size, num_heads, q_len, kv_len)` or None. The output at a padding position may be
  anything, but no real position may depend on padding, and in a causal stack no position may depend on
  a later one (the variant matrix checks both).
- `residual_branch_projections() -> (value_path, outputs)`: the `nn.Linear`s that DeepNorm and Fixup
  initialise (`hfzoo.modules.layer.residual_branch_projections`).
- a mixer that computes attention scores through `HfzooAttention.attend` gets QK-norm and attention
  soft-capping from it; its entry says so in `score_options` (the config refuses them for the others).
- static methods `mixer_weights(config) -> int` (matrix-product weights one token passes through in one
  mixer sublayer) and `attention_pairs(config, seq_len) -> int` ((query, key) pairs of scores over a
  sequence of `seq_len` tokens): the mixer's compute, read by `hfzoo.models.flops`; a mixer without them
  is counted as self-attention. A parameter-free transform adds `transform_flops(config, seq_len) -> float`
  (its forward FLOPs over a sequence; FNet's FFTs).

The module is the layer's `self_attn` whatever the mixer (one checkpoint layout, PEFT's usual names).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from .attention import HfzooAttention
from .convolutions import CONVOLUTION_FIELDS, DynamicConvolution, LightweightConvolution, check_convolution_config
from .fourier import FourierMixer
from .linformer import LinformerAttention, check_linformer_config
from .sparse_attention import (
    BigBirdAttention,
    SlidingWindowAttention,
    check_attention_window,
    check_bigbird_config,
    window_overlay,
)
from .synthesizer import SYNTHESIZER_FIELDS, Synthesizer, check_synthesizer_config
from .weighted import BranchedAttention


@dataclass(frozen=True)
class TokenMixer:
    """A `TOKEN_MIXERS` entry: a token-mixer class and where it is defined.

    Args:
        module: the class, built as `module(config, layer_idx, is_causal)` (contract in the module docstring).
        causal: the mixer can run in a causal stack (decoder; decoder side of the encoder-decoder) without
            any position seeing a later one.
        bidirectional: the mixer can run in a bidirectional stack (encoder; encoder side).
        kv_cache: the mixer supports incremental decoding with a KV cache (`use_cache=True`, `generate`
            with the cache); without it a causal stack must run with `use_cache=False`.
        families: the `model_type`s where the mixer is defined (its paper's setting), or None for every
            family whose stacks it can run in.
        attention_backends: the attention backends (`config._attn_implementation`) it supports, or None
            when it goes through transformers' attention interface like `HfzooAttention` (then the
            position scheme decides, `hfzoo.modules.positions.POSITION_ATTENTION_BACKENDS`).
        attention_positions: it applies the position schemes that act inside attention (rotary, score
            biases, Shaw); if False, the config refuses those schemes (they would be silent no-ops).
        config_fields: config fields only this mixer reads; the config refuses a non-default value of
            them when no stack uses the mixer.
        check_config: called with the config when it is built (after the common checks), to refuse bad
            values of the mixer's own fields with a `ValueError` naming the field; or None.
        reason: why the mixer is undefined in the stacks or families it refuses (e.g. "it mixes every
            position into every other, so a token would see later ones"); the config's refusal ends with it.
        mask_overlay: for attention with a pattern of its own (a local window): called with the config, it
            returns a transformers mask function `(batch_idx, head_idx, q_idx, kv_idx) -> bool` (True = may
            attend; indices are positions in the sequence, cache included) that the stack intersects with
            its causal or bidirectional self-attention mask (`and_mask_function` of
            `transformers.masking_utils.create_causal_mask` / `create_bidirectional_mask`), so every backend
            that takes a mask applies it; or None.
        feed_forward: the mixer contains its layer's feed-forward (the Weighted Transformer's branches): the
            layers of a stack using it have no feed-forward sublayer (`StackLayout.sublayers`), and
            `sublayer_pattern` must be None.
        cross_attention: the class of the cross-attention that follows the mixer in a cross-attending stack,
            built as `cross_attention(config, layer_idx, is_causal=False, is_cross_attention=True)`; None:
            `HfzooAttention`.
        values: the mixer projects values per head through `HfzooAttention.attend`'s self-attention path,
            which mixes in the stack's first values when given `value_residual` (`config.value_residual`, ResFormer,
            `hfzoo.modules.connections.ValueResidual`); False: value residual learning is refused with it.
        score_options: the config fields acting on queries, keys and attention scores that the mixer applies
            (`SCORE_OPTIONS`: `qk_norm`, QK-norm; `attn_logit_softcapping`, Gemma 2's score cap), as
            `HfzooAttention.attend` does; the config refuses the others at a non-default value in a stack using
            the mixer (a mixer without queries and keys has none).
        grouped_kv_heads: the mixer supports grouped-query attention (`config.num_key_value_heads` below
            `num_attention_heads`: fewer key/value heads, each shared by a group of query heads), as
            `HfzooAttention` does; False: the config refuses `num_key_value_heads != num_attention_heads` with it.
    """

    module: type[nn.Module]
    causal: bool = True
    bidirectional: bool = True
    kv_cache: bool = True
    families: tuple[str, ...] | None = None
    attention_backends: tuple[str, ...] | None = None
    attention_positions: bool = True
    config_fields: tuple[str, ...] = ()
    check_config: Callable[[Any], None] | None = None
    reason: str = ""
    mask_overlay: Callable[[Any], Callable] | None = None
    feed_forward: bool = False
    cross_attention: type[nn.Module] | None = None
    values: bool = False
    score_options: tuple[str, ...] = ()
    grouped_kv_heads: bool = False

    def runs_in(self, model_type: str, is_causal: bool) -> bool:
        """Whether the mixer is defined in a stack of direction `is_causal` of the family `model_type`."""
        direction = self.causal if is_causal else self.bidirectional
        return direction and (self.families is None or model_type in self.families)


def build_token_mixer(config, name: str, layer_idx: int, is_causal: bool) -> nn.Module:
    """Build the token mixer `name` (a key of `TOKEN_MIXERS`) for one layer.

    Args:
        config: an hfzoo config (validated, so the mixer is defined where it is built).
        name: the stack's mixer (`config.token_mixer`, or the encoder-decoder's `decoder_token_mixer`).
        layer_idx: the mixer's index among its stack's mixer sublayers (its KV-cache layer).
        is_causal: the stack is causal.

    Returns:
        The mixer module.
    """
    return TOKEN_MIXERS[name].module(config, layer_idx, is_causal=is_causal)


#: The config fields that act on queries, keys and scores (`TokenMixer.score_options`) and their defaults (off).
SCORE_OPTIONS = {"qk_norm": None, "attn_logit_softcapping": None}
_ATTEND = tuple(SCORE_OPTIONS)  # mixers whose scores come from `HfzooAttention.attend`

# Token mixers, selected by `config.token_mixer` (and the encoder-decoder's `decoder_token_mixer`).
TOKEN_MIXERS = {
    "self_attention": TokenMixer(  # Vaswani et al. 2017 §3.2; grouped-query attention, Ainslie et al. 2023
        HfzooAttention, values=True, score_options=_ATTEND, grouped_kv_heads=True
    ),
    "fourier": TokenMixer(  # FNet, Lee-Thorp et al. 2022
        FourierMixer,
        causal=False,
        kv_cache=False,
        attention_positions=False,
        reason="the Fourier transform over the sequence mixes every position into every other, so a token "
        "would see later ones",
    ),
    "linformer": TokenMixer(  # Wang et al. 2020
        LinformerAttention,
        causal=False,
        kv_cache=False,
        attention_positions=False,
        config_fields=("linformer_k", "linformer_sharing"),
        check_config=check_linformer_config,
        reason="the projections along the sequence mix every position's key and value into every projected one, "
        "so a token would see later ones",
    ),
    "sliding_window": TokenMixer(  # Beltagy et al. 2020 (Longformer) §3.1
        SlidingWindowAttention,
        config_fields=("attention_window",),
        check_config=check_attention_window,
        mask_overlay=window_overlay,
        values=True,
        score_options=_ATTEND,
        grouped_kv_heads=True,
    ),
    "bigbird": TokenMixer(  # Zaheer et al. 2020 (ITC)
        BigBirdAttention,
        causal=False,
        kv_cache=False,
        attention_backends=("eager", "sdpa"),  # a dense pattern mask: no flash / flex
        config_fields=("bigbird_block_size", "bigbird_num_random_blocks", "bigbird_num_global_blocks"),
        check_config=check_bigbird_config,
        reason="its global and random blocks lie anywhere in the sequence, so a token would see later ones",
        values=True,
        score_options=_ATTEND,
    ),
    # Wu et al. 2019 §3 / §4 (hfzoo/modules/convolutions.py); KV cache = the layer's past convolution inputs
    "lightweight_convolution": TokenMixer(
        LightweightConvolution,
        attention_positions=False,
        config_fields=CONVOLUTION_FIELDS,
        check_config=check_convolution_config,
    ),
    "dynamic_convolution": TokenMixer(
        DynamicConvolution,
        attention_positions=False,
        config_fields=CONVOLUTION_FIELDS,
        check_config=check_convolution_config,
    ),
    # Tay et al. 2020 (hfzoo/modules/synthesizer.py): dense / random / factorized random, alone or mixed with
    # dot products (synthesizer_type, synthesizer_mixing); score biases added to its logits, masks as attention's
    "synthesizer": TokenMixer(
        Synthesizer,
        attention_backends=("eager", "sdpa"),
        config_fields=SYNTHESIZER_FIELDS,
        check_config=check_synthesizer_config,
    ),
    # Weighted Transformer, Ahmed et al. 2017 §3: branches with their own feed-forward; cross-attention branched too
    "branched_attention": TokenMixer(
        BranchedAttention, feed_forward=True, cross_attention=BranchedAttention, values=True, score_options=_ATTEND
    ),
}
