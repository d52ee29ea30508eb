"""Llama, Qwen3 and Mistral (transformers' native classes) <-> the hfzoo decoder, both ways.

transformers' `LlamaForCausalLM` (Touvron et al. 2023), `Qwen3ForCausalLM` (Qwen3: Llama plus QK-norm) and
`MistralForCausalLM` (Mistral 7B: Llama plus sliding-window attention) are pre-norm decoders with RMSNorm, a
gated feed-forward `down_proj(act(gate_proj(x)) * up_proj(x))` (SwiGLU with `hidden_act="silu"`), rotary
positions and grouped-query attention. `HfzooDecoderConfig` expresses them with:

- `position_embedding_type="rotary"`, `rope_theta` (transformers' `rope_parameters["rope_theta"]`, `rope_type`
  `"default"`). Both sides rotate in the "rotate half" layout (feature pairs `(i, i + head_dim / 2)`, angles
  `position * rope_theta ** (-2i / head_dim)`), so the q/k projection rows are copied without permutation;
- `norm_type="rms_norm"`, `norm_position="pre"`, `rms_norm_eps`; `gated_mlp=True`, `hidden_act`;
- `num_key_value_heads`, `head_dim`, `attention_bias` (q, k, v and o), `mlp_bias` (Llama only), attention scores
  scaled by `head_dim ** -0.5` (`scale_attention_scores=True`), `tie_word_embeddings`, no dropout but
  `attention_probs_dropout_prob` (`attention_dropout`);
- Qwen3: `qk_norm="rms_norm"` with a learned scale (`q_norm` / `k_norm` over `head_dim`, before rotary);
- Mistral: `token_mixer="sliding_window"`. A token sees itself and the `attention_window / 2` tokens before it,
  where Mistral's `sliding_window` counts itself: `sliding_window = attention_window / 2 + 1`.

Which class an hfzoo decoder becomes follows from its config: QK-norm -> Qwen3, sliding window -> Mistral, else
Llama. Every other hfzoo field must be at the value the native class implies; a config with fields that do not
map is refused before any weight is touched, with one error naming every such field and its value
(`llama_config_from_hfzoo`). The state dicts differ only in the names of the two norms of each layer
(`self_attn_norm` / `input_layernorm`, `mlp_norm` / `post_attention_layernorm`), so round trips return the
original state dict exactly.

Example:
    ```python
    >>> from transformers import AutoModelForCausalLM
    >>> from hfzoo.convert import hfzoo_to_llama, llama_to_hfzoo
    >>> native = AutoModelForCausalLM.from_pretrained("HuggingFaceTB/SmolLM2-135M")   # LlamaForCausalLM
    >>> model = llama_to_hfzoo(native)      # HfzooDecoderForCausalLM, same logits
    >>> back = hfzoo_to_llama(model)        # LlamaForCausalLM, same state dict
    ```
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from huggingface_hub.errors import StrictDataclassError
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    LlamaForQuestionAnswering,
    LlamaForSequenceClassification,
    LlamaForTokenClassification,
    MistralConfig,
    MistralForCausalLM,
    MistralForQuestionAnswering,
    MistralForSequenceClassification,
    MistralForTokenClassification,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3ForQuestionAnswering,
    Qwen3ForSequenceClassification,
    Qwen3ForTokenClassification,
)
from transformers.activations import ACT2FN

from ..configuration_utils import _hfzoo_field_types
from ..models.decoder import HfzooDecoderConfig
from ..modules.attention import key_value_heads
from ..modules.feed_forward import ACTIVATIONS
from .common import (
    CAUSAL_LM,
    HFZOO_DECODER_HEADS,
    QUESTION_ANSWERING,
    SEQUENCE_CLASSIFICATION,
    TOKEN_CLASSIFICATION,
    HfzooDecoderHeads,
    build_hfzoo_config,
    check_keys,
    class_position,
    decoder_task_fields,
    load_converted,
    read_source,
    resolve_tied_head,
)

__all__ = [
    "LLAMA_TO_HFZOO_GLOBAL",
    "LLAMA_TO_HFZOO_LAYER",
    "NATIVE_LLAMA_CLASSES",
    "NATIVE_LLAMA_HEADS",
    "hfzoo_config_from_llama",
    "hfzoo_to_llama",
    "llama_config_from_hfzoo",
    "llama_to_hfzoo",
]

#: `model_type` -> `(config class, causal-LM class)` of the native decoders this module converts.
NATIVE_LLAMA_CLASSES: dict[str, tuple[type, type]] = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
}

#: `model_type` -> the native classes at the positions of `HFZOO_DECODER_HEADS`: the causal LM, then
#: transformers' generic decoder heads (`score` without bias pooled at the last non-padding token; `score` with a
#: bias on every token; `qa_outputs`, start and end).
NATIVE_LLAMA_HEADS: dict[str, tuple[type, type, type, type]] = {
    "llama": (LlamaForCausalLM, LlamaForSequenceClassification, LlamaForTokenClassification, LlamaForQuestionAnswering),
    "qwen3": (Qwen3ForCausalLM, Qwen3ForSequenceClassification, Qwen3ForTokenClassification, Qwen3ForQuestionAnswering),
    "mistral": (
        MistralForCausalLM,
        MistralForSequenceClassification,
        MistralForTokenClassification,
        MistralForQuestionAnswering,
    ),
}  # fmt: skip
#: Each head's own tensors, named alike on both sides (the causal LM's `lm_head.weight` is in `LLAMA_TO_HFZOO_GLOBAL`).
_HEAD_KEYS = ((), ("score.weight",), ("score.weight", "score.bias"), ("qa_outputs.weight", "qa_outputs.bias"))

# --------------------------------------------------------------------------------------------------
# The state-dict mapping: every tensor is copied (same shape), only names change. `(native, hfzoo)`.
# --------------------------------------------------------------------------------------------------

LLAMA_TO_HFZOO_GLOBAL: tuple[tuple[str, str], ...] = (
    ("model.embed_tokens.weight", "model.embed_tokens.weight"),
    ("model.norm.weight", "model.norm.weight"),
    ("lm_head.weight", "lm_head.weight"),
)

LLAMA_TO_HFZOO_LAYER: tuple[tuple[str, str], ...] = (
    # native key (model.layers.{i}.)   hfzoo key (model.layers.{i}.)
    ("input_layernorm.weight",          "self_attn_norm.weight"),
    ("self_attn.q_proj.weight",         "self_attn.q_proj.weight"),
    ("self_attn.k_proj.weight",         "self_attn.k_proj.weight"),
    ("self_attn.v_proj.weight",         "self_attn.v_proj.weight"),
    ("self_attn.o_proj.weight",         "self_attn.o_proj.weight"),
    ("self_attn.q_proj.bias",           "self_attn.q_proj.bias"),          # attention_bias only
    ("self_attn.k_proj.bias",           "self_attn.k_proj.bias"),
    ("self_attn.v_proj.bias",           "self_attn.v_proj.bias"),
    ("self_attn.o_proj.bias",           "self_attn.o_proj.bias"),
    ("self_attn.q_norm.weight",         "self_attn.q_norm.weight"),        # Qwen3 (qk_norm) only
    ("self_attn.k_norm.weight",         "self_attn.k_norm.weight"),
    ("post_attention_layernorm.weight", "mlp_norm.weight"),
    ("mlp.gate_proj.weight",            "mlp.gate_proj.weight"),
    ("mlp.up_proj.weight",              "mlp.up_proj.weight"),
    ("mlp.down_proj.weight",            "mlp.down_proj.weight"),
    ("mlp.gate_proj.bias",              "mlp.gate_proj.bias"),             # mlp_bias (Llama) only
    ("mlp.up_proj.bias",                "mlp.up_proj.bias"),
    ("mlp.down_proj.bias",              "mlp.down_proj.bias"),
)  # fmt: skip

# hfzoo fields that change nothing in a dense decoder without experts (the experts' own settings) or that the
# native classes have no use for once `norm_type="rms_norm"` (a LayerNorm epsilon): never reported.
_NOT_COMPARED = {
    "num_experts_per_tok",
    "router_type",
    "expert_capacity_factor",
    "router_aux_loss_coef",
    "router_z_loss_coef",
    "moe_layer_interval",
    "output_router_logits",
    "layer_norm_eps",
    "classifier_dropout",  # carried as the rate the token classifier applies (`common.decoder_task_fields`)
}


# ------------------------------------------------------------------------------------------------ configs


def _rope_theta(config: Any) -> float:
    """`rope_parameters["rope_theta"]` of a native config (an older config's `rope_theta` attribute)."""
    parameters = getattr(config, "rope_parameters", None) or {}
    theta = parameters.get("rope_theta", getattr(config, "rope_theta", None))
    return float(theta if theta is not None else 10000.0)


def _native_problems(config: Any) -> list[str]:
    """The settings of a native Llama / Qwen3 / Mistral config the hfzoo decoder cannot express."""
    problems = []
    rope_type = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope_type != "default":
        problems.append(f"rope_parameters['rope_type']={rope_type!r} (hfzoo's rotary is the 'default' RoPE)")
    if getattr(config, "pretraining_tp", 1) not in (1, None):
        problems.append(f"pretraining_tp={config.pretraining_tp} (only 1: no sliced projections)")
    if config.hidden_act not in ACT2FN or config.hidden_act not in ACTIVATIONS:
        problems.append(f"hidden_act={config.hidden_act!r} (not an activation of both transformers and hfzoo)")
    if isinstance(config, Qwen3Config) and any(kind != "full_attention" for kind in config.layer_types or []):
        problems.append(
            f"use_sliding_window={config.use_sliding_window} / layer_types={config.layer_types} (hfzoo converts "
            "Qwen3 with full attention in every layer)"
        )
    if isinstance(config, MistralConfig) and config.sliding_window is not None and config.sliding_window < 2:
        problems.append(f"sliding_window={config.sliding_window} (hfzoo's window sees at least one earlier token)")
    return problems


def hfzoo_config_from_llama(native_config: LlamaConfig | Qwen3Config | MistralConfig) -> HfzooDecoderConfig:
    """Build the `HfzooDecoderConfig` describing the same network as a Llama, Qwen3 or Mistral config.

    Mapped fields: `vocab_size`, `hidden_size`, `intermediate_size`, `num_hidden_layers`, `num_attention_heads`,
    `num_key_value_heads`, `head_dim`, `hidden_act`, `max_position_embeddings`, `rms_norm_eps`,
    `rope_parameters["rope_theta"]` -> `rope_theta`, `attention_bias`, `mlp_bias` (Llama; False for the others),
    `attention_dropout` -> `attention_probs_dropout_prob`, `initializer_range`, `tie_word_embeddings`,
    `use_cache`, the special token ids and the task fields (`num_labels` via `id2label`, `label2id`,
    `problem_type`; `classifier_dropout`, 0.1 when unset, as transformers' token classifier applies); Qwen3 adds
    `qk_norm="rms_norm"`, Mistral with a `sliding_window` `token_mixer="sliding_window"` and
    `attention_window = 2 * (sliding_window - 1)` (Mistral's `sliding_window=None` is full attention). Fixed:
    rotary positions, pre-norm RMSNorm, gated feed-forward, no dropout besides attention's and the token
    classifier's (`hidden_dropout_prob=activation_dropout=0.0`).

    Args:
        native_config: a `LlamaConfig`, `Qwen3Config` or `MistralConfig`.

    Returns:
        A validated `HfzooDecoderConfig`.

    Raises:
        TypeError: another config class.
        ValueError: one message naming every setting hfzoo cannot express: a `rope_type` other than
            `"default"` (scaled RoPE: llama3, yarn, linear, ...), `pretraining_tp > 1`, an activation unknown to
            hfzoo or transformers, a Qwen3 with sliding-window layers, a Mistral `sliding_window` below 2; or a
            config hfzoo's validation refuses.
    """
    if not isinstance(native_config, (LlamaConfig, Qwen3Config, MistralConfig)):
        raise TypeError(f"expected a LlamaConfig, Qwen3Config or MistralConfig, got {type(native_config).__name__}")
    c = native_config
    problems = _native_problems(c)
    if problems:
        raise ValueError(f"{type(c).__name__} cannot be converted to an hfzoo decoder: {'; '.join(problems)}")
    window = getattr(c, "sliding_window", None) if isinstance(c, MistralConfig) else None
    fields = dict(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads or c.num_attention_heads,
        head_dim=getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
        hidden_act=c.hidden_act,
        max_position_embeddings=c.max_position_embeddings,
        position_embedding_type="rotary",
        rope_theta=_rope_theta(c),
        norm_type="rms_norm",
        norm_position="pre",
        rms_norm_eps=c.rms_norm_eps,
        gated_mlp=True,
        attention_bias=bool(getattr(c, "attention_bias", False)),
        mlp_bias=bool(getattr(c, "mlp_bias", False)),
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=c.attention_dropout,
        activation_dropout=0.0,
        initializer_range=c.initializer_range,
        tie_word_embeddings=c.tie_word_embeddings,
        use_cache=c.use_cache,
        pad_token_id=c.pad_token_id,
        bos_token_id=c.bos_token_id,
        eos_token_id=c.eos_token_id,
        **decoder_task_fields(c, to_hfzoo=True),
    )
    if isinstance(c, Qwen3Config):
        fields["qk_norm"] = "rms_norm"
    if window is not None:
        fields.update(token_mixer="sliding_window", attention_window=2 * (window - 1))
    return build_hfzoo_config(HfzooDecoderConfig, fields, f"{type(c).__name__}")


def _native_class_of(config: HfzooDecoderConfig) -> str:
    """The native `model_type` an hfzoo decoder config maps to: QK-norm -> qwen3, a sliding window -> mistral."""
    if config.qk_norm is not None:
        return "qwen3"
    if config.token_mixer == "sliding_window":
        return "mistral"
    return "llama"


def _native_fields(config: HfzooDecoderConfig, model_type: str) -> dict[str, Any]:
    """The native config's keyword arguments for the fields of `config` that have an equivalent."""
    fields = dict(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=key_value_heads(config),
        head_dim=config.head_dim,
        hidden_act=config.hidden_act,
        max_position_embeddings=config.max_position_embeddings,
        initializer_range=config.initializer_range,
        rms_norm_eps=config.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": float(config.rope_theta)},
        attention_dropout=config.attention_probs_dropout_prob,
        tie_word_embeddings=config.tie_word_embeddings,
        use_cache=config.use_cache,
        pad_token_id=config.pad_token_id,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        **decoder_task_fields(config, to_hfzoo=False),
    )
    if model_type in ("llama", "qwen3"):
        fields["attention_bias"] = config.attention_bias
    if model_type == "llama":
        fields["mlp_bias"] = config.mlp_bias
    if model_type == "qwen3":
        fields.update(use_sliding_window=False, sliding_window=None)
    if model_type == "mistral":
        fields["sliding_window"] = config.attention_window // 2 + 1
    return fields


def llama_config_from_hfzoo(config: HfzooDecoderConfig) -> LlamaConfig | Qwen3Config | MistralConfig:
    """Build the native config describing the same network as an `HfzooDecoderConfig`.

    The class follows from the config: `qk_norm="rms_norm"` -> `Qwen3Config`, `token_mixer="sliding_window"` ->
    `MistralConfig` (`sliding_window = attention_window / 2 + 1`), else `LlamaConfig`. The inverse of
    `hfzoo_config_from_llama` on the fields it maps (`rope_parameters={"rope_type": "default", "rope_theta":
    rope_theta}`).

    Every hfzoo field is checked before anything is built: the config must equal, field by field, what
    `hfzoo_config_from_llama` gives for the native config (the experts' own settings and `layer_norm_eps`
    aside, which change nothing here). So post-norm, learned or ALiBi positions, experts, a feed-forward without
    gate, biases the class lacks (Qwen3's and Mistral's feed-forward, Mistral's attention), hidden or
    feed-forward dropout, logit soft-capping, a token mixer other than self-attention or a sliding window,
    unscaled scores, and every other modification are refused, all of them in one message.

    Args:
        config: an hfzoo decoder config.

    Returns:
        A `LlamaConfig`, `Qwen3Config` or `MistralConfig`.

    Raises:
        TypeError: `config` is not an `HfzooDecoderConfig`.
        ValueError: one message naming every field that does not map, with its value and the value the target
            needs, e.g. `norm_position='post' (needs 'pre'), position_embedding_type='alibi' (needs 'rotary')`.
    """
    if not isinstance(config, HfzooDecoderConfig):
        raise TypeError(f"expected an HfzooDecoderConfig, got {type(config).__name__}")
    model_type = _native_class_of(config)
    config_class = NATIVE_LLAMA_CLASSES[model_type][0]
    target = config_class.__name__.removesuffix("Config")
    if config.qk_norm is not None and config.token_mixer == "sliding_window":
        raise ValueError(
            f"qk_norm={config.qk_norm!r} with token_mixer='sliding_window' cannot be converted: Qwen3 (QK-norm) is "
            "converted with full attention, Mistral (sliding window) has no QK-norm"
        )
    fields = _native_fields(config, model_type)
    try:
        native = config_class(**fields)
    except (StrictDataclassError, TypeError, ValueError) as err:
        cause = err.__cause__ if err.__cause__ is not None else err
        raise ValueError(f"this hfzoo decoder config cannot be converted to {target}: {cause}") from err
    try:
        reference = hfzoo_config_from_llama(native)
    except ValueError as err:
        raise ValueError(f"this hfzoo decoder config cannot be converted to {target}: {err}") from err
    mismatched = []
    for name in _hfzoo_field_types(HfzooDecoderConfig):
        if name in _NOT_COMPARED:
            continue
        value, needed = getattr(config, name), getattr(reference, name)
        if name == "activation_dropout" and value is None:  # None: the feed-forward uses hidden_dropout_prob
            value = config.hidden_dropout_prob
        if name == "num_key_value_heads":  # None: one per query head
            value, needed = key_value_heads(config), key_value_heads(reference)
        if value != needed:
            mismatched.append(f"{name}={value!r} (needs {needed!r})")
    if mismatched:
        raise ValueError(
            f"this hfzoo decoder config cannot be converted to {target} ({model_type}), which has no equivalent "
            f"for: {', '.join(mismatched)}"
        )
    return native


# ------------------------------------------------------------------------------------------------ weights


def _expected_keys(config: HfzooDecoderConfig, side: int, head: int = CAUSAL_LM) -> set[str]:
    """The state-dict keys of either side (`side` 0: native, 1: hfzoo) for `config` and the head at `head`.

    The native body is under `model.` here (`_body_prefix` renames a `transformer.` one).
    """
    layer_keys = []
    for pair in LLAMA_TO_HFZOO_LAYER:
        hfzoo_key = pair[1]
        if hfzoo_key.startswith("self_attn.") and hfzoo_key.endswith(".bias") and not config.attention_bias:
            continue
        if hfzoo_key.startswith("mlp.") and hfzoo_key.endswith(".bias") and not config.mlp_bias:
            continue
        if "_norm.weight" in hfzoo_key and hfzoo_key.startswith("self_attn.") and config.qk_norm is None:
            continue
        layer_keys.append(pair[side])
    keys = {pair[side] for pair in LLAMA_TO_HFZOO_GLOBAL if head == CAUSAL_LM or pair[side] != "lm_head.weight"}
    keys |= set(_HEAD_KEYS[head])
    return keys | {f"model.layers.{i}.{key}" for i in range(config.num_hidden_layers) for key in layer_keys}


def _rename(state: Mapping[str, torch.Tensor], config: HfzooDecoderConfig, to_hfzoo: bool) -> dict[str, torch.Tensor]:
    """Rename a state dict's keys to the other side (`LLAMA_TO_HFZOO_*`); tensors are shared, not copied.

    A head's own tensors (`score.*`, `qa_outputs.*`) keep their names.
    """
    source, target = (0, 1) if to_hfzoo else (1, 0)
    out = {pair[target]: state[pair[source]] for pair in LLAMA_TO_HFZOO_GLOBAL if pair[source] in state}
    layer = {pair[source]: pair[target] for pair in LLAMA_TO_HFZOO_LAYER}
    for key, value in state.items():
        if key.startswith("model.layers."):
            index, rest = key.removeprefix("model.layers.").split(".", 1)
            out[f"model.layers.{index}.{layer[rest]}"] = value
        elif key.startswith(("score.", "qa_outputs.")):
            out[key] = value
    return out


def _body_prefix(state: Mapping[str, torch.Tensor], old: str, new: str) -> dict[str, torch.Tensor]:
    """`state` with the body's key prefix `old` replaced by `new`.

    `LlamaForQuestionAnswering` and `Qwen3ForQuestionAnswering` keep their body under `transformer.`, every other
    native class and hfzoo under `model.`.
    """
    return {new + k.removeprefix(old) if k.startswith(old) else k: v for k, v in state.items()}


def _head_of_state(state: Mapping[str, torch.Tensor]) -> int:
    """The head a state dict holds (a position of `HFZOO_DECODER_HEADS`), from its keys.

    `qa_outputs.*`: question answering; `score.*` with a bias: token classification, without: sequence
    classification; else the causal LM.
    """
    if "qa_outputs.weight" in state:
        return QUESTION_ANSWERING
    if "score.weight" in state:
        return TOKEN_CLASSIFICATION if "score.bias" in state else SEQUENCE_CLASSIFICATION
    return CAUSAL_LM


#: The native classes `llama_to_hfzoo` takes and `hfzoo_to_llama` returns (annotations).
NativeLlamaModels = (
    LlamaForCausalLM
    | LlamaForSequenceClassification
    | LlamaForTokenClassification
    | LlamaForQuestionAnswering
    | Qwen3ForCausalLM
    | Qwen3ForSequenceClassification
    | Qwen3ForTokenClassification
    | Qwen3ForQuestionAnswering
    | MistralForCausalLM
    | MistralForSequenceClassification
    | MistralForTokenClassification
    | MistralForQuestionAnswering
)


def llama_to_hfzoo(
    model_or_state_dict: NativeLlamaModels | Mapping[str, torch.Tensor],
    config: LlamaConfig | Qwen3Config | MistralConfig | HfzooDecoderConfig | None = None,
    *,
    attn_implementation: str | None = None,
) -> HfzooDecoderHeads:
    """Convert a native Llama / Qwen3 / Mistral model (or its state dict) to the hfzoo decoder class computing the same.

    `*ForCausalLM` -> `HfzooDecoderForCausalLM` (same logits), `*ForSequenceClassification` ->
    `HfzooDecoderForSequenceClassification`, `*ForTokenClassification` -> `HfzooDecoderForTokenClassification`,
    `*ForQuestionAnswering` -> `HfzooDecoderForQuestionAnswering` (same logits and loss; the label set, problem type
    and classifier dropout carried over). A state dict picks the class from its keys (`_head_of_state`). The result
    can be trained further with any hfzoo modification switched on (e.g. `model.config` edited and the model
    rebuilt, or the saved folder used as `--model_name_or_path`). Tensors are copied unchanged, keys renamed per
    `LLAMA_TO_HFZOO_LAYER`; the result has the source's dtype and device and is in eval mode.

    Args:
        model_or_state_dict: one of the `NATIVE_LLAMA_HEADS` classes or a state dict of one (a tied causal LM may
            omit `lm_head.weight`).
        config: required with a state dict (ignored for a model): its native config, or an
            `HfzooDecoderConfig` the native classes can express.
        attn_implementation: attention backend of the result; default: the source model's (a model), hfzoo's
            default (a state dict).

    Returns:
        The hfzoo decoder model.

    Raises:
        TypeError: a state dict without `config`, or an unsupported input type.
        ValueError: a config hfzoo cannot express (`hfzoo_config_from_llama`), or an hfzoo config the native
            classes cannot (`llama_config_from_hfzoo`); state-dict keys that do not match the config (missing /
            unexpected keys listed); a tied config whose `lm_head.weight` differs from the embeddings.
    """
    classes = tuple(model_class for heads in NATIVE_LLAMA_HEADS.values() for model_class in heads)
    source = model_or_state_dict
    state, config, attn_implementation = read_source(
        source, classes, config, attn_implementation,
        "llama_to_hfzoo", "LlamaConfig, Qwen3Config, MistralConfig or HfzooDecoderConfig",
    )  # fmt: skip
    if isinstance(source, classes):
        head = class_position(source, classes) % len(HFZOO_DECODER_HEADS)  # each family's heads in that order
        state = _body_prefix(state, f"{source.base_model_prefix}.", "model.")
    else:
        state = _body_prefix(state, "transformer.", "model.")
        head = _head_of_state(state)
    if isinstance(config, HfzooDecoderConfig):
        llama_config_from_hfzoo(config)  # raises if the native classes cannot express it
        hfzoo_config = config
    else:
        hfzoo_config = hfzoo_config_from_llama(config)
    if head == CAUSAL_LM:
        state = resolve_tied_head(
            state, hfzoo_config.tie_word_embeddings, "model.embed_tokens.weight", "lm_head.weight", "native"
        )
    check_keys(set(state), _expected_keys(hfzoo_config, 0, head), type(config).__name__.removesuffix("Config"))
    model = HFZOO_DECODER_HEADS[head](hfzoo_config)
    return load_converted(model, _rename(state, hfzoo_config, to_hfzoo=True), attn_implementation)


def hfzoo_to_llama(
    model_or_state_dict: HfzooDecoderHeads | Mapping[str, torch.Tensor],
    config: HfzooDecoderConfig | None = None,
    *,
    attn_implementation: str | None = None,
) -> NativeLlamaModels:
    """Convert an hfzoo decoder (or its state dict) to transformers' native Llama, Qwen3 or Mistral class.

    The family follows from the config (`llama_config_from_hfzoo`), which is checked before any tensor is
    touched; the class from the head: `HfzooDecoderForCausalLM` -> `*ForCausalLM`,
    `HfzooDecoderForSequenceClassification` -> `*ForSequenceClassification`, `HfzooDecoderForTokenClassification`
    -> `*ForTokenClassification`, `HfzooDecoderForQuestionAnswering` -> `*ForQuestionAnswering` (a state dict: from
    its keys, `_head_of_state`). The result computes the same outputs, loads with plain transformers
    (`save_pretrained`, then the matching `AutoModelFor...from_pretrained` without hfzoo installed and without
    remote code), has the source's dtype and device and is in eval mode.

    Args:
        model_or_state_dict: an hfzoo decoder of the four classes above, or its state dict.
        config: required with a state dict (ignored for a model): the `HfzooDecoderConfig`.
        attn_implementation: attention backend of the result; default: the source model's (a model),
            transformers' default (a state dict).

    Returns:
        The native model (`NATIVE_LLAMA_HEADS`).

    Raises:
        TypeError: a state dict without `config`, or an unsupported input or config type.
        ValueError: a config the native classes cannot express (one message naming every field); state-dict
            keys that do not match the config; a tied config whose `lm_head.weight` differs from the embeddings.
    """
    source = model_or_state_dict
    state, config, attn_implementation = read_source(
        source, HFZOO_DECODER_HEADS, config, attn_implementation, "hfzoo_to_llama", "HfzooDecoderConfig"
    )
    native_config = llama_config_from_hfzoo(config)
    head = class_position(source, HFZOO_DECODER_HEADS)
    if head is None:  # a state dict
        head = _head_of_state(state)
    if head == CAUSAL_LM:
        state = resolve_tied_head(
            state, config.tie_word_embeddings, "model.embed_tokens.weight", "lm_head.weight", "hfzoo"
        )
    check_keys(set(state), _expected_keys(config, 1, head), "hfzoo")
    model = NATIVE_LLAMA_HEADS[native_config.model_type][head](native_config)
    native_state = _body_prefix(_rename(state, config, to_hfzoo=False), "model.", f"{model.base_model_prefix}.")
    return load_converted(model, native_state, attn_implementation)
