"""Convert between transformers' reference models and hfzoo, both ways: GPT-2, BERT and T5.

Sections: GPT-2 (`GPT2LMHeadModel`) <-> the hfzoo decoder (`HfzooDecoderForCausalLM`); BERT (`BertModel`,
`BertForMaskedLM`, `BertForSequenceClassification`) <-> the hfzoo encoder; T5 (`T5ForConditionalGeneration`,
v1.0 and v1.1) <-> the hfzoo encoder-decoder (`HfzooEncoderDecoderForConditionalGeneration`).

GPT-2 (Radford et al. 2019) is a pre-LN decoder with learned absolute positions, biases everywhere,
GELU (tanh approximation, `gelu_new`) and tied input/output embeddings: exactly what
`HfzooDecoderConfig` expresses with `norm_position="pre"`, `norm_type="layer_norm"`,
`position_embedding_type="learned"`, `attention_bias=mlp_bias=True`. The weights differ only in
layout:

- GPT-2's `Conv1D` stores `(in_features, out_features)` (`y = x @ W + b`); `nn.Linear` stores the
  transpose `(out_features, in_features)`.
- GPT-2 fuses the query/key/value projections into one `c_attn` of shape
  `(hidden_size, 3 * hidden_size)` (columns `[q | k | v]`); hfzoo has `q_proj`, `k_proj`, `v_proj`.

Both directions only split, concatenate and transpose tensors, so `hfzoo_to_gpt2(gpt2_to_hfzoo(m))`
returns `m`'s state dict exactly (same keys, `torch.equal` values).

Example:
    ```python
    >>> from transformers import GPT2LMHeadModel
    >>> from hfzoo.convert import gpt2_to_hfzoo, hfzoo_to_gpt2
    >>> gpt2 = GPT2LMHeadModel.from_pretrained("openai-community/gpt2")
    >>> model = gpt2_to_hfzoo(gpt2)            # HfzooDecoderForCausalLM, same logits
    >>> back = hfzoo_to_gpt2(model)            # GPT2LMHeadModel, same state dict
    ```
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import torch
from huggingface_hub.errors import StrictDataclassError
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertForSequenceClassification,
    BertModel,
    GPT2Config,
    GPT2LMHeadModel,
    GPT2Model,
    T5Config,
    T5ForConditionalGeneration,
)
from transformers.activations import ACT2FN

from .models.decoder import HfzooDecoderConfig, HfzooDecoderForCausalLM
from .models.encoder import (
    HfzooEncoderConfig,
    HfzooEncoderForMaskedLM,
    HfzooEncoderForSequenceClassification,
    HfzooEncoderModel,
)
from .models.encoder_decoder import HfzooEncoderDecoderConfig, HfzooEncoderDecoderForConditionalGeneration

__all__ = [
    "BERT_TO_HFZOO_GLOBAL",
    "BERT_TO_HFZOO_HEADS",
    "BERT_TO_HFZOO_LAYER",
    "bert_config_from_hfzoo",
    "bert_state_dict_to_hfzoo",
    "bert_to_hfzoo",
    "convert_bert_checkpoint",
    "hfzoo_config_from_bert",
    "hfzoo_to_bert",
    "GPT2_TO_HFZOO_GLOBAL",
    "GPT2_TO_HFZOO_LAYER",
    "gpt2_config_from_hfzoo",
    "gpt2_to_hfzoo",
    "hfzoo_config_from_gpt2",
    "hfzoo_to_gpt2",
    "T5_TO_HFZOO_DECODER_LAYER",
    "T5_TO_HFZOO_ENCODER_LAYER",
    "T5_TO_HFZOO_GLOBAL",
    "T5_TO_HFZOO_MLP",
    "hfzoo_config_from_t5",
    "hfzoo_to_t5",
    "t5_config_from_hfzoo",
    "t5_to_hfzoo",
]

# --------------------------------------------------------------------------------------------------
# The state-dict mapping. GPT-2 keys are given without the `transformer.` prefix of GPT2LMHeadModel.
# Operations (GPT-2 -> hfzoo; the inverse is applied for hfzoo -> GPT-2):
#   copy:     same tensor
#   T:        transpose (Conv1D (in, out) -> nn.Linear (out, in))
#   split3:   split the last dim into [q | k | v] (c_attn bias (3h,) -> 3 x (h,))
#   split3_T: split the last dim into [q | k | v], transpose each (c_attn (h, 3h) -> 3 x (h, h))
# --------------------------------------------------------------------------------------------------

GPT2_TO_HFZOO_GLOBAL: tuple[tuple[str, str, str], ...] = (
    # GPT-2 key            hfzoo key                       op
    ("wte.weight",         "model.embed_tokens.weight",    "copy"),
    ("wpe.weight",         "model.embed_positions.weight", "copy"),
    ("ln_f.weight",        "model.norm.weight",            "copy"),
    ("ln_f.bias",          "model.norm.bias",              "copy"),
    ("lm_head.weight",     "lm_head.weight",               "copy"),
)  # fmt: skip

GPT2_TO_HFZOO_LAYER: tuple[tuple[str, str | tuple[str, str, str], str], ...] = (
    # GPT-2 key (h.{i}.)   hfzoo key (model.layers.{i}.)                                            op
    ("ln_1.weight",        "self_attn_norm.weight",                                                 "copy"),
    ("ln_1.bias",          "self_attn_norm.bias",                                                   "copy"),
    ("attn.c_attn.weight", ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"), "split3_T"),  # noqa: E501
    ("attn.c_attn.bias",   ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),       "split3"),
    ("attn.c_proj.weight", "self_attn.o_proj.weight",                                               "T"),
    ("attn.c_proj.bias",   "self_attn.o_proj.bias",                                                 "copy"),
    ("ln_2.weight",        "mlp_norm.weight",                                                       "copy"),
    ("ln_2.bias",          "mlp_norm.bias",                                                         "copy"),
    ("mlp.c_fc.weight",    "mlp.up_proj.weight",                                                    "T"),
    ("mlp.c_fc.bias",      "mlp.up_proj.bias",                                                      "copy"),
    ("mlp.c_proj.weight",  "mlp.down_proj.weight",                                                  "T"),
    ("mlp.c_proj.bias",    "mlp.down_proj.bias",                                                    "copy"),
)  # fmt: skip

# Buffers of old GPT-2 checkpoints (the causal mask), not weights; dropped when reading a state dict.
_LEGACY_GPT2_BUFFERS = re.compile(r"h\.\d+\.attn\.(bias|masked_bias)")


# ------------------------------------------------------------------------------------------------ configs


def hfzoo_config_from_gpt2(gpt2_config: GPT2Config) -> HfzooDecoderConfig:
    """Build the `HfzooDecoderConfig` describing the same network as a `GPT2Config`.

    Mapped fields: `vocab_size`, `n_embd` -> `hidden_size`, `n_layer` -> `num_hidden_layers`,
    `n_head` -> `num_attention_heads`, `n_inner` (None: `4 * n_embd`) -> `intermediate_size`,
    `activation_function` -> `hidden_act`, `n_positions` -> `max_position_embeddings`,
    `layer_norm_epsilon` -> `layer_norm_eps`, `resid_pdrop` (= `embd_pdrop`) -> `hidden_dropout_prob`,
    `attn_pdrop` -> `attention_probs_dropout_prob`, `initializer_range`, `tie_word_embeddings`,
    `use_cache` and the special token ids. The architecture choices are fixed to GPT-2's: pre-LN
    layer norm, learned positions, biases in every projection, no dropout on the feed-forward hidden
    layer (`activation_dropout=0.0`). `reorder_and_upcast_attn` is accepted and dropped (it changes
    only the precision of eager attention; hfzoo's eager softmax is float32).

    Args:
        gpt2_config: the GPT-2 config.

    Returns:
        A validated `HfzooDecoderConfig`.

    Raises:
        TypeError: `gpt2_config` is not a `GPT2Config`.
        ValueError: a GPT-2 setting hfzoo's decoder cannot express (message names the field):
            `add_cross_attention=True`, `scale_attn_weights=False`,
            `scale_attn_by_inverse_layer_idx=True`, `embd_pdrop != resid_pdrop`, an
            `activation_function` unknown to `ACT2FN`; or a config that fails hfzoo's validation
            (e.g. `bos_token_id` outside the vocabulary).
    """
    if not isinstance(gpt2_config, GPT2Config):
        raise TypeError(f"expected a GPT2Config, got {type(gpt2_config).__name__}")
    c = gpt2_config
    if c.add_cross_attention:
        raise ValueError("add_cross_attention=True: hfzoo's decoder has no cross-attention layers")
    if not c.scale_attn_weights:
        raise ValueError("scale_attn_weights=False: hfzoo always scales attention scores by head_dim**-0.5")
    if c.scale_attn_by_inverse_layer_idx:
        raise ValueError(
            "scale_attn_by_inverse_layer_idx=True: hfzoo has no per-layer attention scaling 1 / (layer_idx + 1)"
        )
    if c.embd_pdrop != c.resid_pdrop:
        raise ValueError(
            f"embd_pdrop={c.embd_pdrop} differs from resid_pdrop={c.resid_pdrop}: hfzoo has one "
            "hidden_dropout_prob for embeddings and residual branches; set them equal"
        )
    if c.activation_function not in ACT2FN:
        raise ValueError(f"activation_function={c.activation_function!r} is not a key of transformers' ACT2FN")
    fields = dict(
        vocab_size=c.vocab_size,
        hidden_size=c.n_embd,
        num_hidden_layers=c.n_layer,
        num_attention_heads=c.n_head,
        intermediate_size=c.n_inner if c.n_inner is not None else 4 * c.n_embd,
        hidden_act=c.activation_function,
        max_position_embeddings=c.n_positions,
        position_embedding_type="learned",
        norm_type="layer_norm",
        norm_position="pre",
        layer_norm_eps=c.layer_norm_epsilon,
        attention_bias=True,
        mlp_bias=True,
        hidden_dropout_prob=c.resid_pdrop,
        attention_probs_dropout_prob=c.attn_pdrop,
        activation_dropout=0.0,
        initializer_range=c.initializer_range,
        tie_word_embeddings=c.tie_word_embeddings,
        use_cache=c.use_cache,
        pad_token_id=c.pad_token_id,
        bos_token_id=c.bos_token_id,
        eos_token_id=c.eos_token_id,
    )
    try:
        return HfzooDecoderConfig(**fields)
    except (StrictDataclassError, TypeError, ValueError) as err:
        cause = err.__cause__ if err.__cause__ is not None else err
        raise ValueError(f"GPT-2 config cannot be expressed as an hfzoo decoder config: {cause}") from err


def gpt2_config_from_hfzoo(config: HfzooDecoderConfig) -> GPT2Config:
    """Build the `GPT2Config` describing the same network as an `HfzooDecoderConfig`.

    The inverse of `hfzoo_config_from_gpt2` on the fields it maps (`n_inner` is None when
    `intermediate_size == 4 * hidden_size`, as in GPT-2's own configs; `embd_pdrop` and `resid_pdrop`
    are both `hidden_dropout_prob`).

    Args:
        config: an hfzoo decoder config.

    Returns:
        A `GPT2Config` (`scale_attn_weights=True`, no cross-attention).

    Raises:
        TypeError: `config` is not an `HfzooDecoderConfig` (encoders are bidirectional, not GPT-2).
        ValueError: an hfzoo setting GPT-2 cannot express (message names the field):
            `norm_position` other than `"pre"`, `norm_type` other than `"layer_norm"`,
            `position_embedding_type` other than `"learned"`, `head_dim != hidden_size //
            num_attention_heads`, `attention_bias=False` or `mlp_bias=False` (GPT-2's `Conv1D`
            always has a bias), `gated_mlp`, `rezero`, `fixup_init` or `num_experts > 0`, or a
            `hidden_act` unknown to `ACT2FN`.
    """
    if not isinstance(config, HfzooDecoderConfig):
        raise TypeError(f"expected an HfzooDecoderConfig, got {type(config).__name__}")
    required = {
        "norm_position": ("pre", "GPT-2 is pre-LN (norm before each sub-block, final ln_f)"),
        "norm_type": ("layer_norm", "GPT-2 uses nn.LayerNorm"),
        "position_embedding_type": ("learned", "GPT-2 has learned absolute positions (wpe)"),
        "attention_bias": (True, "GPT-2's Conv1D projections always have a bias"),
        "mlp_bias": (True, "GPT-2's Conv1D projections always have a bias"),
        "gated_mlp": (False, "GPT-2's MLP has no gate projection"),
        "rezero": (False, "GPT-2 has no residual scalars"),
        "fixup_init": (False, "GPT-2 has no residual scalars"),
        "num_experts": (0, "GPT-2's MLP is dense"),
    }
    for name, (value, why) in required.items():
        if getattr(config, name) != value:
            raise ValueError(f"{name}={getattr(config, name)!r} cannot be converted to GPT-2 ({why}; needs {value!r})")
    if config.hidden_size % config.num_attention_heads or config.head_dim != (
        config.hidden_size // config.num_attention_heads
    ):
        raise ValueError(
            f"head_dim={config.head_dim} cannot be converted to GPT-2, whose head size is "
            f"hidden_size // num_attention_heads = {config.hidden_size} // {config.num_attention_heads}"
        )
    if config.hidden_act not in ACT2FN:
        raise ValueError(f"hidden_act={config.hidden_act!r} is not a key of transformers' ACT2FN")
    if getattr(config, "type_vocab_size", 0):
        raise ValueError(f"type_vocab_size={config.type_vocab_size}: GPT-2 has no token-type embeddings")
    return GPT2Config(
        vocab_size=config.vocab_size,
        n_positions=config.max_position_embeddings,
        n_embd=config.hidden_size,
        n_layer=config.num_hidden_layers,
        n_head=config.num_attention_heads,
        n_inner=None if config.intermediate_size == 4 * config.hidden_size else config.intermediate_size,
        activation_function=config.hidden_act,
        resid_pdrop=config.hidden_dropout_prob,
        embd_pdrop=config.hidden_dropout_prob,
        attn_pdrop=config.attention_probs_dropout_prob,
        layer_norm_epsilon=config.layer_norm_eps,
        initializer_range=config.initializer_range,
        scale_attn_weights=True,
        use_cache=config.use_cache,
        tie_word_embeddings=config.tie_word_embeddings,
        pad_token_id=config.pad_token_id,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
    )


# ------------------------------------------------------------------------------------------------ weights


def _check_keys(given: set[str], expected: set[str], what: str) -> None:
    missing, unexpected = sorted(expected - given), sorted(given - expected)
    if missing or unexpected:
        raise ValueError(f"{what} state dict does not match its config: missing {missing}, unexpected {unexpected}")


def _gpt2_state_dict_to_hfzoo(state: Mapping[str, torch.Tensor], config: HfzooDecoderConfig) -> dict[str, torch.Tensor]:
    """Map a GPT-2 state dict (keys without `transformer.`) to hfzoo keys and layouts (see the tables)."""
    hidden = config.hidden_size
    out = {}
    for gpt2_key, hfzoo_key, _op in GPT2_TO_HFZOO_GLOBAL:
        out[hfzoo_key] = state[gpt2_key]
    for i in range(config.num_hidden_layers):
        for gpt2_key, hfzoo_key, op in GPT2_TO_HFZOO_LAYER:
            tensor = state[f"h.{i}.{gpt2_key}"]
            if op.startswith("split3"):
                parts = tensor.split(hidden, dim=-1)  # (..., 3 * hidden) -> 3 x (..., hidden)
                for key, part in zip(hfzoo_key, parts):
                    out[f"model.layers.{i}.{key}"] = part.t().contiguous() if op == "split3_T" else part.contiguous()
            else:
                out[f"model.layers.{i}.{hfzoo_key}"] = tensor.t().contiguous() if op == "T" else tensor
    return out


def _hfzoo_state_dict_to_gpt2(state: Mapping[str, torch.Tensor], config: HfzooDecoderConfig) -> dict[str, torch.Tensor]:
    """Map an hfzoo decoder state dict to GPT2LMHeadModel keys (with `transformer.`) and Conv1D layouts."""
    out = {}
    for gpt2_key, hfzoo_key, _op in GPT2_TO_HFZOO_GLOBAL:
        out[gpt2_key if gpt2_key == "lm_head.weight" else f"transformer.{gpt2_key}"] = state[hfzoo_key]
    for i in range(config.num_hidden_layers):
        for gpt2_key, hfzoo_key, op in GPT2_TO_HFZOO_LAYER:
            if op.startswith("split3"):
                parts = [state[f"model.layers.{i}.{key}"] for key in hfzoo_key]
                if op == "split3_T":
                    parts = [p.t() for p in parts]  # 3 x (out, in) -> 3 x (in, out)
                tensor = torch.cat(parts, dim=-1)  # (..., 3 * hidden), columns [q | k | v]
            else:
                tensor = state[f"model.layers.{i}.{hfzoo_key}"]
                tensor = tensor.t().contiguous() if op == "T" else tensor
            out[f"transformer.h.{i}.{gpt2_key}"] = tensor
    return out


def _expected_gpt2_keys(num_layers: int) -> set[str]:
    keys = {g for g, _, _ in GPT2_TO_HFZOO_GLOBAL}
    return keys | {f"h.{i}.{g}" for i in range(num_layers) for g, _, _ in GPT2_TO_HFZOO_LAYER}


def _resolve_tied_head(
    state: dict[str, torch.Tensor], tied: bool, embed_key: str, head_key: str, what: str
) -> dict[str, torch.Tensor]:
    """Fill in a tied head missing from `state`; refuse a tied head that differs from the embeddings."""
    if head_key not in state:
        if not tied:
            raise ValueError(f"{what} state dict has no {head_key!r} and the config has tie_word_embeddings=False")
        state[head_key] = state[embed_key]
    elif tied and not torch.equal(state[head_key], state[embed_key]):
        raise ValueError(f"tie_word_embeddings=True but {what} {head_key!r} differs from {embed_key!r}")
    return state


def _load(model: torch.nn.Module, state: dict[str, torch.Tensor], attn_implementation: str | None) -> torch.nn.Module:
    reference = state[next(iter(state))]
    model.to(device=reference.device, dtype=reference.dtype)
    model.load_state_dict(state, strict=True)
    if attn_implementation is not None:
        model.set_attn_implementation(attn_implementation)
    return model.eval()


def gpt2_to_hfzoo(
    gpt2_model_or_state_dict: GPT2LMHeadModel | GPT2Model | Mapping[str, torch.Tensor],
    config: GPT2Config | HfzooDecoderConfig | None = None,
    *,
    attn_implementation: str | None = None,
) -> HfzooDecoderForCausalLM:
    """Convert a GPT-2 model (or its state dict) to an `HfzooDecoderForCausalLM` computing the same logits.

    Weights are re-laid out per `GPT2_TO_HFZOO_GLOBAL` / `GPT2_TO_HFZOO_LAYER`: `c_attn`
    `(hidden, 3 * hidden)` is split into `q_proj`, `k_proj`, `v_proj` `(hidden, hidden)` each (transposed),
    the other `Conv1D` weights `(in, out)` are transposed to `nn.Linear`'s `(out, in)`. A `GPT2Model`
    (or a state dict without `lm_head.weight`, as in the original OpenAI checkpoints) is accepted when
    the embeddings are tied. The result has the source's dtype and device and is in eval mode.

    Args:
        gpt2_model_or_state_dict: a `GPT2LMHeadModel`, a `GPT2Model`, or a state dict of either
            (keys with or without the `transformer.` prefix; legacy `attn.bias` mask buffers are ignored).
        config: required with a state dict (ignored for a model, whose config is used): a
            `GPT2Config`, or an `HfzooDecoderConfig` that GPT-2 can express.
        attn_implementation: attention backend of the result ("eager", "sdpa", ...); default: the
            source model's backend (a model), hfzoo's default (a state dict).

    Returns:
        The `HfzooDecoderForCausalLM`.

    Raises:
        TypeError: a state dict without `config`, or an unsupported input type.
        ValueError: a config hfzoo cannot express (see `hfzoo_config_from_gpt2`); state-dict keys that
            do not match the config (missing / unexpected keys listed); a tied config whose
            `lm_head.weight` differs from `wte.weight`.
    """
    source = gpt2_model_or_state_dict
    if isinstance(source, (GPT2LMHeadModel, GPT2Model)):
        config = source.config
        state = source.state_dict()
        if attn_implementation is None:
            attn_implementation = source.config._attn_implementation
    elif isinstance(source, Mapping):
        if config is None:
            raise TypeError("gpt2_to_hfzoo: a state dict needs its config (GPT2Config or HfzooDecoderConfig)")
        state = source
    else:
        raise TypeError(f"expected a GPT2LMHeadModel, GPT2Model or state dict, got {type(source).__name__}")
    if isinstance(config, GPT2Config):
        hfzoo_config = hfzoo_config_from_gpt2(config)
    else:
        gpt2_config_from_hfzoo(config)  # raises if GPT-2 cannot express it
        hfzoo_config = config
    state = {key.removeprefix("transformer."): value for key, value in state.items()}
    state = {key: value for key, value in state.items() if not _LEGACY_GPT2_BUFFERS.fullmatch(key)}
    state = _resolve_tied_head(state, hfzoo_config.tie_word_embeddings, "wte.weight", "lm_head.weight", "GPT-2")
    _check_keys(set(state), _expected_gpt2_keys(hfzoo_config.num_hidden_layers), "GPT-2")
    model = HfzooDecoderForCausalLM(hfzoo_config)
    return _load(model, _gpt2_state_dict_to_hfzoo(state, hfzoo_config), attn_implementation)


def hfzoo_to_gpt2(
    model_or_state_dict: HfzooDecoderForCausalLM | Mapping[str, torch.Tensor],
    config: HfzooDecoderConfig | None = None,
    *,
    attn_implementation: str | None = None,
) -> GPT2LMHeadModel:
    """Convert an `HfzooDecoderForCausalLM` (or its state dict) to a `GPT2LMHeadModel` computing the same logits.

    The inverse of `gpt2_to_hfzoo`: `q_proj`, `k_proj`, `v_proj` `(hidden, hidden)` are transposed and
    concatenated into `c_attn` `(hidden, 3 * hidden)`, the other `nn.Linear` weights `(out, in)` are
    transposed to `Conv1D`'s `(in, out)`. The result has the source's dtype and device, eval mode.

    Args:
        model_or_state_dict: an `HfzooDecoderForCausalLM` or its state dict.
        config: required with a state dict (ignored for a model): the `HfzooDecoderConfig`.
        attn_implementation: attention backend of the result; default: the source model's backend
            (a model), transformers' default (a state dict).

    Returns:
        The `GPT2LMHeadModel`.

    Raises:
        TypeError: a state dict without `config`, or an unsupported input type / config type.
        ValueError: a config GPT-2 cannot express (see `gpt2_config_from_hfzoo`); state-dict keys that
            do not match the config; a tied config whose `lm_head.weight` differs from the embeddings.
    """
    source = model_or_state_dict
    if isinstance(source, HfzooDecoderForCausalLM):
        config = source.config
        state = source.state_dict()
        if attn_implementation is None:
            attn_implementation = source.config._attn_implementation
    elif isinstance(source, Mapping):
        if config is None:
            raise TypeError("hfzoo_to_gpt2: a state dict needs its HfzooDecoderConfig")
        state = dict(source)
    else:
        raise TypeError(f"expected an HfzooDecoderForCausalLM or state dict, got {type(source).__name__}")
    gpt2_config = gpt2_config_from_hfzoo(config)
    state = _resolve_tied_head(
        state, config.tie_word_embeddings, "model.embed_tokens.weight", "lm_head.weight", "hfzoo"
    )
    expected = {h for _, h, _ in GPT2_TO_HFZOO_GLOBAL} | {
        f"model.layers.{i}.{key}"
        for i in range(config.num_hidden_layers)
        for _, h, _ in GPT2_TO_HFZOO_LAYER
        for key in (h if isinstance(h, tuple) else (h,))
    }
    _check_keys(set(state), expected, "hfzoo")
    model = GPT2LMHeadModel(gpt2_config)
    return _load(model, _hfzoo_state_dict_to_gpt2(state, config), attn_implementation)


# ================================================================================================== T5
# T5 (Raffel et al. 2020) <-> the hfzoo encoder-decoder (`HfzooEncoderDecoderForConditionalGeneration`).
#
# T5 is a pre-norm encoder-decoder with RMSNorm without bias (epsilon 1e-6), no biases anywhere, unscaled
# attention scores, a bucketed relative attention bias stored in layer 0 of each stack and shared by its
# layers, one embedding matrix for encoder and decoder inputs, and either (v1.0) a ReLU feed-forward and an
# output layer tied to the embeddings whose input is scaled by d_model ** -0.5, or (v1.1) a GeGLU feed-forward
# ("gated-gelu": gelu_new) and an untied output layer without scaling. In hfzoo fields:
#   position_embedding_type="relative_attention_bias", share_relative_attention_bias=True,
#   norm_type="rms_norm", norm_position="pre", attention_bias=mlp_bias=False, scale_attention_scores=False,
#   gated_mlp (v1.1), hidden_act, tie_word_embeddings + scale_lm_head_input (v1.0: both True; v1.1: both False).
# The weights differ only in their names, so both directions are renames and round trips are exact.
# ==================================================================================================


T5_TO_HFZOO_GLOBAL: tuple[tuple[str, str], ...] = (
    # T5 key                                                            hfzoo key
    ("shared.weight",                                                   "model.shared.weight"),
    ("encoder.embed_tokens.weight",                                     "model.encoder.embed_tokens.weight"),
    ("decoder.embed_tokens.weight",                                     "model.decoder.embed_tokens.weight"),
    ("encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", "model.encoder.relative_attention_bias.weight"),  # noqa: E501
    ("decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight", "model.decoder.relative_attention_bias.weight"),  # noqa: E501
    ("encoder.final_layer_norm.weight",                                 "model.encoder.norm.weight"),
    ("decoder.final_layer_norm.weight",                                 "model.decoder.norm.weight"),
    ("lm_head.weight",                                                  "lm_head.weight"),
)  # fmt: skip

_T5_ATTENTION = (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("o", "o_proj"))

# Per layer: T5 key (after `{stack}.block.{i}.`) -> hfzoo key (after `model.{stack}.layers.{i}.`).
T5_TO_HFZOO_ENCODER_LAYER: tuple[tuple[str, str], ...] = (
    *[(f"layer.0.SelfAttention.{t5}.weight", f"self_attn.{ours}.weight") for t5, ours in _T5_ATTENTION],
    ("layer.0.layer_norm.weight", "self_attn_norm.weight"),
    ("layer.1.layer_norm.weight", "mlp_norm.weight"),
)
T5_TO_HFZOO_DECODER_LAYER: tuple[tuple[str, str], ...] = (
    *[(f"layer.0.SelfAttention.{t5}.weight", f"self_attn.{ours}.weight") for t5, ours in _T5_ATTENTION],
    ("layer.0.layer_norm.weight", "self_attn_norm.weight"),
    *[(f"layer.1.EncDecAttention.{t5}.weight", f"cross_attn.{ours}.weight") for t5, ours in _T5_ATTENTION],
    ("layer.1.layer_norm.weight", "cross_attn_norm.weight"),
    ("layer.2.layer_norm.weight", "mlp_norm.weight"),
)
# The feed-forward (`layer.1` in the encoder, `layer.2` in the decoder): T5's `DenseReluDense` names.
T5_TO_HFZOO_MLP = {
    False: (("wi.weight", "up_proj.weight"), ("wo.weight", "down_proj.weight")),
    True: (("wi_0.weight", "gate_proj.weight"), ("wi_1.weight", "up_proj.weight"), ("wo.weight", "down_proj.weight")),
}

# Stored by some old T5 checkpoints, never used (transformers ignores it too).
_LEGACY_T5_KEYS = re.compile(r"decoder\.block\.0\.layer\.1\.EncDecAttention\.relative_attention_bias\.weight")

# hfzoo fields T5 fixes, with the value T5 needs and why. Fields from other parts of hfzoo are read with
# `getattr(config, name, value)`, so this table also holds for configs that predate them.
_T5_REQUIRED = {
    "position_embedding_type": ("relative_attention_bias", "T5 has a bucketed relative attention bias"),
    "share_relative_attention_bias": (True, "T5 stores one bias per stack, in layer 0, shared by all layers"),
    "norm_type": ("rms_norm", "T5LayerNorm is an RMSNorm without bias"),
    "norm_position": ("pre", "T5 normalizes before each sub-block and has a final norm"),
    "attention_bias": (False, "T5's projections have no bias"),
    "mlp_bias": (False, "T5's projections have no bias"),
    "scale_attention_scores": (False, "T5 does not scale the attention scores"),
    "embedding_norm": (False, "T5 has no norm on the embeddings"),
    "embedding_size": (None, "T5's embeddings are not factorized"),
    "scale_embeddings": (False, "T5 does not scale the token embeddings"),
    "tie_encoder_decoder_embeddings": (True, "T5's encoder and decoder read one embedding matrix"),
    "block_sharing": ("none", "T5 has no block sharing"),
    "num_softmaxes": (1, "T5 has a single softmax"),
    "num_experts": (0, "T5's feed-forward is dense"),
    "rezero": (False, "T5 has no ReZero scalars"),
}


def _t5_key_map(config: HfzooEncoderDecoderConfig) -> dict[str, str]:
    """`{T5 key: hfzoo key}` for every weight of a T5 model with this config (tied copies included)."""
    mapping = dict(T5_TO_HFZOO_GLOBAL)
    mlp = T5_TO_HFZOO_MLP[config.gated_mlp]
    for stack, num_layers, layer_table, mlp_index in (
        ("encoder", config.num_hidden_layers, T5_TO_HFZOO_ENCODER_LAYER, 1),
        ("decoder", config.num_decoder_layers, T5_TO_HFZOO_DECODER_LAYER, 2),
    ):
        for i in range(num_layers):
            for t5_key, hfzoo_key in layer_table:
                mapping[f"{stack}.block.{i}.{t5_key}"] = f"model.{stack}.layers.{i}.{hfzoo_key}"
            for t5_key, hfzoo_key in mlp:
                mapping[f"{stack}.block.{i}.layer.{mlp_index}.DenseReluDense.{t5_key}"] = (
                    f"model.{stack}.layers.{i}.mlp.{hfzoo_key}"
                )
    return mapping


def hfzoo_config_from_t5(t5_config: T5Config, tie_word_embeddings: bool | None = None) -> HfzooEncoderDecoderConfig:
    """Build the `HfzooEncoderDecoderConfig` describing the same network as a `T5Config`.

    Mapped fields: `vocab_size`, `d_model` -> `hidden_size`, `num_layers` -> `num_hidden_layers`,
    `num_decoder_layers`, `num_heads` -> `num_attention_heads`, `d_kv` -> `head_dim`, `d_ff` ->
    `intermediate_size`, `feed_forward_proj` -> `hidden_act` + `gated_mlp` ("gated-gelu" is gated
    `gelu_new`), `relative_attention_num_buckets`, `relative_attention_max_distance`, `dropout_rate` ->
    `hidden_dropout_prob` and `attention_probs_dropout_prob`, `layer_norm_epsilon` -> `rms_norm_eps`,
    `scale_decoder_outputs` -> `scale_lm_head_input`, `classifier_dropout`, `use_cache` and the special
    token ids (`decoder_start_token_id`, when the config has none, is `pad_token_id`, as in T5's
    checkpoints). The architecture is fixed to T5's (see the section comment). `initializer_factor` is
    not mapped (hfzoo initialises with `initializer_range`); training-only difference: T5 also applies
    dropout after each stack's final norm.

    Args:
        t5_config: the T5 config.
        tie_word_embeddings: whether `lm_head` shares the embedding matrix. transformers 5 always builds
            T5 with a tied `lm_head` (untying only when a checkpoint holds a different one), so the
            config does not say; default: tied exactly when `scale_decoder_outputs` (T5 v1.0), untied
            otherwise (v1.1). `t5_to_hfzoo` passes what the model's weights show.

    Returns:
        A validated `HfzooEncoderDecoderConfig`.

    Raises:
        TypeError: `t5_config` is not a `T5Config`.
        ValueError: a T5 setting hfzoo cannot express, or a config failing hfzoo's validation.
    """
    if not isinstance(t5_config, T5Config):
        raise TypeError(f"expected a T5Config, got {type(t5_config).__name__}")
    c = t5_config
    if c.dense_act_fn not in ACT2FN:
        raise ValueError(f"feed_forward_proj={c.feed_forward_proj!r}: activation {c.dense_act_fn!r} is not in ACT2FN")
    scale = bool(getattr(c, "scale_decoder_outputs", True))
    start = getattr(c, "decoder_start_token_id", None)
    fields = dict(
        vocab_size=c.vocab_size,
        hidden_size=c.d_model,
        num_hidden_layers=c.num_layers,
        num_decoder_layers=c.num_decoder_layers,
        num_attention_heads=c.num_heads,
        head_dim=c.d_kv,
        intermediate_size=c.d_ff,
        hidden_act=c.dense_act_fn,
        gated_mlp=c.is_gated_act,
        position_embedding_type="relative_attention_bias",
        relative_attention_num_buckets=c.relative_attention_num_buckets,
        relative_attention_max_distance=c.relative_attention_max_distance,
        share_relative_attention_bias=True,
        norm_type="rms_norm",
        norm_position="pre",
        rms_norm_eps=c.layer_norm_epsilon,
        attention_bias=False,
        mlp_bias=False,
        scale_attention_scores=False,
        scale_lm_head_input=scale,
        tie_word_embeddings=scale if tie_word_embeddings is None else tie_word_embeddings,
        hidden_dropout_prob=c.dropout_rate,
        attention_probs_dropout_prob=c.dropout_rate,
        classifier_dropout=c.classifier_dropout,
        use_cache=c.use_cache,
        pad_token_id=c.pad_token_id,
        eos_token_id=c.eos_token_id,
        decoder_start_token_id=start if start is not None else c.pad_token_id,
    )
    try:
        return HfzooEncoderDecoderConfig(**fields)
    except (StrictDataclassError, TypeError, ValueError) as err:
        cause = err.__cause__ if err.__cause__ is not None else err
        raise ValueError(f"T5 config cannot be expressed as an hfzoo encoder-decoder config: {cause}") from err


def t5_config_from_hfzoo(config: HfzooEncoderDecoderConfig) -> T5Config:
    """Build the `T5Config` describing the same network as an `HfzooEncoderDecoderConfig`.

    The inverse of `hfzoo_config_from_t5` on the fields it maps; `scale_lm_head_input` becomes
    `scale_decoder_outputs`, and `feed_forward_proj` is `"gated-gelu"` for gated `gelu_new`,
    `"gated-{act}"` / `"{act}"` otherwise. (Whether `lm_head` is tied is not part of a transformers 5
    `T5Config`; `hfzoo_to_t5` unties the built model when needed.)

    Args:
        config: an hfzoo encoder-decoder config.

    Returns:
        A `T5Config`.

    Raises:
        TypeError: `config` is not an `HfzooEncoderDecoderConfig`.
        ValueError: an hfzoo setting T5 cannot express (message names the field): see `_T5_REQUIRED`;
            `hidden_dropout_prob != attention_probs_dropout_prob` (T5 has one `dropout_rate`).
    """
    if not isinstance(config, HfzooEncoderDecoderConfig):
        raise TypeError(f"expected an HfzooEncoderDecoderConfig, got {type(config).__name__}")
    for name, (value, why) in _T5_REQUIRED.items():
        if getattr(config, name, value) != value:
            raise ValueError(f"{name}={getattr(config, name)!r} cannot be converted to T5 ({why}; needs {value!r})")
    if config.hidden_dropout_prob != config.attention_probs_dropout_prob:
        raise ValueError(
            f"attention_probs_dropout_prob={config.attention_probs_dropout_prob} differs from hidden_dropout_prob="
            f"{config.hidden_dropout_prob}: T5 has one dropout_rate; set them equal"
        )
    if config.hidden_act not in ACT2FN:
        raise ValueError(f"hidden_act={config.hidden_act!r} is not a key of transformers' ACT2FN")
    if config.gated_mlp:
        feed_forward_proj = "gated-gelu" if config.hidden_act == "gelu_new" else f"gated-{config.hidden_act}"
    else:
        feed_forward_proj = config.hidden_act
    t5_config = T5Config(
        vocab_size=config.vocab_size,
        d_model=config.hidden_size,
        d_kv=config.head_dim,
        d_ff=config.intermediate_size,
        num_layers=config.num_hidden_layers,
        num_decoder_layers=config.num_decoder_layers,
        num_heads=config.num_attention_heads,
        relative_attention_num_buckets=config.relative_attention_num_buckets,
        relative_attention_max_distance=config.relative_attention_max_distance,
        dropout_rate=config.hidden_dropout_prob,
        layer_norm_epsilon=config.rms_norm_eps,
        feed_forward_proj=feed_forward_proj,
        classifier_dropout=config.classifier_dropout if config.classifier_dropout is not None else 0.0,
        use_cache=config.use_cache,
        pad_token_id=config.pad_token_id,
        eos_token_id=config.eos_token_id,
        decoder_start_token_id=config.decoder_start_token_id,
        scale_decoder_outputs=config.scale_lm_head_input,
    )
    if t5_config.dense_act_fn != config.hidden_act:  # "gated-gelu" maps to gelu_new; refuse other gelu spellings
        raise ValueError(f"hidden_act={config.hidden_act!r} with gated_mlp=True cannot be converted to T5")
    return t5_config


def _t5_tied(state: Mapping[str, torch.Tensor]) -> bool:
    return "lm_head.weight" not in state or torch.equal(state["lm_head.weight"], state["shared.weight"])


def t5_to_hfzoo(
    t5_model_or_state_dict: T5ForConditionalGeneration | Mapping[str, torch.Tensor],
    config: T5Config | HfzooEncoderDecoderConfig | None = None,
    *,
    attn_implementation: str | None = None,
) -> HfzooEncoderDecoderForConditionalGeneration:
    """Convert a T5 model (or its state dict) to an `HfzooEncoderDecoderForConditionalGeneration` with the same logits.

    Every weight keeps its values under a new name (`T5_TO_HFZOO_*` tables). The `lm_head` is tied in
    the result when the source's `lm_head.weight` is missing or equal to `shared.weight`. The result
    has the source's dtype and device and is in eval mode.

    Args:
        t5_model_or_state_dict: a `T5ForConditionalGeneration` or its state dict (tied copies
            `encoder.embed_tokens.weight`, `decoder.embed_tokens.weight`, `lm_head.weight` may be missing).
        config: required with a state dict (ignored for a model): a `T5Config` or an
            `HfzooEncoderDecoderConfig` that T5 can express.
        attn_implementation: attention backend of the result ("eager" or "sdpa"); default: the source
            model's backend (a model), hfzoo's default (a state dict).

    Returns:
        The `HfzooEncoderDecoderForConditionalGeneration`.

    Raises:
        TypeError: a state dict without `config`, or an unsupported input type.
        ValueError: a config one side cannot express; keys that do not match the config (listed); a tied
            config whose `lm_head.weight` differs from `shared.weight`.
    """
    source = t5_model_or_state_dict
    if isinstance(source, T5ForConditionalGeneration):
        config, state = source.config, dict(source.state_dict())
        if attn_implementation is None:
            attn_implementation = source.config._attn_implementation
    elif isinstance(source, Mapping):
        if config is None:
            raise TypeError("t5_to_hfzoo: a state dict needs its config (T5Config or HfzooEncoderDecoderConfig)")
        state = dict(source)
    else:
        raise TypeError(f"expected a T5ForConditionalGeneration or state dict, got {type(source).__name__}")
    state = {key: value for key, value in state.items() if not _LEGACY_T5_KEYS.fullmatch(key)}
    if "shared.weight" not in state:
        raise ValueError("T5 state dict has no 'shared.weight'")
    if isinstance(config, T5Config):
        hfzoo_config = hfzoo_config_from_t5(config, tie_word_embeddings=_t5_tied(state))
    else:
        t5_config_from_hfzoo(config)  # raises if T5 cannot express it
        hfzoo_config = config
    for key in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
        state.setdefault(key, state["shared.weight"])
    state = _resolve_tied_head(state, hfzoo_config.tie_word_embeddings, "shared.weight", "lm_head.weight", "T5")
    mapping = _t5_key_map(hfzoo_config)
    _check_keys(set(state), set(mapping), "T5")
    model = HfzooEncoderDecoderForConditionalGeneration(hfzoo_config)
    return _load(model, {mapping[key]: value for key, value in state.items()}, attn_implementation)


def hfzoo_to_t5(
    model_or_state_dict: HfzooEncoderDecoderForConditionalGeneration | Mapping[str, torch.Tensor],
    config: HfzooEncoderDecoderConfig | None = None,
    *,
    attn_implementation: str | None = None,
) -> T5ForConditionalGeneration:
    """Convert an `HfzooEncoderDecoderForConditionalGeneration` (or its state dict) to a `T5ForConditionalGeneration`.

    The inverse of `t5_to_hfzoo`: weights are renamed; with `tie_word_embeddings=False` the T5 model's
    `lm_head` is untied from `shared` (transformers 5 builds T5 tied). The result has the source's dtype
    and device and is in eval mode.

    Args:
        model_or_state_dict: the hfzoo model or its state dict.
        config: required with a state dict (ignored for a model): the `HfzooEncoderDecoderConfig`.
        attn_implementation: attention backend of the result; default: the source model's backend (a
            model), transformers' default (a state dict).

    Returns:
        The `T5ForConditionalGeneration`.

    Raises:
        TypeError: a state dict without `config`, or an unsupported input / config type.
        ValueError: a config T5 cannot express (see `t5_config_from_hfzoo`); keys that do not match the
            config; a tied config whose `lm_head.weight` differs from the embeddings.
    """
    source = model_or_state_dict
    if isinstance(source, HfzooEncoderDecoderForConditionalGeneration):
        config, state = source.config, dict(source.state_dict())
        if attn_implementation is None:
            attn_implementation = source.config._attn_implementation
    elif isinstance(source, Mapping):
        if config is None:
            raise TypeError("hfzoo_to_t5: a state dict needs its HfzooEncoderDecoderConfig")
        state = dict(source)
    else:
        raise TypeError(
            f"expected an HfzooEncoderDecoderForConditionalGeneration or state dict, got {type(source).__name__}"
        )
    t5_config = t5_config_from_hfzoo(config)
    for key in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"):
        state.setdefault(key, state["model.shared.weight"])
    state = _resolve_tied_head(state, config.tie_word_embeddings, "model.shared.weight", "lm_head.weight", "hfzoo")
    inverse = {hfzoo_key: t5_key for t5_key, hfzoo_key in _t5_key_map(config).items()}
    _check_keys(set(state), set(inverse), "hfzoo")
    model = T5ForConditionalGeneration(t5_config)
    if not config.tie_word_embeddings:
        model.lm_head.weight = torch.nn.Parameter(torch.empty_like(model.lm_head.weight))
        model.all_tied_weights_keys.pop("lm_head.weight", None)  # save_pretrained must keep it
    return _load(model, {inverse[key]: value for key, value in state.items()}, attn_implementation)


# ==================================================================================================
# BERT <-> hfzoo encoder
#
# BERT (Devlin et al. 2019) is a post-LN encoder with learned absolute positions, token-type (segment)
# embeddings, a LayerNorm over the summed embeddings, biases everywhere, exact GELU and eps 1e-12:
# `HfzooEncoderConfig` with `norm_position="post"`, `embedding_norm=True`, `position_embedding_type="learned"`.
# Only the key names differ; every tensor is copied unchanged (nn.Linear on both sides). The heads:
#   BertForMaskedLM's `cls.predictions` (transform dense + act + LayerNorm, decoder + bias) = hfzoo's `lm_head`;
#   BertForSequenceClassification's `bert.pooler.dense` (+ tanh) and `classifier` = hfzoo's
#   `classifier.dense` and `classifier.out_proj` (`SequenceClassificationHead`).
# BERT keys are given without the `bert.` prefix of BertForMaskedLM / BertForSequenceClassification.
# ==================================================================================================

BERT_TO_HFZOO_GLOBAL: tuple[tuple[str, str], ...] = (
    # BERT key                                 hfzoo key (without the `model.` prefix)
    ("embeddings.word_embeddings.weight",       "embed_tokens.weight"),
    ("embeddings.position_embeddings.weight",   "embed_positions.weight"),
    ("embeddings.token_type_embeddings.weight", "token_type_embeddings.weight"),
    ("embeddings.LayerNorm.weight",             "embed_norm.weight"),
    ("embeddings.LayerNorm.bias",               "embed_norm.bias"),
)  # fmt: skip

BERT_TO_HFZOO_LAYER: tuple[tuple[str, str], ...] = (
    # BERT key (encoder.layer.{i}.)    hfzoo key (layers.{i}.)
    ("attention.self.query.weight",     "self_attn.q_proj.weight"),
    ("attention.self.query.bias",       "self_attn.q_proj.bias"),
    ("attention.self.key.weight",       "self_attn.k_proj.weight"),
    ("attention.self.key.bias",         "self_attn.k_proj.bias"),
    ("attention.self.value.weight",     "self_attn.v_proj.weight"),
    ("attention.self.value.bias",       "self_attn.v_proj.bias"),
    ("attention.output.dense.weight",   "self_attn.o_proj.weight"),
    ("attention.output.dense.bias",     "self_attn.o_proj.bias"),
    ("attention.output.LayerNorm.weight", "self_attn_norm.weight"),
    ("attention.output.LayerNorm.bias", "self_attn_norm.bias"),
    ("intermediate.dense.weight",       "mlp.up_proj.weight"),
    ("intermediate.dense.bias",         "mlp.up_proj.bias"),
    ("output.dense.weight",             "mlp.down_proj.weight"),
    ("output.dense.bias",               "mlp.down_proj.bias"),
    ("output.LayerNorm.weight",         "mlp_norm.weight"),
    ("output.LayerNorm.bias",           "mlp_norm.bias"),
)  # fmt: skip

BERT_TO_HFZOO_HEADS: tuple[tuple[str, str], ...] = (
    # BERT key (full name)                          hfzoo key (full name)
    ("bert.pooler.dense.weight",                    "classifier.dense.weight"),
    ("bert.pooler.dense.bias",                      "classifier.dense.bias"),
    ("classifier.weight",                           "classifier.out_proj.weight"),
    ("classifier.bias",                             "classifier.out_proj.bias"),
    ("cls.predictions.transform.dense.weight",      "lm_head.dense.weight"),
    ("cls.predictions.transform.dense.bias",        "lm_head.dense.bias"),
    ("cls.predictions.transform.LayerNorm.weight",  "lm_head.norm.weight"),
    ("cls.predictions.transform.LayerNorm.bias",    "lm_head.norm.bias"),
    ("cls.predictions.decoder.weight",              "lm_head.decoder.weight"),
    ("cls.predictions.decoder.bias",                "lm_head.decoder.bias"),
)  # fmt: skip

# BertForMaskedLM holds the decoder bias twice (`cls.predictions.bias` is `cls.predictions.decoder.bias`).
_BERT_MLM_BIAS_ALIAS = ("cls.predictions.bias", "cls.predictions.decoder.bias")


def hfzoo_config_from_bert(bert_config: BertConfig) -> HfzooEncoderConfig:
    """Build the `HfzooEncoderConfig` describing the same network as a `BertConfig`.

    Mapped fields (same names on both sides): `vocab_size`, `hidden_size`, `num_hidden_layers`,
    `num_attention_heads`, `intermediate_size`, `hidden_act`, `max_position_embeddings`,
    `type_vocab_size`, `layer_norm_eps`, `hidden_dropout_prob`, `attention_probs_dropout_prob`,
    `classifier_dropout`, `initializer_range`, `tie_word_embeddings`, the special token ids and the
    task fields (`num_labels` via `id2label`, `label2id`, `problem_type`). BERT's architecture is fixed:
    post-LN, a LayerNorm over the summed embeddings, learned absolute positions, biases everywhere, no
    dropout on the feed-forward hidden layer (`activation_dropout=0.0`).

    Args:
        bert_config: the BERT config.

    Returns:
        The `HfzooEncoderConfig`.

    Raises:
        TypeError: `bert_config` is not a `BertConfig`.
        ValueError: a BERT setting hfzoo's encoder cannot express: `is_decoder`,
            `add_cross_attention`, a `position_embedding_type` other than `"absolute"` (older configs),
            or an activation unknown to `ACT2FN`.
    """
    if not isinstance(bert_config, BertConfig):
        raise TypeError(f"expected a BertConfig, got {type(bert_config).__name__}")
    c = bert_config
    if getattr(c, "is_decoder", False) or getattr(c, "add_cross_attention", False):
        raise ValueError("is_decoder / add_cross_attention: hfzoo converts the bidirectional BERT encoder only")
    position_type = getattr(c, "position_embedding_type", "absolute")
    if position_type != "absolute":
        raise ValueError(f"position_embedding_type={position_type!r}: hfzoo converts absolute BERT positions only")
    if c.hidden_act not in ACT2FN:
        raise ValueError(f"hidden_act={c.hidden_act!r} is not a key of transformers' ACT2FN")
    fields = dict(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads,
        intermediate_size=c.intermediate_size,
        hidden_act=c.hidden_act,
        max_position_embeddings=c.max_position_embeddings,
        type_vocab_size=c.type_vocab_size,
        position_embedding_type="learned",
        norm_type="layer_norm",
        norm_position="post",
        embedding_norm=True,
        layer_norm_eps=c.layer_norm_eps,
        attention_bias=True,
        mlp_bias=True,
        hidden_dropout_prob=c.hidden_dropout_prob,
        attention_probs_dropout_prob=c.attention_probs_dropout_prob,
        activation_dropout=0.0,
        classifier_dropout=c.classifier_dropout,
        initializer_range=c.initializer_range,
        tie_word_embeddings=c.tie_word_embeddings,
        pad_token_id=c.pad_token_id,
        bos_token_id=getattr(c, "bos_token_id", None),
        eos_token_id=getattr(c, "eos_token_id", None),
        id2label=dict(c.id2label),
        label2id=dict(c.label2id),
        problem_type=c.problem_type,
    )
    try:
        return HfzooEncoderConfig(**fields)
    except (StrictDataclassError, TypeError, ValueError) as err:
        cause = err.__cause__ if err.__cause__ is not None else err
        raise ValueError(f"BERT config cannot be expressed as an hfzoo encoder config: {cause}") from err


def bert_config_from_hfzoo(config: HfzooEncoderConfig) -> BertConfig:
    """Build the `BertConfig` describing the same network as an `HfzooEncoderConfig`.

    The inverse of `hfzoo_config_from_bert` on the fields it maps.

    Args:
        config: an hfzoo encoder config.

    Returns:
        The `BertConfig`.

    Raises:
        TypeError: `config` is not an `HfzooEncoderConfig`.
        ValueError: a setting BERT cannot express (message names the field): `norm_position` other
            than `"post"`, `embedding_norm=False`, `norm_type` other than `"layer_norm"`,
            `position_embedding_type` other than `"learned"`, `attention_bias` / `mlp_bias` False,
            `head_dim != hidden_size // num_attention_heads`, or `type_vocab_size=0`.
    """
    if not isinstance(config, HfzooEncoderConfig):
        raise TypeError(f"expected an HfzooEncoderConfig, got {type(config).__name__}")
    required = {
        "norm_position": ("post", "BERT is post-LN (LayerNorm after each residual addition)"),
        "embedding_norm": (True, "BERT normalises the summed embeddings (embeddings.LayerNorm)"),
        "norm_type": ("layer_norm", "BERT uses nn.LayerNorm"),
        "position_embedding_type": ("learned", "BERT has learned absolute positions"),
        "attention_bias": (True, "BERT's projections have biases"),
        "mlp_bias": (True, "BERT's projections have biases"),
    }
    for name, (value, why) in required.items():
        if getattr(config, name) != value:
            raise ValueError(f"{name}={getattr(config, name)!r} cannot be converted to BERT ({why}; needs {value!r})")
    if config.hidden_size % config.num_attention_heads or config.head_dim != (
        config.hidden_size // config.num_attention_heads
    ):
        raise ValueError(
            f"head_dim={config.head_dim} cannot be converted to BERT, whose head size is "
            f"hidden_size // num_attention_heads = {config.hidden_size} // {config.num_attention_heads}"
        )
    if config.type_vocab_size < 1:
        raise ValueError("type_vocab_size=0 cannot be converted to BERT, which always has token-type embeddings")
    return BertConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        intermediate_size=config.intermediate_size,
        hidden_act=config.hidden_act,
        hidden_dropout_prob=config.hidden_dropout_prob,
        attention_probs_dropout_prob=config.attention_probs_dropout_prob,
        max_position_embeddings=config.max_position_embeddings,
        type_vocab_size=config.type_vocab_size,
        initializer_range=config.initializer_range,
        layer_norm_eps=config.layer_norm_eps,
        classifier_dropout=config.classifier_dropout,
        tie_word_embeddings=config.tie_word_embeddings,
        pad_token_id=config.pad_token_id,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        id2label=dict(config.id2label),
        label2id=dict(config.label2id),
        problem_type=config.problem_type,
    )


def bert_state_dict_to_hfzoo(state: Mapping[str, torch.Tensor], num_layers: int) -> dict[str, torch.Tensor]:
    """Rename a BERT state dict (any of BertModel / BertForMaskedLM / BertForSequenceClassification) to hfzoo keys.

    Encoder keys go under `model.`; `bert.pooler.dense` becomes `classifier.dense` (hfzoo's pooler
    lives in its classification head), `classifier` becomes `classifier.out_proj`, `cls.predictions.*`
    becomes `lm_head.*`. Tensors are not copied. Position-id buffers of old checkpoints are dropped.

    Args:
        state: the BERT state dict, keys with or without the `bert.` prefix.
        num_layers: `num_hidden_layers`.

    Returns:
        The hfzoo state dict.

    Raises:
        ValueError: a key this mapping does not know, or a missing encoder key (both listed).
    """
    # Full BertFor* names: the encoder (and pooler) under `bert.`, the heads at the top level.
    state = {(k if k.startswith(("cls.", "classifier.", "bert.")) else f"bert.{k}"): v for k, v in state.items()}
    state = {k: v for k, v in state.items() if k != "bert.embeddings.position_ids"}
    if _BERT_MLM_BIAS_ALIAS[0] in state:
        bias = state.pop(_BERT_MLM_BIAS_ALIAS[0])
        state.setdefault(_BERT_MLM_BIAS_ALIAS[1], bias)
    names = dict(BERT_TO_HFZOO_HEADS)
    names.update({f"bert.{b}": f"model.{h}" for b, h in BERT_TO_HFZOO_GLOBAL})
    names.update(
        {
            f"bert.encoder.layer.{i}.{b}": f"model.layers.{i}.{h}"
            for i in range(num_layers)
            for b, h in BERT_TO_HFZOO_LAYER
        }
    )
    unknown = sorted(set(state) - set(names))
    missing = sorted(k for k in names if k.startswith("bert.") and not k.startswith("bert.pooler.") and k not in state)
    if unknown or missing:
        raise ValueError(f"BERT state dict does not match its config: missing {missing}, unexpected {unknown}")
    return {names[k]: v for k, v in state.items()}


def _hfzoo_state_dict_to_bert(state: Mapping[str, torch.Tensor], with_prefix: bool) -> dict[str, torch.Tensor]:
    """Rename hfzoo encoder keys back to BERT keys (`bert.` prefix on the encoder when `with_prefix`)."""
    names = {h: b for b, h in BERT_TO_HFZOO_HEADS}
    prefix = "bert." if with_prefix else ""
    out = {}
    for key, value in state.items():
        if key in names:
            out[names[key]] = value  # heads exist only in BertFor* models, whose names are given in full
            continue
        body = key.removeprefix("model.")
        match = re.fullmatch(r"layers\.(\d+)\.(.+)", body)
        if match:
            layer = {h: b for b, h in BERT_TO_HFZOO_LAYER}[match.group(2)]
            out[f"{prefix}encoder.layer.{match.group(1)}.{layer}"] = value
        else:
            out[prefix + {h: b for b, h in BERT_TO_HFZOO_GLOBAL}[body]] = value
    if "cls.predictions.decoder.bias" in out:
        out[_BERT_MLM_BIAS_ALIAS[0]] = out["cls.predictions.decoder.bias"]
    return out


# The classes on each side, in matching order; a model converts to the class at the same position.
_BERT_CLASSES = (BertModel, BertForMaskedLM, BertForSequenceClassification)
_HFZOO_ENCODER_CLASSES = (HfzooEncoderModel, HfzooEncoderForMaskedLM, HfzooEncoderForSequenceClassification)


def _bert_class_for_state(state: Mapping[str, torch.Tensor]) -> int:
    if any(k.startswith("classifier.") for k in state):
        return 2
    if any(k.startswith(("cls.predictions.", "lm_head.")) for k in state):
        return 1
    return 0


def bert_to_hfzoo(
    bert_model_or_state_dict: BertModel | BertForMaskedLM | BertForSequenceClassification | Mapping[str, torch.Tensor],
    config: BertConfig | HfzooEncoderConfig | None = None,
    *,
    attn_implementation: str | None = None,
) -> HfzooEncoderModel | HfzooEncoderForMaskedLM | HfzooEncoderForSequenceClassification:
    """Convert a BERT model (or state dict) to the hfzoo encoder class computing the same outputs.

    `BertModel` -> `HfzooEncoderModel` (same `last_hidden_state`; a pooler, which hfzoo keeps in its
    classification head, is dropped), `BertForMaskedLM` -> `HfzooEncoderForMaskedLM`,
    `BertForSequenceClassification` -> `HfzooEncoderForSequenceClassification` (pooler ->
    `classifier.dense`, `classifier` -> `classifier.out_proj`). A state dict picks the class from its
    keys (`classifier.*`: sequence classification; `cls.predictions.*`: masked LM; else the bare
    encoder). Tensors are renamed only (`BERT_TO_HFZOO_*` tables), so `hfzoo_to_bert` returns the
    original state dict exactly. The result has the source's dtype and device, eval mode.

    Args:
        bert_model_or_state_dict: the BERT model, or a state dict of one (keys with or without `bert.`).
        config: required with a state dict (ignored for a model): a `BertConfig` or an
            `HfzooEncoderConfig` that BERT can express.
        attn_implementation: attention backend of the result; default: the source model's (a model),
            hfzoo's default (a state dict).

    Returns:
        The hfzoo encoder model.

    Raises:
        TypeError: a state dict without `config`, or an unsupported input type.
        ValueError: a config hfzoo cannot express (see `hfzoo_config_from_bert`), or state-dict keys
            that do not match the config (listed).
    """
    source = bert_model_or_state_dict
    if isinstance(source, _BERT_CLASSES):
        config, state = source.config, dict(source.state_dict())
        index = next(i for i, cls in enumerate(_BERT_CLASSES) if isinstance(source, cls))
        if attn_implementation is None:
            attn_implementation = source.config._attn_implementation
        if index == 0:
            state = {k: v for k, v in state.items() if not k.startswith("pooler.")}
    elif isinstance(source, Mapping):
        if config is None:
            raise TypeError("bert_to_hfzoo: a state dict needs its config (BertConfig or HfzooEncoderConfig)")
        state, index = dict(source), _bert_class_for_state(source)
    else:
        raise TypeError(
            f"expected a BertModel, BertForMaskedLM, BertForSequenceClassification or state dict, "
            f"got {type(source).__name__}"
        )
    if isinstance(config, BertConfig):
        hfzoo_config = hfzoo_config_from_bert(config)
    else:
        bert_config_from_hfzoo(config)  # raises if BERT cannot express it
        hfzoo_config = config
    hfzoo_state = bert_state_dict_to_hfzoo(state, hfzoo_config.num_hidden_layers)
    if index == 1:
        hfzoo_state = _resolve_tied_head(
            hfzoo_state, hfzoo_config.tie_word_embeddings, "model.embed_tokens.weight", "lm_head.decoder.weight", "BERT"
        )
    if index == 0:  # the bare encoder's state dict has no `model.` prefix
        hfzoo_state = {k.removeprefix("model."): v for k, v in hfzoo_state.items() if k.startswith("model.")}
    model = _HFZOO_ENCODER_CLASSES[index](hfzoo_config)
    _check_keys(set(hfzoo_state), set(model.state_dict()), "BERT")
    return _load(model, hfzoo_state, attn_implementation)


def hfzoo_to_bert(
    model: HfzooEncoderModel | HfzooEncoderForMaskedLM | HfzooEncoderForSequenceClassification,
    *,
    attn_implementation: str | None = None,
) -> BertModel | BertForMaskedLM | BertForSequenceClassification:
    """Convert an hfzoo encoder model to the BERT class computing the same outputs (inverse of `bert_to_hfzoo`).

    `HfzooEncoderModel` -> `BertModel` without pooler, `HfzooEncoderForMaskedLM` -> `BertForMaskedLM`,
    `HfzooEncoderForSequenceClassification` -> `BertForSequenceClassification`.

    Args:
        model: the hfzoo encoder model.
        attn_implementation: attention backend of the result; default: the source model's.

    Returns:
        The BERT model (source dtype and device, eval mode).

    Raises:
        TypeError: `model` is not one of the three hfzoo encoder classes.
        ValueError: a config BERT cannot express (see `bert_config_from_hfzoo`).
    """
    if not isinstance(model, _HFZOO_ENCODER_CLASSES):
        raise TypeError(f"expected an hfzoo encoder model, got {type(model).__name__}")
    index = next(i for i, cls in enumerate(_HFZOO_ENCODER_CLASSES) if isinstance(model, cls))
    bert_config = bert_config_from_hfzoo(model.config)
    state = _hfzoo_state_dict_to_bert(model.state_dict(), with_prefix=index > 0)
    if index == 0:
        bert = BertModel(bert_config, add_pooling_layer=False)
    else:
        bert = _BERT_CLASSES[index](bert_config)
    if attn_implementation is None:
        attn_implementation = model.config._attn_implementation
    _check_keys(set(state), set(bert.state_dict()), "hfzoo")
    return _load(bert, state, attn_implementation)


def convert_bert_checkpoint(bert_path: str | Path, output_dir: str | Path) -> Path:
    """Write an hfzoo encoder checkpoint folder from a BERT checkpoint folder (config, weights, tokenizer).

    Every tensor of the BERT checkpoint is kept: the encoder under `model.`, a masked-LM head as
    `lm_head.*`, and the pooler as `classifier.dense.*`, so that
    `AutoModelForSequenceClassification.from_pretrained(output_dir, num_labels=...)` starts from BERT's
    pretrained pooler exactly as `BertForSequenceClassification.from_pretrained(bert_path)` does (only
    `classifier.out_proj` is newly initialised).

    Args:
        bert_path: a folder with a BERT `config.json` and `model.safetensors` (or `pytorch_model.bin`);
            its tokenizer files, if any, are copied.
        output_dir: the folder to write (created).

    Returns:
        `output_dir` as a `Path`.

    Raises:
        FileNotFoundError: no config or weights file in `bert_path`.
        ValueError: not a BERT checkpoint, or weights that do not match its config.
    """
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig, AutoTokenizer

    bert_path, output_dir = Path(bert_path), Path(output_dir)
    if not (bert_path / "config.json").is_file():
        raise FileNotFoundError(f"{bert_path}: no config.json (expected a BERT checkpoint folder)")
    bert_config = AutoConfig.from_pretrained(bert_path)
    if not isinstance(bert_config, BertConfig):
        raise ValueError(f"{bert_path}: model_type={bert_config.model_type!r}, expected 'bert'")
    if (bert_path / "model.safetensors").is_file():
        state = load_file(bert_path / "model.safetensors")
    elif (bert_path / "pytorch_model.bin").is_file():
        state = torch.load(bert_path / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise FileNotFoundError(f"{bert_path}: neither model.safetensors nor pytorch_model.bin")
    config = hfzoo_config_from_bert(bert_config)
    hfzoo_state = bert_state_dict_to_hfzoo(state, config.num_hidden_layers)
    if config.tie_word_embeddings:
        hfzoo_state.pop("lm_head.decoder.weight", None)  # restored from the embeddings by the tie
    output_dir.mkdir(parents=True, exist_ok=True)
    config.architectures = ["HfzooEncoderForMaskedLM" if "lm_head.dense.weight" in hfzoo_state else "HfzooEncoderModel"]
    config.save_pretrained(output_dir)
    save_file({k: v.contiguous() for k, v in hfzoo_state.items()}, output_dir / "model.safetensors", {"format": "pt"})
    if (bert_path / "tokenizer_config.json").is_file() or (bert_path / "vocab.txt").is_file():
        AutoTokenizer.from_pretrained(bert_path).save_pretrained(output_dir)
    return output_dir
