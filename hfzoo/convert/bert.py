"""BERT (`BertModel` and its masked-LM, classification and question-answering heads) <-> the hfzoo encoder.

BERT (Devlin et al. 2019) is a post-LN encoder with learned absolute positions, token-type (segment)
embeddings, a LayerNorm over the summed embeddings, biases everywhere, exact GELU and eps 1e-12:
`HfzooEncoderConfig` with `norm_position="post"`, `embedding_norm=True`, `position_embedding_type="learned"`.
Only the key names differ; every tensor is copied unchanged (nn.Linear on both sides). The heads:
  BertForMaskedLM's `cls.predictions` (transform dense + act + LayerNorm, decoder + bias) = hfzoo's `lm_head`;
  BertForSequenceClassification's `bert.pooler.dense` (+ tanh) and `classifier` = hfzoo's
  `classifier.dense` and `classifier.out_proj` (`SequenceClassificationHead`);
  BertForQuestionAnswering's `qa_outputs` (no pooler) = hfzoo's `qa_outputs` (`HfzooEncoderForQuestionAnswering`);
  BertForTokenClassification's `classifier` (no pooler) = hfzoo's `classifier` (`HfzooEncoderForTokenClassification`).
BERT keys are given without the `bert.` prefix of the BertFor* models.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path

import torch
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)

from ..hub import copy_sentence_transformers_files, local_checkpoint_folder
from ..models.encoder import (
    HfzooEncoderConfig,
    HfzooEncoderForMaskedLM,
    HfzooEncoderForQuestionAnswering,
    HfzooEncoderForSequenceClassification,
    HfzooEncoderForTokenClassification,
    HfzooEncoderModel,
)
from .common import (
    build_hfzoo_config,
    check_activation,
    check_answer_head,
    check_fixed_fields,
    check_keys,
    check_multi_head,
    check_standard_head_dim,
    class_position,
    load_converted,
    read_source,
    resolve_tied_head,
)

logger = logging.getLogger(__name__)

#: The tokenizer files of a BERT checkpoint (fetched with a hub id's config and weights).
BERT_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json")

__all__ = [
    "BERT_TO_HFZOO_GLOBAL",
    "BERT_TO_HFZOO_HEADS",
    "BERT_TO_HFZOO_LAYER",
    "BERT_TO_HFZOO_TOKEN_CLASSIFIER",
    "bert_config_from_hfzoo",
    "bert_state_dict_to_hfzoo",
    "bert_to_hfzoo",
    "convert_bert_checkpoint",
    "hfzoo_config_from_bert",
    "hfzoo_to_bert",
]

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
    ("qa_outputs.weight",                           "qa_outputs.weight"),
    ("qa_outputs.bias",                             "qa_outputs.bias"),
)  # fmt: skip

BERT_TO_HFZOO_TOKEN_CLASSIFIER: tuple[tuple[str, str], ...] = (
    # BertForTokenClassification's per-token layer (it has no pooler): hfzoo's token classifier has the same name
    ("classifier.weight", "classifier.weight"),
    ("classifier.bias", "classifier.bias"),
)

# hfzoo fields BERT fixes, with the value BERT needs and why.
_BERT_FIXED = {
    "norm_position": ("post", "BERT is post-LN (LayerNorm after each residual addition)"),
    "embedding_norm": (True, "BERT normalises the summed embeddings (embeddings.LayerNorm)"),
    "norm_type": ("layer_norm", "BERT uses nn.LayerNorm"),
    "position_embedding_type": ("learned", "BERT has learned absolute positions"),
    "attention_bias": (True, "BERT's projections have biases"),
    "mlp_bias": (True, "BERT's projections have biases"),
}

# BertForPreTraining's next-sentence-prediction head (in the original BERT checkpoints): no hfzoo counterpart.
_BERT_NEXT_SENTENCE_HEAD = "cls.seq_relationship."

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
    check_activation("hidden_act", c.hidden_act)
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
    return build_hfzoo_config(HfzooEncoderConfig, fields, "BERT config")


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
    check_fixed_fields(config, _BERT_FIXED, "BERT")
    check_standard_head_dim(config, "BERT")
    check_multi_head(config, "BERT")
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


def bert_state_dict_to_hfzoo(
    state: Mapping[str, torch.Tensor], num_layers: int, token_classification: bool | None = None
) -> dict[str, torch.Tensor]:
    """Rename a BERT state dict (BertModel or one of the BertFor* classes `bert_to_hfzoo` takes) to hfzoo keys.

    Encoder keys go under `model.`; `bert.pooler.dense` becomes `classifier.dense` (hfzoo's pooler
    lives in its classification head), `classifier` becomes `classifier.out_proj`, `cls.predictions.*`
    becomes `lm_head.*`, `qa_outputs` keeps its name; BertForTokenClassification's `classifier` keeps its name
    too (`BERT_TO_HFZOO_TOKEN_CLASSIFIER`). Tensors are not copied. Position-id buffers of old checkpoints are dropped.

    Args:
        state: the BERT state dict, keys with or without the `bert.` prefix.
        num_layers: `num_hidden_layers`.
        token_classification: whether `classifier` is BertForTokenClassification's; default: when the state has a
            `classifier` and no pooler (BertForSequenceClassification always has one).

    Returns:
        The hfzoo state dict.

    Raises:
        ValueError: a key this mapping does not know, or a missing encoder key (both listed); a
            question-answering head with other than 2 outputs (`qa_outputs`: start and end).
    """
    # Full BertFor* names: the encoder (and pooler) under `bert.`, the heads at the top level.
    state = {
        (k if k.startswith(("cls.", "classifier.", "qa_outputs.", "bert.")) else f"bert.{k}"): v
        for k, v in state.items()
    }
    state = {k: v for k, v in state.items() if k != "bert.embeddings.position_ids"}
    if _BERT_MLM_BIAS_ALIAS[0] in state:
        bias = state.pop(_BERT_MLM_BIAS_ALIAS[0])
        state.setdefault(_BERT_MLM_BIAS_ALIAS[1], bias)
    names = dict(BERT_TO_HFZOO_HEADS)
    if token_classification is None:
        token_classification = _has_token_classifier(state)
    if token_classification:
        names.update(BERT_TO_HFZOO_TOKEN_CLASSIFIER)
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
    if "qa_outputs.weight" in state:
        check_answer_head(state["qa_outputs.weight"], "BertForQuestionAnswering", "HfzooEncoderForQuestionAnswering")
    return {names[k]: v for k, v in state.items()}


def _hfzoo_state_dict_to_bert(
    state: Mapping[str, torch.Tensor], with_prefix: bool, token_classification: bool = False
) -> dict[str, torch.Tensor]:
    """Rename hfzoo encoder keys back to BERT keys (`bert.` prefix on the encoder when `with_prefix`)."""
    names = {h: b for b, h in BERT_TO_HFZOO_HEADS}
    if token_classification:
        names.update({h: b for b, h in BERT_TO_HFZOO_TOKEN_CLASSIFIER})
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
_BERT_CLASSES = (
    BertModel,
    BertForMaskedLM,
    BertForSequenceClassification,
    BertForQuestionAnswering,
    BertForTokenClassification,
)
_HFZOO_ENCODER_CLASSES = (
    HfzooEncoderModel,
    HfzooEncoderForMaskedLM,
    HfzooEncoderForSequenceClassification,
    HfzooEncoderForQuestionAnswering,
    HfzooEncoderForTokenClassification,
)
_BASE, _MASKED_LM, _SEQUENCE_CLASSIFICATION, _QUESTION_ANSWERING, _TOKEN_CLASSIFICATION = range(len(_BERT_CLASSES))
#: The BERT classes `bert_to_hfzoo` takes and `hfzoo_to_bert` returns (annotations).
BertModels = (
    BertModel | BertForMaskedLM | BertForSequenceClassification | BertForQuestionAnswering | BertForTokenClassification
)
#: The hfzoo encoder classes they correspond to.
HfzooEncoders = (
    HfzooEncoderModel
    | HfzooEncoderForMaskedLM
    | HfzooEncoderForSequenceClassification
    | HfzooEncoderForQuestionAnswering
    | HfzooEncoderForTokenClassification
)


def _without_next_sentence_head(state: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    """`state` without `BertForPreTraining`'s next-sentence-prediction head (`cls.seq_relationship.*`).

    A logged warning names `source` and the keys left out; a state dict without them is returned as it is.
    """
    next_sentence_head = sorted(k for k in state if k.startswith(_BERT_NEXT_SENTENCE_HEAD))
    if not next_sentence_head:
        return state
    logger.warning(
        "%s: left out BERT's next-sentence-prediction head (%s): the hfzoo encoder has none (it converts to "
        "HfzooEncoderForMaskedLM, as BertForMaskedLM.from_pretrained would load it)",
        source,
        ", ".join(next_sentence_head),
    )
    return {k: v for k, v in state.items() if k not in next_sentence_head}


def _has_token_classifier(state: Mapping[str, torch.Tensor]) -> bool:
    """A `classifier` without a pooler: BertForTokenClassification's (BertForSequenceClassification pools)."""
    keys = [k.removeprefix("bert.") for k in state]
    return any(k.startswith("classifier.") for k in keys) and not any(k.startswith("pooler.") for k in keys)


def _bert_class_for_state(state: Mapping[str, torch.Tensor]) -> int:
    if any(k.startswith("qa_outputs.") for k in state):
        return _QUESTION_ANSWERING
    if any(k.startswith("classifier.") for k in state):
        return _TOKEN_CLASSIFICATION if _has_token_classifier(state) else _SEQUENCE_CLASSIFICATION
    if any(k.startswith(("cls.predictions.", "lm_head.")) for k in state):
        return _MASKED_LM
    return _BASE


def bert_to_hfzoo(
    bert_model_or_state_dict: BertModels | Mapping[str, torch.Tensor],
    config: BertConfig | HfzooEncoderConfig | None = None,
    *,
    attn_implementation: str | None = None,
) -> HfzooEncoders:
    """Convert a BERT model (or state dict) to the hfzoo encoder class computing the same outputs.

    `BertModel` -> `HfzooEncoderModel` (same `last_hidden_state`; a pooler, which hfzoo keeps in its
    classification head, is dropped), `BertForMaskedLM` -> `HfzooEncoderForMaskedLM`,
    `BertForSequenceClassification` -> `HfzooEncoderForSequenceClassification` (pooler ->
    `classifier.dense`, `classifier` -> `classifier.out_proj`), `BertForQuestionAnswering` ->
    `HfzooEncoderForQuestionAnswering` (same `start_logits` / `end_logits`), `BertForTokenClassification` ->
    `HfzooEncoderForTokenClassification`, `BertForPreTraining` (the original BERT releases) ->
    `HfzooEncoderForMaskedLM` (its next-sentence-prediction head and pooler left out, with a logged warning
    naming the head). A state dict picks the class from its keys (`qa_outputs.*`: question
    answering; `classifier.*`: sequence classification with a pooler, token classification without;
    `cls.predictions.*`: masked LM; else the bare encoder). Tensors are renamed only (`BERT_TO_HFZOO_*` tables), so
    `hfzoo_to_bert` returns the original state dict exactly. The result has the source's dtype and device, eval mode.

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
        ValueError: a config hfzoo cannot express (see `hfzoo_config_from_bert`), state-dict keys
            that do not match the config (listed), or a question-answering head with other than 2 outputs.
    """
    source = bert_model_or_state_dict
    state, config, attn_implementation = read_source(
        source, (*_BERT_CLASSES, BertForPreTraining), config, attn_implementation,
        "bert_to_hfzoo", "BertConfig or HfzooEncoderConfig",
    )  # fmt: skip
    state = _without_next_sentence_head(
        state, type(source).__name__ if isinstance(source, torch.nn.Module) else "the state dict"
    )
    index = class_position(source, _BERT_CLASSES)
    if index is None:  # a state dict, or BertForPreTraining (its NSP head left out): masked LM
        index = _bert_class_for_state(state)
    if index in (_BASE, _MASKED_LM):  # a pooler (BertModel, BertForPreTraining) serves no head there
        state = {k: v for k, v in state.items() if not k.removeprefix("bert.").startswith("pooler.")}
    if isinstance(config, BertConfig):
        hfzoo_config = hfzoo_config_from_bert(config)
    else:
        bert_config_from_hfzoo(config)  # raises if BERT cannot express it
        hfzoo_config = config
    hfzoo_state = bert_state_dict_to_hfzoo(state, hfzoo_config.num_hidden_layers, index == _TOKEN_CLASSIFICATION)
    if index == _MASKED_LM:
        hfzoo_state = resolve_tied_head(
            hfzoo_state, hfzoo_config.tie_word_embeddings, "model.embed_tokens.weight", "lm_head.decoder.weight", "BERT"
        )
    if index == _BASE:  # the bare encoder's state dict has no `model.` prefix
        hfzoo_state = {k.removeprefix("model."): v for k, v in hfzoo_state.items() if k.startswith("model.")}
    model = _HFZOO_ENCODER_CLASSES[index](hfzoo_config)
    check_keys(set(hfzoo_state), set(model.state_dict()), "BERT")
    return load_converted(model, hfzoo_state, attn_implementation)


def hfzoo_to_bert(model: HfzooEncoders, *, attn_implementation: str | None = None) -> BertModels:
    """Convert an hfzoo encoder model to the BERT class computing the same outputs (inverse of `bert_to_hfzoo`).

    `HfzooEncoderModel` -> `BertModel` without pooler, `HfzooEncoderForMaskedLM` -> `BertForMaskedLM`,
    `HfzooEncoderForSequenceClassification` -> `BertForSequenceClassification`,
    `HfzooEncoderForQuestionAnswering` -> `BertForQuestionAnswering` (its config has `num_labels=2`, the start and
    end outputs BERT sizes `qa_outputs` by), `HfzooEncoderForTokenClassification` -> `BertForTokenClassification`.

    Args:
        model: the hfzoo encoder model.
        attn_implementation: attention backend of the result; default: the source model's.

    Returns:
        The BERT model (source dtype and device, eval mode).

    Raises:
        TypeError: `model` is not one of the five hfzoo encoder classes above.
        ValueError: a config BERT cannot express (see `bert_config_from_hfzoo`).
    """
    if not isinstance(model, _HFZOO_ENCODER_CLASSES):
        raise TypeError(f"expected an hfzoo encoder model, got {type(model).__name__}")
    index = class_position(model, _HFZOO_ENCODER_CLASSES)
    bert_config = bert_config_from_hfzoo(model.config)
    if index == _QUESTION_ANSWERING:
        bert_config.num_labels = 2  # BertForQuestionAnswering's qa_outputs has num_labels outputs
    state = _hfzoo_state_dict_to_bert(model.state_dict(), index != _BASE, index == _TOKEN_CLASSIFICATION)
    if index == _BASE:
        bert = BertModel(bert_config, add_pooling_layer=False)
    else:
        bert = _BERT_CLASSES[index](bert_config)
    if attn_implementation is None:
        attn_implementation = model.config._attn_implementation
    check_keys(set(state), set(bert.state_dict()), "hfzoo")
    return load_converted(bert, state, attn_implementation)


def convert_bert_checkpoint(bert_path: str | Path, output_dir: str | Path) -> Path:
    """Write an hfzoo encoder checkpoint folder from a BERT checkpoint folder (config, weights, tokenizer).

    Every tensor of the BERT checkpoint is kept: the encoder under `model.`, a masked-LM head as
    `lm_head.*`, and the pooler as `classifier.dense.*`, so that
    `AutoModelForSequenceClassification.from_pretrained(output_dir, num_labels=...)` starts from BERT's
    pretrained pooler exactly as `BertForSequenceClassification.from_pretrained(bert_path)` does (only
    `classifier.out_proj` is newly initialised). A finetuned `BertForSequenceClassification`,
    `BertForQuestionAnswering` or `BertForTokenClassification` checkpoint keeps its head, and its `architectures`
    names the hfzoo class that computes the same outputs. A `BertForPreTraining` checkpoint (the original BERT
    releases) converts to `HfzooEncoderForMaskedLM`: its next-sentence-prediction head (`cls.seq_relationship.*`),
    which hfzoo's encoder does not have, is left out with a logged warning, as `BertForMaskedLM.from_pretrained`
    leaves it out.

    Args:
        bert_path: a folder with a BERT `config.json` and `model.safetensors` (or `pytorch_model.bin`), or
            the hub id of one (those files fetched: `hfzoo.hub.local_checkpoint_folder`); its tokenizer files, if any,
            are copied, and so is the configuration of a sentence-transformers model (`modules.json`, its
            pooling and other modules: `hfzoo.hub.copy_sentence_transformers_files`), so that
            `SentenceTransformer(output_dir)` computes the source's embeddings.
        output_dir: the folder to write (created).

    Returns:
        `output_dir` as a `Path`.

    Raises:
        FileNotFoundError: no config or weights file in `bert_path`.
        OSError: a hub id that cannot be fetched.
        ValueError: not a BERT checkpoint, weights that do not match its config, or a question-answering head with
            other than 2 outputs.
    """
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig, AutoTokenizer

    source, output_dir = bert_path, Path(output_dir)
    bert_path = local_checkpoint_folder(source, ["config.json", "model.safetensors", *BERT_TOKENIZER_FILES])
    if not (bert_path / "config.json").is_file():
        raise FileNotFoundError(f"{source}: no config.json (expected a BERT checkpoint folder or hub id)")
    bert_config = AutoConfig.from_pretrained(bert_path)
    if not isinstance(bert_config, BertConfig):
        raise ValueError(f"{source}: model_type={bert_config.model_type!r}, expected 'bert'")
    if not (bert_path / "model.safetensors").is_file():
        bert_path = local_checkpoint_folder(source, ["pytorch_model.bin"])  # a hub id: only when needed
    if (bert_path / "model.safetensors").is_file():
        state = load_file(bert_path / "model.safetensors")
    elif (bert_path / "pytorch_model.bin").is_file():
        state = torch.load(bert_path / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise FileNotFoundError(f"{source}: neither model.safetensors nor pytorch_model.bin")
    state = _without_next_sentence_head(state, str(source))
    config = hfzoo_config_from_bert(bert_config)
    hfzoo_state = bert_state_dict_to_hfzoo(state, config.num_hidden_layers)
    if config.tie_word_embeddings:
        hfzoo_state.pop("lm_head.decoder.weight", None)  # restored from the embeddings by the tie
    output_dir.mkdir(parents=True, exist_ok=True)
    config.architectures = [_HFZOO_ENCODER_CLASSES[_bert_class_for_state(state)].__name__]
    config.save_pretrained(output_dir)
    save_file({k: v.contiguous() for k, v in hfzoo_state.items()}, output_dir / "model.safetensors", {"format": "pt"})
    if (bert_path / "tokenizer_config.json").is_file() or (bert_path / "vocab.txt").is_file():
        AutoTokenizer.from_pretrained(bert_path).save_pretrained(output_dir)
    copy_sentence_transformers_files(source, output_dir)
    return output_dir
