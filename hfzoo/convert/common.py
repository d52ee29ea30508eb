"""Helpers shared by the converters of `hfzoo.convert` (GPT-2, BERT, T5, Llama): config checks, key checks, loading.

Every converter builds a config on the other side (refusing settings that side cannot express, with the
field named), re-lays out a state dict, checks its keys against what the target model expects, and
loads it strictly into a model of the source's dtype and device.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from huggingface_hub.errors import StrictDataclassError
from transformers.activations import ACT2FN

from ..models.decoder import (
    HfzooDecoderForCausalLM,
    HfzooDecoderForQuestionAnswering,
    HfzooDecoderForSequenceClassification,
    HfzooDecoderForTokenClassification,
)
from ..modules.attention import has_fused_qkv_projections

#: The hfzoo decoder's classes the decoder converters (GPT-2, the Llama family) map, the language model first; a
#: model converts to the source family's class at the same position.
HFZOO_DECODER_HEADS = (
    HfzooDecoderForCausalLM,
    HfzooDecoderForSequenceClassification,
    HfzooDecoderForTokenClassification,
    HfzooDecoderForQuestionAnswering,
)
#: The classes of `HFZOO_DECODER_HEADS` (annotations).
HfzooDecoderHeads = (
    HfzooDecoderForCausalLM
    | HfzooDecoderForSequenceClassification
    | HfzooDecoderForTokenClassification
    | HfzooDecoderForQuestionAnswering
)
#: The positions of `HFZOO_DECODER_HEADS`.
CAUSAL_LM, SEQUENCE_CLASSIFICATION, TOKEN_CLASSIFICATION, QUESTION_ANSWERING = range(len(HFZOO_DECODER_HEADS))
#: The dropout transformers' decoder token classifiers (`GPT2ForTokenClassification`, `GenericForTokenClassification`)
#: apply when their config sets no `classifier_dropout` (nor `hidden_dropout`, which GPT-2's and Llama's lack).
TRANSFORMERS_CLASSIFIER_DROPOUT = 0.1


def class_position(obj: Any, classes: tuple[type, ...]) -> int | None:
    """The position in `classes` of the first class `obj` is an instance of (a subclass counts), else None.

    The converters keep matching classes at matching positions (`HFZOO_DECODER_HEADS` and each family's heads), so
    the position of a model's class picks the class to convert it to.
    """
    return next((i for i, cls in enumerate(classes) if isinstance(obj, cls)), None)


def task_head_architectures(config: Any) -> list[str]:
    """The names in `config.architectures` that are task heads, e.g. `Qwen3ForSequenceClassification`.

    A task head is neither a language model (`...ForCausalLM`, `...LMHeadModel`) nor a bare stack (`...Model`, but
    not `...HeadsModel`: GPT-2's `GPT2DoubleHeadsModel` is a language model with a multiple-choice head). A
    checkpoint of such a head loaded as its family's language model would lose the head's weights.

    Args:
        config: a transformers or hfzoo config (`architectures` may be None).

    Returns:
        The task heads' class names, in the config's order (empty when there are none).
    """
    return [
        name
        for name in config.architectures or []
        if not name.endswith(("ForCausalLM", "LMHeadModel")) and (not name.endswith("Model") or "Heads" in name)
    ]


def task_fields(config: Any, classifier_dropout: float | None) -> dict[str, Any]:
    """The task fields a converter carries from one side's config to the other's.

    Args:
        config: the source config (transformers' or hfzoo's).
        classifier_dropout: the rate the source's token classifier applies; None leaves it out (the target's
            default is that rate).

    Returns:
        `id2label`, `label2id` (None when the source has none: transformers leaves it None beside an explicit
        `id2label`), `problem_type` and, unless None, `classifier_dropout`, as config keyword arguments.
    """
    fields = {
        "id2label": dict(config.id2label),
        "label2id": None if config.label2id is None else dict(config.label2id),
        "problem_type": config.problem_type,
    }
    if classifier_dropout is not None:
        fields["classifier_dropout"] = classifier_dropout
    return fields


def decoder_task_fields(config: Any, to_hfzoo: bool) -> dict[str, Any]:
    """`task_fields` between a transformers decoder config (GPT-2, Llama, ...) and an `HfzooDecoderConfig`.

    The token classifier's dropout is carried as the rate each side applies: transformers' `classifier_dropout`,
    else `TRANSFORMERS_CLASSIFIER_DROPOUT`; hfzoo's `classifier_dropout`, else `hidden_dropout_prob`. Towards
    transformers it is set only where it is not that default, so a round trip gives the source config back.

    Args:
        config: the source config.
        to_hfzoo: True for transformers -> hfzoo, False for hfzoo -> transformers.

    Returns:
        The target config's keyword arguments (`task_fields`).
    """
    if to_hfzoo:
        rate = getattr(config, "classifier_dropout", None)
        return task_fields(config, TRANSFORMERS_CLASSIFIER_DROPOUT if rate is None else rate)
    rate = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
    return task_fields(config, None if rate == TRANSFORMERS_CLASSIFIER_DROPOUT else rate)


def read_source(
    source: Any,
    model_classes: tuple[type, ...],
    config: Any,
    attn_implementation: str | None,
    function: str,
    config_classes: str,
) -> tuple[dict[str, torch.Tensor], Any, str | None]:
    """Accept a converter's input: a model of `model_classes`, or a state dict with its config.

    Args:
        source: the model or state dict given to the converter.
        model_classes: the model classes the converter accepts.
        config: the config passed with a state dict (ignored for a model, whose own config is used).
        attn_implementation: the requested backend of the result; None: the source model's (a model).
        function: the converter's name, for messages.
        config_classes: the config classes a state dict may come with, for messages.

    Returns:
        `(state dict (a new dict), config, attn_implementation)`.

    Raises:
        TypeError: a state dict without `config`, or an input of another type.
        ValueError: a model whose query, key and value projections are fused (`fuse_qkv_projections`).
    """
    if isinstance(source, model_classes):
        if has_fused_qkv_projections(source):
            raise ValueError(
                f"{function}: the model's query, key and value projections are fused (fuse_qkv_projections): call "
                "model.unfuse_qkv_projections() first"
            )
        return dict(source.state_dict()), source.config, attn_implementation or source.config._attn_implementation
    if isinstance(source, Mapping):
        if config is None:
            raise TypeError(f"{function}: a state dict needs its config ({config_classes})")
        return dict(source), config, attn_implementation
    names = ", ".join(cls.__name__ for cls in model_classes)
    raise TypeError(f"expected a {names} or state dict, got {type(source).__name__}")


def check_fixed_fields(config: Any, fixed: Mapping[str, tuple[Any, str]], target: str) -> None:
    """Refuse a config whose architecture fields differ from what the target model family fixes.

    Args:
        config: the hfzoo config to convert (a field missing from an older config counts as the required value).
        fixed: `{field: (required value, why the target needs it)}`.
        target: the target's name in messages ("GPT-2", "BERT", "T5").

    Raises:
        ValueError: the first differing field, e.g. `norm_position='post' cannot be converted to GPT-2
            (GPT-2 is pre-LN ...; needs 'pre')`.
    """
    for name, (value, why) in fixed.items():
        if getattr(config, name, value) != value:
            raise ValueError(
                f"{name}={getattr(config, name)!r} cannot be converted to {target} ({why}; needs {value!r})"
            )


def check_activation(field: str, value: str) -> None:
    """Refuse an activation name that transformers' `ACT2FN` (used on both sides) does not know.

    Raises:
        ValueError: `value` is not a key of `ACT2FN` (the message names `field`).
    """
    if value not in ACT2FN:
        raise ValueError(f"{field}={value!r} is not a key of transformers' ACT2FN")


def check_standard_head_dim(config: Any, target: str) -> None:
    """Refuse a `head_dim` other than `hidden_size // num_attention_heads` (GPT-2 and BERT derive it).

    Raises:
        ValueError: the head size cannot be expressed by the target.
    """
    if config.hidden_size % config.num_attention_heads or config.head_dim != (
        config.hidden_size // config.num_attention_heads
    ):
        raise ValueError(
            f"head_dim={config.head_dim} cannot be converted to {target}, whose head size is "
            f"hidden_size // num_attention_heads = {config.hidden_size} // {config.num_attention_heads}"
        )


def check_multi_head(config: Any, target: str) -> None:
    """Refuse grouped-query attention (`num_key_value_heads` below `num_attention_heads`): GPT-2, BERT, T5 lack it.

    Raises:
        ValueError: naming both fields and their values.
    """
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    if kv_heads != config.num_attention_heads:
        raise ValueError(
            f"num_key_value_heads={kv_heads} cannot be converted to {target}, which has one key/value head per query "
            f"head (needs num_key_value_heads = num_attention_heads = {config.num_attention_heads})"
        )


def build_hfzoo_config(config_class: type, fields: dict[str, Any], source: str) -> Any:
    """Build and validate an hfzoo config from the fields a converter mapped.

    Args:
        config_class: `HfzooDecoderConfig`, `HfzooEncoderConfig` or `HfzooEncoderDecoderConfig`.
        fields: the config's keyword arguments.
        source: what the fields describe, for messages ("GPT-2 config ... as an hfzoo decoder config").

    Returns:
        The validated config.

    Raises:
        ValueError: hfzoo's validation refuses the fields (the message gives the cause).
    """
    try:
        return config_class(**fields)
    except (StrictDataclassError, TypeError, ValueError) as err:
        cause = err.__cause__ if err.__cause__ is not None else err
        raise ValueError(f"{source} cannot be expressed as an {config_class.model_type} config: {cause}") from err


def check_keys(given: set[str], expected: set[str], what: str) -> None:
    """Refuse a state dict whose keys are not exactly those its config implies.

    Raises:
        ValueError: lists the missing and the unexpected keys.
    """
    missing, unexpected = sorted(expected - given), sorted(given - expected)
    if missing or unexpected:
        raise ValueError(f"{what} state dict does not match its config: missing {missing}, unexpected {unexpected}")


def resolve_tied_head(
    state: dict[str, torch.Tensor], tied: bool, embed_key: str, head_key: str, what: str
) -> dict[str, torch.Tensor]:
    """Fill in a tied output layer missing from `state`; refuse a tied one that differs from the embeddings.

    Args:
        state: the state dict (updated in place and returned).
        tied: the config's `tie_word_embeddings`.
        embed_key: the input embedding's key.
        head_key: the output layer's key.
        what: the state dict's side in messages ("GPT-2", "hfzoo", ...).

    Returns:
        `state` with `head_key` present.

    Raises:
        ValueError: an untied config without `head_key`, or a tied one whose two tensors differ.
    """
    if head_key not in state:
        if not tied:
            raise ValueError(f"{what} state dict has no {head_key!r} and the config has tie_word_embeddings=False")
        state[head_key] = state[embed_key]
    elif tied and not torch.equal(state[head_key], state[embed_key]):
        raise ValueError(f"tie_word_embeddings=True but {what} {head_key!r} differs from {embed_key!r}")
    return state


def load_converted(
    model: torch.nn.Module, state: dict[str, torch.Tensor], attn_implementation: str | None
) -> torch.nn.Module:
    """Load a converted state dict strictly into `model`, in the state's dtype and device, in eval mode.

    Args:
        model: the freshly built target model.
        state: its complete state dict.
        attn_implementation: attention backend to set (None: keep the model's).

    Returns:
        `model`.
    """
    reference = state[next(iter(state))]
    model.to(device=reference.device, dtype=reference.dtype)
    model.load_state_dict(state, strict=True)
    if attn_implementation is not None:
        model.set_attn_implementation(attn_implementation)
    return model.eval()


def check_answer_head(weight: torch.Tensor, source_class: str, target_class: str) -> None:
    """Refuse a question-answering head whose `qa_outputs` is not `(2, hidden_size)` (a start and an end score).

    transformers' `BertForQuestionAnswering` and `T5ForQuestionAnswering` size `qa_outputs` by `num_labels`;
    hfzoo's span heads always have two outputs.

    Args:
        weight: the source's `qa_outputs.weight`, `(num_labels, hidden_size)`.
        source_class: the source class, for the message (`BertForQuestionAnswering`).
        target_class: the hfzoo class, for the message.

    Raises:
        ValueError: `weight` has other than 2 rows; the message names the count.
    """
    if weight.shape[0] != 2:
        raise ValueError(
            f"qa_outputs.weight has {weight.shape[0]} outputs ({source_class} with num_labels={weight.shape[0]}); "
            f"hfzoo's {target_class} scores a start and an end: 2 outputs"
        )
