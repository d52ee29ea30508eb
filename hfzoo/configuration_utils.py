"""The architecture fields shared by the three hfzoo configs, and their validation (in one place).

Every field is a plain JSON value (`config.json` stays readable) and is validated when the config is
built: a bad value raises an error naming the field, the value and what is allowed. Choices are the
keys of the registries in `hfzoo/modules/` (activations, norms, norm positions, routers, position
embeddings, token mixers), and what a choice supports is read from its registry entry. Each family's
config describes its stacks (`stack_layouts()`), which the validation and the models share.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import math
import sys
import types
import typing
from collections.abc import Iterable

from huggingface_hub.dataclasses import strict
from transformers import PreTrainedConfig

from .choices import choice_hint
from .compat import CACHE_NAME
from .modules.attention import key_value_heads
from .modules.embeddings import check_adaptive_config
from .modules.experts import ROUTERS
from .modules.feed_forward import ACTIVATIONS
from .modules.layer import FEED_FORWARD_BLOCKS, NORM_POSITIONS, RESIDUAL_GATES, SUBLAYERS
from .modules.mixers import SCORE_OPTIONS, TOKEN_MIXERS
from .modules.norms import NORM_CLASSES, check_qk_norm_config
from .modules.positions import (
    ATTENTION_POSITION_EMBEDDING_TYPES,
    POSITION_EMBEDDING_TYPES,
    POSITION_SCHEME_FIELDS,
    check_position_config,
    has_per_layer_score_bias,
)
from .modules.softcapping import check_softcapping_config
from .modules.stack import BLOCK_SHARING, LAYER_STACKS, LAYER_TYPES, StackLayout, check_layer_connections

#: How close (a `difflib` ratio) a keyword that is no field must be to a field's name to be refused as its misspelling.
MISSPELLING_CUTOFF = 0.84

#: Other models' names for hfzoo's fields (name -> (hfzoo's field, whose name it is)): a config given one would keep
#: it as an attribute that nothing reads and build the field's default (`num_layers=4`: a 6-layer model).
OTHER_MODELS_FIELD_NAMES = {
    "num_layers": ("num_hidden_layers", "T5's"),
    "n_layer": ("num_hidden_layers", "GPT-2's"),
    "d_model": ("hidden_size", "T5's"),
    "n_embd": ("hidden_size", "GPT-2's"),
    "num_heads": ("num_attention_heads", "T5's"),
    "n_head": ("num_attention_heads", "GPT-2's"),
    "d_ff": ("intermediate_size", "T5's"),
    "n_inner": ("intermediate_size", "GPT-2's"),
    "d_kv": ("head_dim", "T5's"),
    "n_positions": ("max_position_embeddings", "GPT-2's"),
    "n_ctx": ("max_position_embeddings", "GPT-2's"),
    "dropout_rate": ("hidden_dropout_prob", "T5's"),
    "resid_pdrop": ("hidden_dropout_prob", "GPT-2's"),
    "attn_pdrop": ("attention_probs_dropout_prob", "GPT-2's"),
    "activation_function": ("hidden_act", "GPT-2's"),
    "feed_forward_proj": ("hidden_act", "T5's"),
    "layer_norm_epsilon": ("layer_norm_eps", "T5's and GPT-2's"),
    "num_kv_heads": ("num_key_value_heads", "Falcon's"),
}


def other_models_name_hint(key: str, fields: Iterable[str]) -> str | None:
    """What to say of `key` when it is another model's name for one of `fields` (`OTHER_MODELS_FIELD_NAMES`).

    Returns:
        `"num_layers is T5's name for num_hidden_layers; give num_hidden_layers"`, or None for any other key.
    """
    if key not in OTHER_MODELS_FIELD_NAMES or OTHER_MODELS_FIELD_NAMES[key][0] not in fields:
        return None
    field, whose = OTHER_MODELS_FIELD_NAMES[key]
    gated = " (and gated_mlp=True for T5's gated-* values)" if key == "feed_forward_proj" else ""
    return f"{key} is {whose} name for {field}; give {field}{gated}"


def refuse_misspelled_fields(config_class: type, extra: dict[str, object]) -> None:
    """Refuse a config keyword that is no field of `config_class` but nearly the name of one.

    `PreTrainedConfig` keeps any keyword it has no field for as a plain attribute (saved with the config, read
    by nothing), as it must for keys other libraries add. A near-miss of a field's name (`num_hiden_layers`,
    `intermediat_size`, T5's `layer_norm_epsilon` for `layer_norm_eps`) would leave that field at its default
    with no sign: such a keyword is refused, and so is another model's name for a field
    (`OTHER_MODELS_FIELD_NAMES`: T5's `num_layers`, GPT-2's `n_embd`, ...). The config's `attribute_map` aliases
    (the encoder-decoder's `num_encoder_layers`) set their field, as in transformers. Other unknown keywords stay
    accepted.

    Args:
        config_class: the config class being built.
        extra: the keywords `PreTrainedConfig` passes to `__post_init__` (those of no dataclass field).

    Raises:
        ValueError: naming the keyword, its value, the config class and the field it is close to (a `difflib`
            ratio of at least `MISSPELLING_CUTOFF`) or whose name it is in another model.
    """
    fields = [field.name for field in dataclasses.fields(config_class)]
    for key, value in extra.items():
        if hasattr(config_class, key):  # a property or class attribute of the config (`use_return_dict`)
            continue
        if key in config_class.attribute_map:  # the config's own alias of a field (set through it)
            continue
        hint = other_models_name_hint(key, fields)
        if hint:
            raise ValueError(
                f"{key}={value!r} is not a field of {config_class.__name__} (it would be kept but read by nothing): "
                f"{hint}"
            )
        close = difflib.get_close_matches(key, fields, n=1, cutoff=MISSPELLING_CUTOFF)
        if close:
            raise ValueError(
                f"{key}={value!r} is not a field of {config_class.__name__} (it would be kept but read by nothing); "
                f"did you mean {close[0]}?"
            )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@functools.cache
def _hfzoo_field_types(config_class: type) -> dict[str, object]:
    """`{field: annotation}` of the fields an hfzoo config class declares (transformers' base fields left out)."""
    hints = {}
    for klass in reversed(config_class.__mro__):  # the hfzoo classes' own annotations (strings: evaluated here)
        if not issubclass(klass, HfzooConfig):
            continue
        namespace = vars(sys.modules[klass.__module__])
        for name, annotation in vars(klass).get("__annotations__", {}).items():
            hints[name] = eval(annotation, namespace) if isinstance(annotation, str) else annotation  # noqa: S307
    own = {f.name for f in dataclasses.fields(config_class)} - {f.name for f in dataclasses.fields(PreTrainedConfig)}
    return {f.name: hints[f.name] for f in dataclasses.fields(config_class) if f.name in own and f.name in hints}


def _type_error(value: object, annotation: object) -> str | None:
    """What `value` should be for `annotation` (e.g. `"an integer"`), or None when it is one.

    Booleans are not integers or numbers here, numbers must be finite, and a `list[int]` may also be a tuple.
    """
    options = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else (annotation,)
    described = []
    for option in options:
        if option is type(None):
            if value is None:
                return None
            described.append("None")
        elif option is bool:
            if isinstance(value, bool):
                return None
            described.append("True or False")
        elif option is int:
            if _is_int(value):
                return None
            if float not in options:  # "a finite number" says it
                described.append("an integer")
        elif option is float:
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                return None
            described.append("a finite number")
        elif option is str:
            if isinstance(value, str):
                return None
            described.append("a string")
        elif typing.get_origin(option) is list:
            if isinstance(value, (list, tuple)) and all(_is_int(v) for v in value):
                return None
            described.append("a list of integers")
        else:  # an annotation this check does not know: the field's own validation decides
            return None
    return " or ".join(dict.fromkeys(described))


@strict
class HfzooConfig(PreTrainedConfig):
    r"""Architecture fields common to the hfzoo encoder, decoder and encoder-decoder.

    Args:
        vocab_size: number of token ids (rows of the embedding matrix).
        hidden_size: model width d_model.
        num_hidden_layers: number of Transformer layers.
        num_attention_heads: attention heads per layer.
        num_key_value_heads: key/value heads per attention layer, grouped-query attention (Ainslie et al. 2023,
            "GQA"): `k_proj` and `v_proj` project to this many heads, each shared by `num_attention_heads //
            num_key_value_heads` consecutive query heads (transformers' `repeat_kv` layout, as Llama), and the
            KV cache stores them only; 1 is multi-query attention (Shazeer 2019). A positive integer dividing
            `num_attention_heads`; None (the default) becomes `num_attention_heads` (multi-head attention) when the
            config is built, as in transformers' Llama (`hfzoo.models.presets.build_config` re-derives it when an
            override changes `num_attention_heads` of a multi-head config).
            Fewer key/value heads than query heads are refused with a token mixer or layer type that does not
            group them (`hfzoo.modules.mixers.TokenMixer.grouped_kv_heads`; `layer_type="transformer"` only).
        head_dim: size of each head (T5's d_kv); None means `hidden_size // num_attention_heads`.
        intermediate_size: feed-forward inner width d_ff.
        hidden_act: feed-forward activation, a key of `hfzoo.modules.feed_forward.ACTIVATIONS`
            (transformers' `ACT2FN` plus `elu`, `selu`, `softplus`): e.g. relu, gelu, gelu_new, silu/swish,
            elu, selu, sigmoid, softplus, linear, relu2 (squared ReLU, So et al. 2021 "Primer" §4).
        max_position_embeddings: longest sequence (tokens) the position scheme supports (and the length n
            that Linformer's sequence projections compress).
        position_embedding_type: one of `hfzoo.modules.positions.POSITION_EMBEDDING_TYPES`
            (`learned`: trained absolute embeddings added to the tokens; `sinusoidal`: the fixed
            sin/cos encodings of Vaswani et al. 2017; `none`: no position information;
            `relative_attention_bias`: T5's learned bucketed bias on the attention scores, Raffel et al.
            2020 §2.1; `shaw`: relative position representations on keys and values with clipped
            distances, Shaw et al. 2018 (eager attention only); `rotary`: rotary embeddings of queries
            and keys, Su et al. 2021; `alibi`: fixed linear distance biases per head, Press et al. 2022).
            The backends each supports are in `hfzoo.modules.positions.POSITION_ATTENTION_BACKENDS`.
        norm_type: `layer_norm`, `rms_norm` (Zhang & Sennrich 2019) or `none` (no normalization:
            ReZero alone, Fixup), see `hfzoo.modules.norms.NORM_CLASSES`.
        norm_position: `pre` (norm before each sub-block, plus a final norm), `post` (norm after each
            residual addition, no final norm), `sandwich` (norm before and after each sub-block, plus a
            final norm; Ding et al. 2021) or `deepnorm` (post-norm with the residual scaled by alpha and
            branch initialisation scaled by beta; Wang et al. 2022), see `hfzoo.modules.layer`.
            `sandwich` and `deepnorm` need a `norm_type` other than `none`.
        embedding_norm: normalize the sum of token, position and token-type embeddings before the first
            layer (BERT's `embeddings.LayerNorm`, Devlin et al. 2019); uses `norm_type`.
        layer_norm_eps: epsilon of `nn.LayerNorm` (used when `norm_type="layer_norm"`).
        rms_norm_eps: epsilon of `RMSNorm` (used when `norm_type="rms_norm"`).
        attention_bias: biases in the q/k/v/o projections.
        mlp_bias: biases in the feed-forward projections.
        hidden_dropout_prob: dropout on embeddings and sub-block outputs (and the feed-forward hidden
            layer, unless `activation_dropout` is set).
        attention_probs_dropout_prob: dropout on attention probabilities.
        activation_dropout: dropout on the feed-forward hidden layer, after the activation (and gating), as
            T5's `DenseReluDense`; None uses `hidden_dropout_prob`. BERT and GPT-2 have none there: their
            presets and conversions set 0.0, so that finetuning a converted checkpoint trains as the
            original does.
        initializer_range: standard deviation of the normal initialisation of weight matrices.
        tie_word_embeddings: share the input embedding matrix with the output projection (Press & Wolf
            2017). In the encoder-decoder, the decoder's input embedding (see
            `tie_encoder_decoder_embeddings`).
        embedding_size: inner size E of factorized token embeddings (ALBERT, Lan et al. 2020 §3.1): a
            `(vocab_size, E)` matrix and an `E -> hidden_size` projection; a tied output head uses both
            factors, an untied one is a full `hidden_size -> vocab_size` matrix (as Mesh TensorFlow).
            None: one `(vocab_size, hidden_size)` matrix. See `hfzoo.modules.embeddings`.
        scale_embeddings: multiply token embeddings by sqrt(hidden_size) (Vaswani et al. 2017, §3.4).
        block_sharing: ALBERT-style cross-layer parameter sharing (Lan et al. 2020 §3.1): one layer's
            parameters used by every layer of a stack; one of `hfzoo.modules.stack.BLOCK_SHARING`
            (`none`; `all`; `encoder` / `decoder`: one stack of the encoder-decoder only). Refused together
            with a per-layer structure (experts on every k-th layer only, a relative bias table per layer).
        num_softmaxes: K > 1 makes every LM head a mixture of K softmaxes (Yang et al. 2018) whose
            `logits` are log-probabilities (see `hfzoo.modules.embeddings.VocabProjection`); 1: one softmax.
        adaptive_input_cutoffs: adaptive input embeddings (Baevski & Auli 2019): the token ids are split into
            frequency clusters `[0, c_0), [c_0, c_1), ..., [c_last, vocab_size)` (strictly increasing ids in
            `[1, vocab_size)`), cluster i embedded with width `hidden_size // adaptive_input_factor ** i` and
            projected to `hidden_size` (`hfzoo.modules.embeddings.AdaptiveEmbedding`); a head tied to them
            scores each cluster through the same factors with one softmax (`AdaptiveVocabProjection`).
            Narang et al. 2021: `[2500, 8500]` (clusters of 2,500 / 6,000 / 23,628 tokens). None: one matrix.
            Not with `embedding_size`; the vocabulary cannot be resized.
        adaptive_input_factor: the shrink factor k >= 1 of the adaptive input clusters (Baevski & Auli: 4;
            1 keeps every cluster at `hidden_size`, without projections). Only with `adaptive_input_cutoffs`.
        adaptive_softmax_cutoffs: the adaptive softmax (Grave et al. 2017) on every LM head: a head cluster
            `[0, c_0)` plus tail clusters split like `adaptive_input_cutoffs`, and `logits` that are
            log-probabilities of the whole vocabulary (`hfzoo.modules.embeddings.AdaptiveLogSoftmax`). Narang
            et al. 2021: `[2500, 8500, 32000]`. Tied (`tie_word_embeddings`), the input embeddings share its
            clusters, so `adaptive_input_cutoffs` / `adaptive_input_factor` must equal these. Not with
            `embedding_size` or `num_softmaxes > 1`; classification heads have no vocabulary output and ignore it.
        adaptive_softmax_factor: the shrink factor k >= 1 of the adaptive softmax's tail clusters (4 as
            torch's `div_value`; 1 is Narang et al.'s "adaptive softmax without projection"). Only with
            `adaptive_softmax_cutoffs`.
        use_cache: return key/value caches from the forward pass (generation).
        gated_mlp: gated feed-forward `down_proj(act(gate_proj(x)) * up_proj(x))`, the GLU family
            (Dauphin et al. 2017; Shazeer 2020): GLU = `hidden_act="sigmoid"`, ReGLU = "relu", GeGLU =
            "gelu" (T5 v1.1: "gelu_new"), SwiGLU = "silu", LiGLU = "linear". Adds one
            `hidden_size x intermediate_size` matrix.
        rezero: scale each residual branch by a scalar initialised to 0 (Bachlechner et al. 2020);
            with `norm_type` none / layer_norm / rms_norm these are the paper's three ReZero rows. Not
            with `norm_position="deepnorm"` nor `fixup_init`.
        fixup_init: Fixup (Zhang et al. 2019): scalar biases and multiplier per residual branch, the last
            projection of each branch zero-initialised, the others scaled by L^(-1/2) (L = number of
            residual branches). Requires `norm_type="none"`; not with `rezero`.
        num_experts: experts of the mixture-of-experts feed-forward; 0 = dense feed-forward everywhere,
            otherwise >= 2 (see `hfzoo.modules.experts`).
        num_experts_per_tok: experts per token (top-k; Shazeer et al. 2017, GShard top-2); at most
            `num_experts`, and 1 with `router_type="switch"`.
        router_type: `top_k` (Shazeer et al. 2017 / GShard, no capacity limit) or `switch` (Fedus et al.
            2021: top-1 with capacity and token dropping), see `hfzoo.modules.experts.ROUTERS`.
        expert_capacity_factor: Switch capacity factor (> 0): each expert takes at most
            `ceil(factor * tokens / num_experts)` tokens of a sequence.
        router_aux_loss_coef: weight of the load-balancing loss (Fedus et al. 2021, eq. 4) in the loss.
        router_z_loss_coef: weight of the router z-loss (Zoph et al. 2022, ST-MoE eq. 5) in the loss.
        moe_layer_interval: experts on every k-th layer of each stack (layers with
            `(layer_idx + 1) % k == 0`), dense feed-forward elsewhere; at most the depth of the deepest stack.
        output_router_logits: return the routers' logits (`router_logits`) in the model outputs, as
            transformers' MoE models. The auxiliary losses are added to the loss and returned as
            `aux_loss` whenever the model has experts.
        relative_attention_num_buckets: buckets of the T5 relative bias (`relative_attention_bias`
            only; at least 4).
        relative_attention_max_distance: distance (tokens) from which the T5 bias uses a single bucket
            (`relative_attention_bias` only; more than `relative_attention_num_buckets // 2`).
        share_relative_attention_bias: one T5 bias table per stack, shared by its layers, as T5 (True), or
            one per layer (False): Narang et al. 2021's "relative attention with shared bias" / "with bias".
        max_relative_positions: Shaw et al.'s clipping distance k (`shaw` only): 2k + 1 learned key and
            value vectors per layer.
        rope_theta: base of the rotary angles (`rotary` only).
        scale_attention_scores: multiply attention scores by `head_dim ** -0.5` (Vaswani et al. 2017,
            eq. 1). False is T5 (Mesh TensorFlow), which folds that factor into the initialisation: hfzoo
            then draws `q_proj` with standard deviation `initializer_range * head_dim ** -0.5`.
        scale_lm_head_input: multiply the final hidden states by `hidden_size ** -0.5` right before the
            vocabulary projection of the language-model head, as T5 v1.0 (Mesh TensorFlow) does with its
            tied embeddings (transformers' T5 calls it `scale_decoder_outputs`).
        token_mixer: the sublayer that mixes information across positions, a key of
            `hfzoo.modules.mixers.TOKEN_MIXERS` (`self_attention`: multi-head self-attention, Vaswani et al.
            2017; `fourier`: FNet's Fourier transform, Lee-Thorp et al. 2022; `linformer`: attention over keys
            and values projected along the sequence, Wang et al. 2020; `sliding_window`: attention within a
            local window, Beltagy et al. 2020; `bigbird`: BigBird's block-sparse window + global + random
            attention, Zaheer et al. 2020). Refused in a family or stack
            direction (causal / bidirectional) where the registry entry says the mixer is undefined, with
            `use_cache=True` in a causal stack when the mixer has no KV cache, and with position schemes
            acting inside attention when the mixer does not apply them.
        sublayer_pattern: the order of the sublayers of every stack, Press et al. 2020 ("Improving
            Transformer Models by Reordering their Sublayers"): a string of `s` (token mixer, followed by
            cross-attention in the encoder-decoder's decoder) and `f` (feed-forward) with 2N letters for N
            layers (`num_hidden_layers`; the encoder-decoder's decoder `num_decoder_layers`, so there both
            depths must be equal). None is the interleaved Transformer `"sf" * N`; the sandwich Transformer
            is `s^k (sf)^(N-k) f^k` (`hfzoo.modules.layer.sandwich_pattern`); `"s" * 2N` is attention only,
            `"f" * 2N` feed-forward only (no token mixing: `use_cache` must be False in a causal stack).
            Each `sf` is one layer and any other letter a layer of its own (`hfzoo.modules.layer.layer_sublayers`).
            Must be None with a token mixer that contains its feed-forward (`branched_attention`).
        linformer_k: Linformer's projected length k (`token_mixer="linformer"` only; Wang et al. 2020, eq. 7):
            keys and values are projected along the sequence from `max_position_embeddings` positions to k
            (1 <= k <= `max_position_embeddings`).
        linformer_sharing: Linformer's parameter sharing (`token_mixer="linformer"` only; Wang et al. 2020
            §4): `headwise` (one key projection E and one value projection F per layer, shared by the heads)
            or `key_value` (E = F), see `hfzoo.modules.linformer.LINFORMER_SHARING`.
        attention_window: the local window w of sliding-window attention (`token_mixer="sliding_window"` only;
            Beltagy et al. 2020, Longformer §3.1, whose `attention_window` it is): each token attends to the w/2
            tokens on each side of it (before it, in a causal stack) and itself; a positive even integer.
        bigbird_block_size: tokens per block of BigBird's block-sparse attention (`token_mixer="bigbird"` only;
            Zaheer et al. 2020, App. D); a positive integer. Each query block attends to its window of 3
            blocks, the global blocks and the random blocks (`hfzoo.modules.sparse_attention`).
        bigbird_num_random_blocks: random key blocks per query block (r; `token_mixer="bigbird"` only), drawn
            per layer and head with a fixed seed; >= 0.
        bigbird_num_global_blocks: global blocks g (`token_mixer="bigbird"` only): the first ceil(g/2) and the
            last floor(g/2) blocks of each sequence attend to and are attended by every token (2: BigBird-ITC's
            first and last block); >= 0.
        layer_type: the layers of every stack, a key of `hfzoo.modules.stack.LAYER_TYPES`: `transformer`
            (`HfzooLayer`: token mixer, cross-attention, feed-forward, in `sublayer_pattern`'s order) or a layer
            type with blocks of its own (e.g. `evolved_transformer`, So et al. 2019's cells); such a class
            refuses the fields it does not take when the config is built (its `check_config`).
        conv_kernel_size: kernel width (tokens) of the lightweight / dynamic convolutions (`token_mixer=
            "lightweight_convolution"` / `"dynamic_convolution"`, Wu et al. 2019): one int for every layer, a
            list with one width per token-mixer layer of each convolution stack, or None for Wu et al.'s
            3, 7, 15, 31, 31, ... (`hfzoo.modules.convolutions`). Causal stacks see the current and k - 1
            previous positions, bidirectional ones a centred window.
        conv_num_heads: H, the convolution's heads: each kernel is shared by `hidden_size // H` channels
            (Wu et al. §3); None: `num_attention_heads`. Must divide `hidden_size`.
        conv_weight_dropout: DropConnect probability on the softmax-normalized convolution kernels in
            training (Wu et al. §3), in [0, 1).
        conv_pointwise_projection: a pointwise `hidden_size x hidden_size` projection after the depthwise
            convolution (a depthwise-separable convolution, as the Mesh TensorFlow block Narang et al. 2021
            used, which gives the block self-attention's 4 d^2 weights); False is Wu et al.'s block.
        synthesizer_type: how `token_mixer="synthesizer"` (Tay et al. 2020) synthesizes its attention logits, a
            key of `hfzoo.modules.synthesizer.SYNTHESIZERS`: `dense` (each token predicts its logits over the key
            positions from its query, §3.1), `random` (a learned matrix independent of the input, §3.2),
            `factorized_random` (that matrix as a product of two rank-`synthesizer_factorized_rank` factors,
            §3.3). The random matrices and the dense projection cover `max_position_embeddings` positions:
            longer sequences are refused.
        synthesizer_mixing: `none`, or mixed with dot-product attention (Tay et al. §3.4): `plus` sums the two
            logits, `plus_alpha` weighs them by a learned sigmoid (one scalar per layer).
        synthesizer_num_heads: the synthesizer's heads; None: `num_attention_heads`.
        synthesizer_head_dim: the size of its heads; None: `head_dim`.
        synthesizer_factorized_rank: the rank k of `factorized_random` (Mesh TensorFlow's 16).
        transparent_attention: transparent attention (Bapna et al. 2018, "Training Deeper Neural Machine
            Translation Models with Transparent Attention", §3): each decoder cross-attention reads a learned
            softmax-weighted combination of the encoder's embedding output and layer outputs instead of its
            last output (`hfzoo.modules.attention.TransparentAttention`). Defined for the encoder-decoder only.
        layer_stack: how each stack applies its layers, a key of `hfzoo.modules.stack.LAYER_STACKS`
            (`standard`; `universal`: the Universal Transformer, Dehghani et al. 2019, one block of
            `num_hidden_layers` layers applied `num_recurrent_steps` times with shared parameters, a timestep
            signal and ACT halting; `funnel`: the Funnel Transformer's encoder, Dai et al. 2020, pooling the
            sequence between blocks, bidirectional stacks only). The encoder-decoder's `decoder_layer_stack`
            may set the decoder's separately.
        num_recurrent_steps: the Universal Transformer's number of recurrent steps T (with ACT, the maximum;
            `layer_stack="universal"` only). Narang et al. 2021 use 24.
        adaptive_computation_time: halt each position with Adaptive Computation Time (Graves 2016; Dehghani
            et al. 2019 §2.2) and return the ponder cost; False: every position takes `num_recurrent_steps`
            steps (tensor2tensor's "basic" recurrence, which Narang et al.'s released configuration runs).
        act_threshold: ACT's halting threshold 1 - epsilon, in (0, 1] (tensor2tensor: 0.99; Narang et al.'s
            configuration: 0.95). A position halts once its summed halting probability exceeds it.
        act_loss_coef: weight of the ACT ponder cost (steps + remainder, averaged over real tokens) in the loss
            (tensor2tensor's `act_loss_weight`); it is returned in the outputs' `aux_loss`.
        residual_gating: a gate between each sublayer's output and the residual sum, a key of
            `hfzoo.modules.layer.RESIDUAL_GATES` (`none`; `gru`: Mesh TensorFlow's GRU-type gate of its
            Universal Transformer, `hfzoo.modules.universal.GRUResidualGate`, used in Narang et al.'s row).
        funnel_block_sizes: layers per block of a funnel stack (`layer_stack="funnel"`), summing to its depth;
            None: three blocks as equal as possible (Dai et al.'s B4-4-4 for 12 layers).
        funnel_upsampling_layers: full-length layers after the funnel's up-sampling (Dai et al. 2020 §2.3: 2),
            in stacks whose heads read every position (the encoder family); the encoder-decoder's decoder
            cross-attends to the compressed encoder output (Narang et al. 2021) and does not use it.
        memory_layers: feed-forward sublayers (indices among the stack's layers' ones; negative counts from the
            end) replaced by a product key memory (Lample et al. 2019, `hfzoo.modules.memory`), in every stack
            (the encoder-decoder's `decoder_memory_layers` sets the decoder's); None: none.
        memory_num_keys: |K|, sub-keys per half; the memory holds |K|^2 values (Lample et al.: 512, 262k values).
        memory_heads: memory heads H, whose reads are summed (Lample et al.: 4).
        memory_top_k: k, keys read per head (Lample et al.: 32); at most `memory_num_keys`.
        memory_key_dim: d_q, the query and product-key dimension (even; XLM's default 256).
        memory_query_norm: normalisation of the memory queries, a key of `hfzoo.modules.memory.MEMORY_QUERY_NORMS`
            (`batch_norm`: Lample et al. §3.2, over real tokens; `layer_norm`: per sub-key, Narang et al.'s
            Mesh TensorFlow).
        value_residual: value residual learning (ResFormer; Zhou et al. 2024, "Value Residual Learning For
            Alleviating Attention Concentration in Transformers", §3): in every stack, each token mixer after the
            first uses `lambda_1 V_n + lambda_2 V_1`, V_1 the first token mixer's values, with two learned scalars
            per mixer initialised at 0.5 (`hfzoo.modules.connections.ValueResidual`). The encoder-decoder mixes
            within each self-attention stack; cross-attention's values (the encoder output) are left as they
            are. Refused with a layer stack other than `standard`, a token mixer without values
            (`TokenMixer.values`), `layer_type="evolved_transformer"` or fewer than 2 token mixers.
        unet_skips: U-Net skips (Ronneberger et al. 2015; modded-nanogpt, Jordan et al. 2024): in every stack the
            output of layer i < L//2 is added, times a learned scalar initialised at 1, to the input of layer
            L-1-i; with an odd L the middle layer takes none (`hfzoo.modules.connections.UNetSkips`). Refused with
            a layer stack other than `standard` and with fewer than 2 layers.
        qk_norm: QK-norm, a key of `hfzoo.modules.norms.QK_NORMS` or None (off): `rms_norm` (OLMo 2, Walsh et al.
            2024) or `layer_norm` (Dehghani et al. 2023, "Scaling Vision Transformers to 22 Billion Parameters",
            §3.1) of each head's queries and keys over `head_dim` before their dot product, in every
            `HfzooAttention` (self- and cross-attention); rotary then rotates the normalised vectors, the KV cache
            stores normalised keys, score biases (T5, ALiBi) are added unchanged. Refused with a token mixer
            without queries and keys (`hfzoo.modules.mixers.TokenMixer.score_options`).
        qk_norm_learnable_scale: QK-norm with a learned `(head_dim,)` scale per norm (True, OLMo 2) or none
            (False). Only with `qk_norm`.
        attn_logit_softcapping: cap c > 0 of the attention scores, `c * tanh(s / c)` (Gemma 2 Team 2024 §2; Gemma 2
            uses 50.0), or None (off); eager, flex_attention and flash_attention apply it, SDPA cannot (the model
            falls back to eager; an explicit `attn_implementation="sdpa"` is refused). See
            `hfzoo.modules.softcapping`.
        final_logit_softcapping: cap c > 0 of the LM heads' vocabulary logits, `c * tanh(z / c)` (Gemma 2 §2; Gemma
            2 uses 30.0), in the logits, the chunked training loss and generation; None: off. Not with heads
            returning log-probabilities (`num_softmaxes > 1`, the adaptive softmax) or tied adaptive inputs.
        pad_token_id, bos_token_id, eos_token_id: special token ids (or None).

    Raises:
        huggingface_hub.errors.StrictDataclassClassValidationError: a field has a value outside its
            allowed set or range; the message names the field.
        ValueError: `hidden_size` not divisible by `num_attention_heads` when `head_dim` is not set; a
            position field set (to a non-default value) for a scheme that is not selected, e.g.
            `rope_theta` with `position_embedding_type="alibi"`; `rotary` with an odd `head_dim`; a keyword
            that is no field but a near-miss of one (`num_hiden_layers`) or another model's name for one (T5's
            `num_layers`, `layer_norm_epsilon`: `refuse_misspelled_fields`).
    """

    model_type = "hfzoo"
    keys_to_ignore_at_inference = [CACHE_NAME]  # the cache is no prediction

    vocab_size: int = 32000
    hidden_size: int = 512
    num_hidden_layers: int = 6
    num_attention_heads: int = 8
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    intermediate_size: int = 2048
    hidden_act: str = "gelu"
    max_position_embeddings: int = 1024
    position_embedding_type: str = "learned"
    norm_type: str = "layer_norm"
    norm_position: str = "pre"
    embedding_norm: bool = False
    layer_norm_eps: float | int = 1e-5
    rms_norm_eps: float | int = 1e-6
    attention_bias: bool = True
    mlp_bias: bool = True
    hidden_dropout_prob: float | int = 0.0
    attention_probs_dropout_prob: float | int = 0.0
    activation_dropout: float | int | None = None
    initializer_range: float | int = 0.02
    tie_word_embeddings: bool = True
    use_cache: bool = True
    pad_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    # --- embeddings (issue 4)
    embedding_size: int | None = None
    scale_embeddings: bool = False
    block_sharing: str = "none"
    num_softmaxes: int = 1
    adaptive_input_cutoffs: list[int] | None = None
    adaptive_input_factor: float | int = 4
    adaptive_softmax_cutoffs: list[int] | None = None
    adaptive_softmax_factor: float | int = 4
    # --- feed-forward / norms / experts (issue 4)
    gated_mlp: bool = False
    rezero: bool = False
    fixup_init: bool = False
    num_experts: int = 0
    num_experts_per_tok: int = 1
    router_type: str = "top_k"
    expert_capacity_factor: float | int = 1.25
    router_aux_loss_coef: float | int = 0.01
    router_z_loss_coef: float | int = 0.001
    moe_layer_interval: int = 1
    output_router_logits: bool = False
    # --- positions and attention (issue 4)
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    share_relative_attention_bias: bool = True
    max_relative_positions: int = 16
    rope_theta: float | int = 10000.0
    scale_attention_scores: bool = True
    scale_lm_head_input: bool = False
    # --- layer structure: token mixers and sublayer order
    token_mixer: str = "self_attention"
    sublayer_pattern: str | None = None
    linformer_k: int = 256
    linformer_sharing: str = "headwise"
    attention_window: int = 512
    bigbird_block_size: int = 64
    bigbird_num_random_blocks: int = 3
    bigbird_num_global_blocks: int = 2
    layer_type: str = "transformer"
    # --- token mixers: lightweight and dynamic convolutions (Wu et al. 2019)
    conv_kernel_size: int | list[int] | None = None
    conv_num_heads: int | None = None
    conv_weight_dropout: float | int = 0.0
    conv_pointwise_projection: bool = False
    # --- token mixers: Synthesizer (Tay et al. 2020)
    synthesizer_type: str = "dense"
    synthesizer_mixing: str = "none"
    synthesizer_num_heads: int | None = None
    synthesizer_head_dim: int | None = None
    synthesizer_factorized_rank: int = 16
    transparent_attention: bool = False
    # --- layer stacks: Universal Transformer, Funnel Transformer; gated residuals; product key memory
    layer_stack: str = "standard"
    num_recurrent_steps: int = 6
    adaptive_computation_time: bool = True
    act_threshold: float | int = 0.99
    act_loss_coef: float | int = 0.01
    residual_gating: str = "none"
    funnel_block_sizes: list[int] | None = None
    funnel_upsampling_layers: int = 2
    memory_layers: list[int] | None = None
    memory_num_keys: int = 512
    memory_heads: int = 4
    memory_top_k: int = 32
    memory_key_dim: int = 256
    memory_query_norm: str = "batch_norm"
    # --- connections across a stack's layers (hfzoo/modules/connections.py)
    value_residual: bool = False
    unet_skips: bool = False
    # --- modern attention and output: QK-norm (Dehghani et al. 2023), logit soft-capping (Gemma 2)
    qk_norm: str | None = None
    qk_norm_learnable_scale: bool = True
    attn_logit_softcapping: float | int | None = None
    final_logit_softcapping: float | int | None = None

    def __post_init__(self, **kwargs):
        refuse_misspelled_fields(type(self), kwargs)
        heads = self.num_attention_heads
        if self.head_dim is None and _is_int(heads) and heads > 0 and _is_int(self.hidden_size):
            if self.hidden_size % self.num_attention_heads != 0:
                raise ValueError(
                    f"hidden_size ({self.hidden_size}) must be divisible by num_attention_heads "
                    f"({self.num_attention_heads}) unless head_dim is set"
                )
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.num_key_value_heads is None:  # multi-head attention: one key/value head per query head (as Llama)
            self.num_key_value_heads = heads
        super().__post_init__(**kwargs)

    def validate_hfzoo_architecture(self) -> None:
        """Check every architecture field; raise `ValueError` naming the first bad one."""
        self._validate_field_types()
        for name in (
            "vocab_size",
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "intermediate_size",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.num_attention_heads % key_value_heads(self):
            raise ValueError(
                f"num_key_value_heads={self.num_key_value_heads} must divide num_attention_heads="
                f"{self.num_attention_heads} (each key/value head serves the same number of query heads)"
            )
        # classifier_dropout: a field of each family's config (None: hidden_dropout_prob)
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "activation_dropout", "classifier_dropout"):
            value = getattr(self, name, None)
            if value is None:
                continue
            if not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value!r}")
        for name in ("layer_norm_eps", "rms_norm_eps", "initializer_range"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")
        choices = {
            "hidden_act": sorted(ACTIVATIONS),
            "position_embedding_type": list(POSITION_EMBEDDING_TYPES),
            "norm_type": list(NORM_CLASSES),
            "norm_position": list(NORM_POSITIONS),
            "residual_gating": list(RESIDUAL_GATES),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"{name}={getattr(self, name)!r} is not supported; {choice_hint(getattr(self, name), allowed)}"
                )
        for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
            value = getattr(self, name)
            for token in value if isinstance(value, list) else [value]:
                if token is not None and not 0 <= token < self.vocab_size:
                    raise ValueError(f"{name}={value} is outside the vocabulary [0, {self.vocab_size})")
        check_qk_norm_config(self)  # QK-norm and logit soft-capping: the values; the mixers in _validate_token_mixer
        check_softcapping_config(self)
        self._validate_embeddings()
        self._validate_stacks()
        self._validate_ffn_norms()
        self._validate_positions()

    def _validate_field_types(self) -> None:
        """Check each hfzoo field's value against its annotation (`_type_error`); the first mismatch is refused."""
        for name, annotation in _hfzoo_field_types(type(self)).items():
            problem = _type_error(getattr(self, name), annotation)
            if problem is not None:
                raise ValueError(f"{name} must be {problem}, got {getattr(self, name)!r}")

    def stack_layouts(self) -> tuple[StackLayout, ...]:
        """The stacks of this family's models, input side first (each family's config defines them).

        Returns:
            One `hfzoo.modules.stack.StackLayout` per stack; none for the bare `HfzooConfig`.
        """
        return ()

    def get_text_config(self, decoder=None, encoder=None):
        """This config, or with `decoder=True` a view sized for the KV cache of the causal stack.

        transformers sizes generation caches from `get_text_config(decoder=True).num_hidden_layers`; the
        cache holds one layer per token mixer of the causal stack (`sublayer_pattern`; a layer type's
        `num_cache_layers` per layer), which the view's
        `num_hidden_layers` then is (the encoder-decoder's `num_decoder_layers` by default; a Universal
        Transformer's stack has one per recurrent step). The encoder-decoder always gets such a view, never
        transformers' flat-config copy, which would move `decoder_token_mixer` / `decoder_layer_stack` onto the
        encoder's fields.
        """
        causal = [layout for layout in self.stack_layouts() if layout.is_causal]
        if decoder and causal:
            cache_layers = causal[-1].cache_layers(self)
            if cache_layers != self.num_hidden_layers or getattr(self, "is_encoder_decoder", False):
                view = copy.copy(self)
                view.num_hidden_layers = cache_layers
                return view
        return super().get_text_config(decoder=decoder, encoder=encoder)

    def _validate_stacks(self) -> None:
        """Check `layer_type`, `sublayer_pattern` and the token mixers against every stack (`stack_layouts`)."""
        if self.layer_type not in LAYER_TYPES:
            raise ValueError(
                f"layer_type={self.layer_type!r} is not supported; "
                f"{choice_hint(self.layer_type, LAYER_TYPES, 'LAYER_TYPES')}"
            )
        if self.layer_type != "transformer" and key_value_heads(self) != self.num_attention_heads:
            raise ValueError(
                f"num_key_value_heads={self.num_key_value_heads} (grouped-query attention) with num_attention_heads="
                f"{self.num_attention_heads}, but layer_type={self.layer_type!r} does not group key/value heads; use "
                f"num_key_value_heads={self.num_attention_heads} or layer_type='transformer'"
            )
        check_layer = getattr(LAYER_TYPES[self.layer_type], "check_config", None)
        if check_layer is not None:
            check_layer(self)
        pattern = self.sublayer_pattern
        if pattern is not None and (not isinstance(pattern, str) or not pattern or set(pattern) - set(SUBLAYERS)):
            raise ValueError(
                f"sublayer_pattern={pattern!r} must be a non-empty string of the letters {list(SUBLAYERS)} "
                "(s = token mixer, f = feed-forward), or None for the interleaved 'sfsf...'"
            )
        if not isinstance(self.transparent_attention, bool):
            raise ValueError(f"transparent_attention must be True or False, got {self.transparent_attention!r}")
        if self.transparent_attention and not any(layout.has_cross_attention for layout in self.stack_layouts()):
            raise ValueError(
                f"transparent_attention=True is defined for the encoder-decoder (hfzoo_encoder_decoder) only: it "
                f"changes what the decoder's cross-attention reads of the encoder, and {self.model_type} has no "
                "cross-attention; set transparent_attention=False"
            )
        if self.transparent_attention:
            other = [(f.layer_stack_field, f.layer_stack) for f in self.stack_layouts() if f.layer_stack != "standard"]
            if self.layer_type != "transformer":
                other.append(("layer_type", self.layer_type))
            if other:
                field, value = other[0]
                raise ValueError(
                    f"transparent_attention=True needs every encoder layer's output, which {field}={value!r} does not "
                    "keep; use the standard layer stack and layer type, or transparent_attention=False"
                )
        for layout in self.stack_layouts():
            mixer = TOKEN_MIXERS.get(layout.token_mixer)
            if pattern is not None and mixer is not None and mixer.feed_forward:
                raise ValueError(
                    f"sublayer_pattern={pattern!r}, but {layout.token_mixer_field}={layout.token_mixer!r} contains "
                    "its layer's feed-forward, so its layers have no other sublayer; leave sublayer_pattern=None"
                )
        used_mixers, used_stacks = set(), set()
        for layout in self.stack_layouts():
            if not isinstance(layout.num_layers, int) or layout.num_layers < 1:
                raise ValueError(f"{layout.num_layers_field} must be a positive integer, got {layout.num_layers!r}")
            self._validate_layer_stack(layout)
            if pattern is not None and len(pattern) != 2 * layout.num_layers:
                raise ValueError(
                    f"sublayer_pattern={pattern!r} has {len(pattern)} sublayers, but the {layout.name} has "
                    f"{layout.num_layers_field}={layout.num_layers} layers: expected 2 * {layout.num_layers} = "
                    f"{2 * layout.num_layers} (the pattern applies to every stack of {self.model_type})"
                )
            sublayers = layout.sublayers(self)
            has_mixer = any("s" in layer for layer in sublayers)
            if layout.has_cross_attention and not has_mixer:
                raise ValueError(
                    f"sublayer_pattern={pattern!r} has no token mixer ('s'), so the {layout.name}, whose "
                    "cross-attention follows each token mixer, would never read the encoder"
                )
            if layout.name in BLOCK_SHARING[self.block_sharing] and len(set(sublayers)) > 1:
                raise ValueError(
                    f"block_sharing={self.block_sharing!r} ties every layer of the {layout.name} to its layer 0, "
                    f"but sublayer_pattern={pattern!r} gives its layers different sublayers {sorted(set(sublayers))}; "
                    "use block_sharing='none' or a pattern whose layers are alike"
                )
            if layout.is_causal and self.use_cache and not has_mixer:
                raise ValueError(
                    f"use_cache=True, but sublayer_pattern={pattern!r} has no token mixer ('s'), so the "
                    f"{layout.name} has no KV cache; set use_cache=False"
                )
            self._validate_token_mixer(layout)
            check_layer_connections(self, layout)
            if has_mixer:
                used_mixers.add(layout.token_mixer)
            used_stacks.add(layout.layer_stack)
        for name in used_mixers:
            if TOKEN_MIXERS[name].check_config is not None:
                TOKEN_MIXERS[name].check_config(self)
        self._refuse_unused_fields(
            "token_mixer", {name: entry.config_fields for name, entry in TOKEN_MIXERS.items()}, used_mixers
        )
        self._refuse_unused_fields(
            "layer_stack", {name: entry.config_fields for name, entry in LAYER_STACKS.items()}, used_stacks
        )

    def _validate_layer_stack(self, layout: StackLayout) -> None:
        """Check a stack's layer stack against its `LAYER_STACKS` entry (where it is defined, KV cache)."""
        field, name = layout.layer_stack_field, layout.layer_stack
        if name not in LAYER_STACKS:
            raise ValueError(f"{field}={name!r} is not supported; {choice_hint(name, LAYER_STACKS, 'LAYER_STACKS')}")
        entry = LAYER_STACKS[name]
        if not (entry.causal if layout.is_causal else entry.bidirectional):
            direction = "causal" if layout.is_causal else "bidirectional"
            allowed = [
                other for other, e in LAYER_STACKS.items() if (e.causal if layout.is_causal else e.bidirectional)
            ]
            reason = (
                " (pooling mixes neighbouring positions, so a position would see later ones)"
                if layout.is_causal
                else ""
            )
            raise ValueError(
                f"{field}={name!r} is not defined for the {direction} {layout.name} of {self.model_type}{reason}; "
                f"choose one of {allowed}"
            )
        if layout.is_causal and self.use_cache and not entry.kv_cache:
            raise ValueError(f"use_cache=True, but {field}={name!r} has no KV cache; set use_cache=False")
        if entry.check_config is not None:
            entry.check_config(self, [layout])

    def _validate_token_mixer(self, layout: StackLayout) -> None:
        """Check a stack's token mixer against its `TOKEN_MIXERS` entry (where it is defined, cache, positions)."""
        field, name = layout.token_mixer_field, layout.token_mixer
        if name not in TOKEN_MIXERS:
            raise ValueError(f"{field}={name!r} is not supported; {choice_hint(name, TOKEN_MIXERS, 'TOKEN_MIXERS')}")
        mixer = TOKEN_MIXERS[name]
        if not mixer.runs_in(self.model_type, layout.is_causal):
            direction = "causal" if layout.is_causal else "bidirectional"
            allowed = [
                other for other, entry in TOKEN_MIXERS.items() if entry.runs_in(self.model_type, layout.is_causal)
            ]
            reason = f" ({mixer.reason})" if mixer.reason else ""
            raise ValueError(
                f"{field}={name!r} is not defined for the {direction} {layout.name} of {self.model_type}{reason}; "
                f"choose one of {allowed}"
            )
        if layout.is_causal and self.use_cache and not mixer.kv_cache:
            raise ValueError(
                f"use_cache=True, but {field}={name!r} has no KV cache (incremental decoding); set use_cache=False"
            )
        if key_value_heads(self) != self.num_attention_heads and not mixer.grouped_kv_heads:
            allowed = [other for other, entry in TOKEN_MIXERS.items() if entry.grouped_kv_heads]
            raise ValueError(
                f"num_key_value_heads={self.num_key_value_heads} (grouped-query attention) with num_attention_heads="
                f"{self.num_attention_heads}, but {field}={name!r} does not group key/value heads; use "
                f"num_key_value_heads={self.num_attention_heads} or a token mixer among {allowed}"
            )
        for option, default in SCORE_OPTIONS.items():  # QK-norm, attention soft-capping: mixers with queries and keys
            if getattr(self, option) != default and option not in mixer.score_options:
                allowed = [other for other, entry in TOKEN_MIXERS.items() if option in entry.score_options]
                raise ValueError(
                    f"{option}={getattr(self, option)!r} acts on attention queries, keys and scores, which "
                    f"{field}={name!r} does not apply; use {option}={default!r} or a token mixer among {allowed}"
                )
        if not mixer.attention_positions and self.position_embedding_type in ATTENTION_POSITION_EMBEDDING_TYPES:
            allowed = [kind for kind in POSITION_EMBEDDING_TYPES if kind not in ATTENTION_POSITION_EMBEDDING_TYPES]
            raise ValueError(
                f"position_embedding_type={self.position_embedding_type!r} acts inside attention, which "
                f"{field}={name!r} does not have; choose one of {allowed}"
            )

    def _validate_embeddings(self) -> None:
        """Check `embedding_size`, `num_softmaxes`, the adaptive vocabulary fields and `block_sharing`."""
        if self.embedding_size is not None and (not isinstance(self.embedding_size, int) or self.embedding_size < 1):
            raise ValueError(f"embedding_size must be None or a positive integer, got {self.embedding_size!r}")
        if not isinstance(self.num_softmaxes, int) or self.num_softmaxes < 1:
            raise ValueError(f"num_softmaxes must be a positive integer, got {self.num_softmaxes!r}")
        check_adaptive_config(self)
        allowed = list(BLOCK_SHARING)
        if not getattr(self, "is_encoder_decoder", False):
            allowed = [choice for choice in allowed if choice not in ("encoder", "decoder")]
        if self.block_sharing not in allowed:
            raise ValueError(
                f"block_sharing={self.block_sharing!r} is not supported by {self.model_type}; choose one of {allowed}"
            )
        # One set of layer parameters cannot also differ between layers.
        if self.block_sharing != "none" and has_per_layer_score_bias(self):
            raise ValueError(
                f"block_sharing={self.block_sharing!r} shares one layer's parameters across layers, which "
                f"contradicts position_embedding_type={self.position_embedding_type!r} with one score-bias table "
                "per layer (share_relative_attention_bias=False); share the bias or use block_sharing='none'"
            )
        interval = getattr(self, "moe_layer_interval", 1)
        if self.block_sharing != "none" and getattr(self, "num_experts", 0) > 0 and interval > 1:
            raise ValueError(
                f"block_sharing={self.block_sharing!r} shares one layer's parameters across layers, which "
                f"contradicts experts on every {interval}-th layer only (num_experts={self.num_experts}, "
                f"moe_layer_interval={interval}); use moe_layer_interval=1 or block_sharing='none'"
            )

    def _validate_ffn_norms(self) -> None:
        """Check the feed-forward, normalization and mixture-of-experts fields and their combinations."""
        placement = NORM_POSITIONS[self.norm_position]
        if self.norm_type == "none" and placement.needs_norm:
            raise ValueError(f"norm_position={self.norm_position!r} needs a normalization; norm_type='none' has none")
        if self.norm_type == "none" and self.embedding_norm:
            raise ValueError("embedding_norm=True needs a normalization; norm_type='none' has none")
        if self.fixup_init and self.norm_type != "none":
            raise ValueError(
                f"fixup_init=True requires norm_type='none' (Fixup replaces normalization), got {self.norm_type!r}"
            )
        if self.fixup_init and self.rezero:
            raise ValueError("fixup_init=True and rezero=True are alternative residual schemes; choose one")
        if self.rezero and placement.rescales_residual:
            raise ValueError(
                f"rezero=True cannot be combined with norm_position={self.norm_position!r} (both rescale the residual)"
            )
        if not isinstance(self.num_experts, int) or self.num_experts < 0 or self.num_experts == 1:
            raise ValueError(f"num_experts must be 0 (dense) or an integer >= 2, got {self.num_experts!r}")
        for name in ("num_experts_per_tok", "moe_layer_interval"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.router_type not in ROUTERS:
            raise ValueError(
                f"router_type={self.router_type!r} is not supported; {choice_hint(self.router_type, ROUTERS)}"
            )
        for block in FEED_FORWARD_BLOCKS.values():  # each feed-forward block checks its own fields
            check = getattr(block, "check_config", None)
            if check is not None:
                check(self)
        if self.expert_capacity_factor <= 0:
            raise ValueError(f"expert_capacity_factor must be positive, got {self.expert_capacity_factor!r}")
        for name in ("router_aux_loss_coef", "router_z_loss_coef"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if self.num_experts:
            if self.num_experts_per_tok > self.num_experts:
                raise ValueError(
                    f"num_experts_per_tok={self.num_experts_per_tok} exceeds num_experts={self.num_experts}"
                )
            if self.router_type == "switch" and self.num_experts_per_tok != 1:
                raise ValueError(
                    f"num_experts_per_tok={self.num_experts_per_tok} with router_type='switch'; Switch routing is top-1"
                )
            depth = max(
                (sum("f" in layer for layer in layout.sublayers(self)) for layout in self.stack_layouts()),
                default=self.num_hidden_layers,
            )
            if self.moe_layer_interval > depth:
                raise ValueError(
                    f"moe_layer_interval={self.moe_layer_interval} exceeds the number of feed-forward sublayers "
                    f"of the deepest stack ({depth}): no layer would have experts"
                )

    def _validate_positions(self) -> None:
        """Check the position / attention fields and their combinations; raise `ValueError` naming the field."""
        kind = self.position_embedding_type
        for name in ("relative_attention_num_buckets", "relative_attention_max_distance", "max_relative_positions"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        for name in ("share_relative_attention_bias", "scale_attention_scores", "scale_lm_head_input"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.rope_theta <= 0:
            raise ValueError(f"rope_theta must be positive, got {self.rope_theta!r}")
        if self.relative_attention_num_buckets < 4:
            raise ValueError(
                f"relative_attention_num_buckets={self.relative_attention_num_buckets} is too small: T5's bucketing "
                "needs at least 4 (exact and logarithmic buckets, per direction in the encoder)"
            )
        if self.relative_attention_max_distance <= self.relative_attention_num_buckets // 2:
            raise ValueError(
                f"relative_attention_max_distance={self.relative_attention_max_distance} must exceed "
                f"relative_attention_num_buckets // 2 = {self.relative_attention_num_buckets // 2} (the exact buckets)"
            )
        check_position_config(self)
        self._refuse_unused_fields("position_embedding_type", POSITION_SCHEME_FIELDS, {kind})

    def _refuse_unused_fields(
        self, field: str, fields_of_choice: dict[str, tuple[str, ...]], selected: set[str]
    ) -> None:
        """Refuse a non-default value of a field read only by a choice of `field` that is not selected.

        Such a value would be a silent no-op (e.g. `rope_theta` without rotary positions).

        Args:
            field: the choosing field, e.g. `position_embedding_type`.
            fields_of_choice: `{choice: (names of the fields only that choice reads)}`, from the registry's file.
            selected: the choices in use (several for a field that differs by stack, e.g. token mixers).

        Raises:
            ValueError: naming the field, its value, the choice it belongs to and its default.
        """
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        owners: dict[str, list[str]] = {}  # a field may belong to several choices (e.g. both convolution mixers)
        for choice, names in fields_of_choice.items():
            for name in names:
                owners.setdefault(name, []).append(choice)
        for name, choices in owners.items():
            if not set(choices) & selected and getattr(self, name) != defaults[name]:
                raise ValueError(
                    f"{name}={getattr(self, name)!r} only applies to {field}="
                    f"{' or '.join(repr(choice) for choice in choices)}, but "
                    f"{field}={getattr(self, field)!r}; leave it at its default {defaults[name]!r}"
                )
