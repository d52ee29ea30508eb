"""T5 (Raffel et al. 2020) <-> the hfzoo encoder-decoder (`HfzooEncoderDecoderForConditionalGeneration`).

Also the task heads: `T5ForSequenceClassification` <-> `HfzooEncoderDecoderForSequenceClassification`,
`T5ForQuestionAnswering` <-> `HfzooEncoderDecoderForQuestionAnswering`, `T5ForTokenClassification` <->
`HfzooEncoderDecoderForTokenClassification`, and the encoder alone: `T5EncoderModel` <->
`HfzooEncoderDecoderEncoderModel`.

T5 is a pre-norm encoder-decoder with RMSNorm without bias (epsilon 1e-6), no biases anywhere, unscaled
attention scores, a bucketed relative attention bias stored in layer 0 of each stack and shared by its
layers, one embedding matrix for encoder and decoder inputs, and either (v1.0) a ReLU feed-forward and an
output layer tied to the embeddings whose input is scaled by d_model ** -0.5, or (v1.1) a GeGLU feed-forward
("gated-gelu": gelu_new) and an untied output layer without scaling. In hfzoo fields:
  position_embedding_type="relative_attention_bias", share_relative_attention_bias=True,
  norm_type="rms_norm", norm_position="pre", attention_bias=mlp_bias=False, scale_attention_scores=False,
  gated_mlp (v1.1), hidden_act, tie_word_embeddings + scale_lm_head_input (v1.0: both True; v1.1: both False).
The weights differ only in their names, so both directions are renames and round trips are exact.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch
from transformers import (
    T5Config,
    T5EncoderModel,
    T5ForConditionalGeneration,
    T5ForQuestionAnswering,
    T5ForSequenceClassification,
    T5ForTokenClassification,
)
from transformers.activations import ACT2FN

from ..models.encoder_decoder import (
    HfzooEncoderDecoderConfig,
    HfzooEncoderDecoderEncoderModel,
    HfzooEncoderDecoderForConditionalGeneration,
    HfzooEncoderDecoderForQuestionAnswering,
    HfzooEncoderDecoderForSequenceClassification,
    HfzooEncoderDecoderForTokenClassification,
)
from .common import (
    build_hfzoo_config,
    check_activation,
    check_answer_head,
    check_fixed_fields,
    check_keys,
    check_multi_head,
    load_converted,
    read_source,
    resolve_tied_head,
    task_fields,
)

__all__ = [
    "HFZOO_T5_HEADS",
    "T5_HEADS",
    "T5_TO_HFZOO_CLASSIFIER",
    "T5_TO_HFZOO_DECODER_LAYER",
    "T5_TO_HFZOO_ENCODER_LAYER",
    "T5_TO_HFZOO_GLOBAL",
    "T5_TO_HFZOO_MLP",
    "hfzoo_config_from_t5",
    "hfzoo_to_t5",
    "t5_config_from_hfzoo",
    "t5_to_hfzoo",
]


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

#: T5's classes and the hfzoo classes they convert to, position by position: the language model, the sequence
#: classifier (the decoder's state at the source's last end-of-sequence token, `dense`, tanh, `out_proj`; its body
#: under `transformer.`), the span head (`qa_outputs` on the decoder's states), the token classifier (`classifier`
#: on the encoder's states; no decoder, its body under `transformer.`) and the encoder alone.
T5_HEADS = (
    T5ForConditionalGeneration,
    T5ForSequenceClassification,
    T5ForQuestionAnswering,
    T5ForTokenClassification,
    T5EncoderModel,
)
HFZOO_T5_HEADS = (
    HfzooEncoderDecoderForConditionalGeneration,
    HfzooEncoderDecoderForSequenceClassification,
    HfzooEncoderDecoderForQuestionAnswering,
    HfzooEncoderDecoderForTokenClassification,
    HfzooEncoderDecoderEncoderModel,
)
_LANGUAGE_MODEL, _SEQUENCE_CLASSIFICATION, _QUESTION_ANSWERING, _TOKEN_CLASSIFICATION, _ENCODER = range(len(T5_HEADS))
#: The positions of `T5_HEADS` without a decoder, and those whose T5 body is under `transformer.`.
_ENCODER_ONLY = (_TOKEN_CLASSIFICATION, _ENCODER)
_T5_BODY_UNDER_TRANSFORMER = (_SEQUENCE_CLASSIFICATION, _TOKEN_CLASSIFICATION)
#: `T5ForSequenceClassification`'s head (its body under `transformer.`) -> hfzoo's `SequenceClassificationHead`.
T5_TO_HFZOO_CLASSIFIER: tuple[tuple[str, str], ...] = (
    ("classification_head.dense.weight", "classifier.dense.weight"),
    ("classification_head.dense.bias", "classifier.dense.bias"),
    ("classification_head.out_proj.weight", "classifier.out_proj.weight"),
    ("classification_head.out_proj.bias", "classifier.out_proj.bias"),
)

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
_T5_FIXED = {
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


def _t5_key_map(config: HfzooEncoderDecoderConfig, head: int = _LANGUAGE_MODEL) -> dict[str, str]:
    """`{T5 key: hfzoo key}` for every weight of a T5 model with this config and head (tied copies included).

    The T5 keys of a body under `transformer.` are given without that prefix; the hfzoo keys of the encoder alone
    with `model.` (`HfzooEncoderDecoderEncoderModel`'s own keys lack it).
    """
    mapping = dict(T5_TO_HFZOO_GLOBAL)
    if head != _LANGUAGE_MODEL:
        del mapping["lm_head.weight"]
    if head in _ENCODER_ONLY:
        mapping = {t5: ours for t5, ours in mapping.items() if not t5.startswith("decoder.")}
    if head == _SEQUENCE_CLASSIFICATION:
        mapping.update(T5_TO_HFZOO_CLASSIFIER)
    if head == _QUESTION_ANSWERING:
        mapping.update({key: key for key in ("qa_outputs.weight", "qa_outputs.bias")})
    if head == _TOKEN_CLASSIFICATION:
        mapping.update({key: key for key in ("classifier.weight", "classifier.bias")})
    mlp = T5_TO_HFZOO_MLP[config.gated_mlp]
    stacks = [("encoder", config.num_hidden_layers, T5_TO_HFZOO_ENCODER_LAYER, 1)]
    if head not in _ENCODER_ONLY:
        stacks.append(("decoder", config.num_decoder_layers, T5_TO_HFZOO_DECODER_LAYER, 2))
    for stack, num_layers, layer_table, mlp_index in stacks:
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
    `num_decoder_layers`, `num_heads` -> `num_attention_heads`, `d_kv` -> `head_dim`, `d_ff` -> `intermediate_size`,
    `feed_forward_proj` -> `hidden_act` + `gated_mlp` ("gated-gelu" is gated `gelu_new`),
    `relative_attention_num_buckets`, `relative_attention_max_distance`, `dropout_rate` -> `hidden_dropout_prob` and
    `attention_probs_dropout_prob`, `layer_norm_epsilon` -> `rms_norm_eps`, `scale_decoder_outputs` ->
    `scale_lm_head_input`, `use_cache`, the task fields (`classifier_dropout`, `id2label`, `label2id`,
    `problem_type`) and the special token ids (`decoder_start_token_id`, when the config has none, is
    `pad_token_id`, as in T5's checkpoints). The architecture is fixed to T5's (see the section comment).
    `initializer_factor` is not mapped (hfzoo initialises with `initializer_range`); training-only difference: T5
    also applies dropout after each stack's final norm.

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
        use_cache=c.use_cache,
        pad_token_id=c.pad_token_id,
        eos_token_id=c.eos_token_id,
        decoder_start_token_id=start if start is not None else c.pad_token_id,
        **task_fields(c, c.classifier_dropout),
    )
    return build_hfzoo_config(HfzooEncoderDecoderConfig, fields, "T5 config")


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
        ValueError: an hfzoo setting T5 cannot express (message names the field): see `_T5_FIXED`;
            `hidden_dropout_prob != attention_probs_dropout_prob` (T5 has one `dropout_rate`).
    """
    if not isinstance(config, HfzooEncoderDecoderConfig):
        raise TypeError(f"expected an HfzooEncoderDecoderConfig, got {type(config).__name__}")
    check_fixed_fields(config, _T5_FIXED, "T5")
    check_multi_head(config, "T5")
    if config.hidden_dropout_prob != config.attention_probs_dropout_prob:
        raise ValueError(
            f"attention_probs_dropout_prob={config.attention_probs_dropout_prob} differs from hidden_dropout_prob="
            f"{config.hidden_dropout_prob}: T5 has one dropout_rate; set them equal"
        )
    check_activation("hidden_act", config.hidden_act)
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
        use_cache=config.use_cache,
        pad_token_id=config.pad_token_id,
        eos_token_id=config.eos_token_id,
        decoder_start_token_id=config.decoder_start_token_id,
        scale_decoder_outputs=config.scale_lm_head_input,
        **task_fields(config, config.classifier_dropout if config.classifier_dropout is not None else 0.0),
    )
    if t5_config.dense_act_fn != config.hidden_act:  # "gated-gelu" maps to gelu_new; refuse other gelu spellings
        raise ValueError(f"hidden_act={config.hidden_act!r} with gated_mlp=True cannot be converted to T5")
    return t5_config


def _t5_head_of_state(
    state: Mapping[str, torch.Tensor], classifier_prefix: str, decoder_prefix: str | tuple[str, ...]
) -> int:
    """The head a state dict holds (a position of `T5_HEADS`).

    `qa_outputs.*`: the span head; `classifier.weight` (a linear layer, both sides): the token classifier; keys under
    `classifier_prefix` (T5's `classification_head.`, hfzoo's `classifier.`): the sequence classifier; no key under
    `decoder_prefix` (T5's `decoder.`, hfzoo's `model.decoder.` or `decoder.`): the encoder alone; else the language
    model.
    """
    if "qa_outputs.weight" in state:
        return _QUESTION_ANSWERING
    if "classifier.weight" in state:
        return _TOKEN_CLASSIFICATION
    if any(k.startswith(classifier_prefix) for k in state):
        return _SEQUENCE_CLASSIFICATION
    return _LANGUAGE_MODEL if any(k.startswith(decoder_prefix) for k in state) else _ENCODER


def _t5_tied(state: Mapping[str, torch.Tensor]) -> bool:
    return "lm_head.weight" not in state or torch.equal(state["lm_head.weight"], state["shared.weight"])


def t5_to_hfzoo(
    t5_model_or_state_dict: T5ForConditionalGeneration
    | T5ForSequenceClassification
    | T5ForQuestionAnswering
    | T5ForTokenClassification
    | T5EncoderModel
    | Mapping[str, torch.Tensor],
    config: T5Config | HfzooEncoderDecoderConfig | None = None,
    *,
    attn_implementation: str | None = None,
) -> (
    HfzooEncoderDecoderForConditionalGeneration
    | HfzooEncoderDecoderForSequenceClassification
    | HfzooEncoderDecoderForQuestionAnswering
    | HfzooEncoderDecoderForTokenClassification
    | HfzooEncoderDecoderEncoderModel
):
    """Convert a T5 model (or its state dict) to the hfzoo encoder-decoder class computing the same outputs.

    `T5ForConditionalGeneration` -> `HfzooEncoderDecoderForConditionalGeneration` (same logits),
    `T5ForSequenceClassification` -> `HfzooEncoderDecoderForSequenceClassification` (same logits and loss in
    eval mode: both classify the decoder's state at the source's last end-of-sequence token, the decoder reading
    the source shifted right; in training, T5's head also applies its dropout before `dense`),
    `T5ForQuestionAnswering` -> `HfzooEncoderDecoderForQuestionAnswering` (same logits and loss),
    `T5ForTokenClassification` -> `HfzooEncoderDecoderForTokenClassification` (same logits and loss in eval mode:
    both classify the encoder's states after `classifier_dropout`; T5 also drops out after the final norm),
    `T5EncoderModel` ->
    `HfzooEncoderDecoderEncoderModel` (the same `last_hidden_state`). Every weight keeps its values under a new name
    (`T5_TO_HFZOO_*` tables). The `lm_head` is tied in the result when the source's `lm_head.weight` is missing or
    equal to `shared.weight`. A state dict with `classification_head.*` keys is a sequence classifier, one with
    `qa_outputs.*` a span head, one with `classifier.weight` a token classifier, one without `decoder.*` keys the
    encoder alone. The result has the source's dtype and device and is in eval mode.

    Args:
        t5_model_or_state_dict: one of `T5_HEADS` or its state dict (tied copies `encoder.embed_tokens.weight`,
            `decoder.embed_tokens.weight`, `lm_head.weight` may be missing; the classifier's body keys with or
            without `transformer.`).
        config: required with a state dict (ignored for a model): a `T5Config` or an
            `HfzooEncoderDecoderConfig` that T5 can express.
        attn_implementation: attention backend of the result ("eager" or "sdpa"); default: the source
            model's backend (a model), hfzoo's default (a state dict).

    Returns:
        The hfzoo encoder-decoder model.

    Raises:
        TypeError: a state dict without `config`, or an unsupported input type.
        ValueError: a config one side cannot express; keys that do not match the config (listed); a tied
            config whose `lm_head.weight` differs from `shared.weight`; a span head with other than 2 outputs.
    """
    source = t5_model_or_state_dict
    state, config, attn_implementation = read_source(
        source, T5_HEADS, config, attn_implementation, "t5_to_hfzoo", "T5Config or HfzooEncoderDecoderConfig"
    )
    state = {key.removeprefix("transformer."): value for key, value in state.items()}
    state = {key: value for key, value in state.items() if not _LEGACY_T5_KEYS.fullmatch(key)}
    if "shared.weight" not in state:
        raise ValueError("T5 state dict has no 'shared.weight'")
    head = _t5_head_of_state(state, "classification_head.", "decoder.")
    if head == _QUESTION_ANSWERING:
        check_answer_head(
            state["qa_outputs.weight"], "T5ForQuestionAnswering", "HfzooEncoderDecoderForQuestionAnswering"
        )
    if isinstance(config, T5Config):  # a classifier has no lm_head to show the tie: its config's default
        tied = _t5_tied(state) if head == _LANGUAGE_MODEL else None
        hfzoo_config = hfzoo_config_from_t5(config, tie_word_embeddings=tied)
    else:
        t5_config_from_hfzoo(config)  # raises if T5 cannot express it
        hfzoo_config = config
    for key in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")[: 1 if head in _ENCODER_ONLY else 2]:
        state.setdefault(key, state["shared.weight"])
    if head == _LANGUAGE_MODEL:
        state = resolve_tied_head(state, hfzoo_config.tie_word_embeddings, "shared.weight", "lm_head.weight", "T5")
    mapping = _t5_key_map(hfzoo_config, head)
    check_keys(set(state), set(mapping), "T5")
    model = HFZOO_T5_HEADS[head](hfzoo_config)
    converted = {mapping[key]: value for key, value in state.items()}
    if head == _ENCODER:  # the encoder alone has its weights at the top level
        converted = {key.removeprefix("model."): value for key, value in converted.items()}
    return load_converted(model, converted, attn_implementation)


def hfzoo_to_t5(
    model_or_state_dict: HfzooEncoderDecoderForConditionalGeneration
    | HfzooEncoderDecoderForSequenceClassification
    | HfzooEncoderDecoderForQuestionAnswering
    | HfzooEncoderDecoderForTokenClassification
    | HfzooEncoderDecoderEncoderModel
    | Mapping[str, torch.Tensor],
    config: HfzooEncoderDecoderConfig | None = None,
    *,
    attn_implementation: str | None = None,
) -> (
    T5ForConditionalGeneration
    | T5ForSequenceClassification
    | T5ForQuestionAnswering
    | T5ForTokenClassification
    | T5EncoderModel
):
    """Convert an hfzoo encoder-decoder (or its state dict) to the T5 class computing the same outputs.

    `HfzooEncoderDecoderForConditionalGeneration` -> `T5ForConditionalGeneration`,
    `HfzooEncoderDecoderForSequenceClassification` -> `T5ForSequenceClassification`,
    `HfzooEncoderDecoderForQuestionAnswering` -> `T5ForQuestionAnswering` (`num_labels=2`),
    `HfzooEncoderDecoderForTokenClassification` -> `T5ForTokenClassification`, `HfzooEncoderDecoderEncoderModel` ->
    `T5EncoderModel`. The inverse of `t5_to_hfzoo`: weights are renamed; with `tie_word_embeddings=False` the T5
    language model's `lm_head` is untied from `shared` (transformers 5 builds T5 tied). A state dict with
    `classifier.weight` is a token classifier, one with other `classifier.*` keys a sequence classifier, one with
    `qa_outputs.*` a span head, one without decoder keys the encoder alone. The result has the source's dtype and
    device and is in eval mode.

    Args:
        model_or_state_dict: an hfzoo encoder-decoder of the five classes above, or its state dict.
        config: required with a state dict (ignored for a model): the `HfzooEncoderDecoderConfig`.
        attn_implementation: attention backend of the result; default: the source model's backend (a
            model), transformers' default (a state dict).

    Returns:
        The T5 model (`T5_HEADS`).

    Raises:
        TypeError: a state dict without `config`, or an unsupported input / config type.
        ValueError: a config T5 cannot express (see `t5_config_from_hfzoo`); keys that do not match the
            config; a tied config whose `lm_head.weight` differs from the embeddings.
    """
    state, config, attn_implementation = read_source(
        model_or_state_dict, HFZOO_T5_HEADS, config, attn_implementation, "hfzoo_to_t5", "HfzooEncoderDecoderConfig"
    )
    t5_config = t5_config_from_hfzoo(config)
    head = _t5_head_of_state(state, "classifier.", ("model.decoder.", "decoder."))
    if head == _QUESTION_ANSWERING:
        t5_config.num_labels = 2  # T5ForQuestionAnswering sizes qa_outputs by num_labels
    if head == _ENCODER:  # the encoder alone has its weights at the top level
        state = {f"model.{key}": value for key, value in state.items()}
    embeddings = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight")
    for key in embeddings[: 1 if head in _ENCODER_ONLY else 2]:
        state.setdefault(key, state["model.shared.weight"])
    if head == _LANGUAGE_MODEL:
        state = resolve_tied_head(state, config.tie_word_embeddings, "model.shared.weight", "lm_head.weight", "hfzoo")
    inverse = {hfzoo_key: t5_key for t5_key, hfzoo_key in _t5_key_map(config, head).items()}
    check_keys(set(state), set(inverse), "hfzoo")
    model = T5_HEADS[head](t5_config)
    if head == _LANGUAGE_MODEL and not config.tie_word_embeddings:
        model.lm_head.weight = torch.nn.Parameter(torch.empty_like(model.lm_head.weight))
        model.all_tied_weights_keys.pop("lm_head.weight", None)  # save_pretrained must keep it
    body = "transformer." if head in _T5_BODY_UNDER_TRANSFORMER else ""
    renamed = {
        (
            inverse[key] if inverse[key].startswith(("classification_head.", "classifier.")) else body + inverse[key]
        ): value
        for key, value in state.items()
    }
    return load_converted(model, renamed, attn_implementation)
