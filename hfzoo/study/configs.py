"""The model config of each study row: the base (preset + `config_overrides`) plus the row, in the study's family.

Also what a config is built and measured with: the tokenizer's fields (`planned_tokenizer_fields` before the
study's tokenizer exists), the pretraining model class, its parameter count and an encoder-decoder's target
length.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import torch
from huggingface_hub.errors import StrictDataclassError
from transformers import CONFIG_MAPPING, PreTrainedConfig

from ..data.collators import compute_input_and_target_lengths
from ..models.modern import STUDY_ROWS
from ..models.narang import resolve_row
from ..models.presets import build_config
from ..tokenization import FAMILY_SPECIAL_TOKENS
from .protocol import FAMILIES
from .settings import StudySettings


def _overrides_and_literals(overrides: dict[str, Any]) -> tuple[dict, dict]:
    """Split overrides for `build_config`: string values "none"/"null" are passed as literal fields.

    `build_config` reads the strings "none" and "null" of `--config_overrides` as None; the study's values
    are already typed (YAML), so a choice named "none" (`norm_type`, `block_sharing`,
    `position_embedding_type`) must reach the config as that string.
    """
    literal = {k: v for k, v in overrides.items() if isinstance(v, str) and v.lower() in ("none", "null")}
    return {k: v for k, v in overrides.items() if k not in literal}, literal


def build_variant_config(
    settings: StudySettings, variant: str, tokenizer_fields: dict[str, Any], _suggest: bool = True
) -> PreTrainedConfig:
    """The model config of one variant: the base (preset + `config_overrides`) plus the row, resolved.

    Args:
        settings: the study settings.
        variant: a row name of `hfzoo.models.modern.STUDY_ROWS`.
        tokenizer_fields: `vocab_size` and the special token ids (from the tokenizer).

    Returns:
        The validated config.

    Raises:
        ValueError: an unknown override key, a row that does not scale to this base, an invalid config; a row
            without a form in the study's family names the families it has one in. The advice given is what a
            study user can change (not a field the row itself sets: `_study_advice`).
    """
    checked, literal = _overrides_and_literals(settings.config_overrides)
    known = {f.name for f in dataclasses.fields(type(build_config(settings.config_name)))}
    unknown = sorted(set(literal) - known)
    if unknown:
        raise ValueError(f"config_overrides: unknown keys {unknown}")
    base = build_config(settings.config_name, checked, **literal, **tokenizer_fields)
    family = FAMILIES[settings.family]
    if base.model_type not in (family.model_type, FAMILIES["encoder-decoder"].model_type):
        raise ValueError(
            f"config_name {settings.config_name!r} is a {base.model_type} model; family={settings.family!r} "
            f"needs a {family.model_type} or an encoder-decoder base"
        )
    changes = resolve_row(variant, base.to_dict(), rows=STUDY_ROWS)
    checked_row, literal_row = _overrides_and_literals(changes)
    overrides = {**checked, **checked_row}
    fields = {**{k: v for k, v in literal.items() if k not in changes}, **literal_row, **tokenizer_fields}
    # head_dim stays the base's (the paper keeps d_kv = 64 when a row changes the number of heads)
    overrides.setdefault("head_dim", base.head_dim)
    try:
        config = build_config(settings.config_name, overrides, **fields)
    except ValueError as err:
        raise ValueError(f"variant {variant!r}: {_study_advice(str(err), changes)}") from None
    if config.model_type == family.model_type:
        return config
    try:
        return single_stack_config(config, family.name, changed=changes)
    except ValueError as err:
        message = f"variant {variant!r} in the {family.name} family: {_study_advice(str(err), changes)}"
        if _suggest:
            other = [
                name
                for name in FAMILIES
                if name != family.name
                and _builds(dataclasses.replace(settings, family=name), variant, tokenizer_fields)
            ]
            message += f"; leave the row out of variants, or study it with family {' or '.join(map(repr, other))}"
            if not other:
                message = message.rpartition(", or study")[0]
        raise ValueError(message) from None


def _builds(settings: StudySettings, variant: str, tokenizer_fields: dict[str, Any]) -> bool:
    """Whether `variant` gives a valid config with these settings."""
    try:
        build_variant_config(settings, variant, tokenizer_fields, _suggest=False)
    except ValueError:
        return False
    return True


def _study_advice(message: str, changes: dict[str, Any]) -> str:
    """A config refusal as a study user can act on it: the advice to change a field the row sets is left out.

    Config refusals end with their advice after the last "; " (e.g. "...; set transparent_attention=False"); a
    study user cannot change a field the row itself sets, only the base (`config_overrides`), the family
    or the variants.
    """
    head, sep, advice = message.rpartition("; ")
    if sep and any(re.search(rf"\b{re.escape(key)}\b", advice) for key in changes):
        return head
    return message


def single_stack_config(config: PreTrainedConfig, family: str, changed=()) -> PreTrainedConfig:
    """An encoder-decoder config as a decoder-only or encoder-only model of the same architecture.

    The one stack has the encoder-decoder's width, heads, feed-forward, norms, position scheme and every other
    shared field, and the layers of both its stacks (`num_hidden_layers + num_decoder_layers`: about the
    encoder-decoder's parameters, less its cross-attention), so that a row's change (GLU feed-forward, twice
    the layers, ...) means the same in every family. An encoder gets no segment embeddings
    (`type_vocab_size=0`), as the encoder-decoder baseline has none.

    Args:
        config: an hfzoo encoder-decoder config.
        family: `decoder` or `encoder` (a key of `protocol.FAMILIES`).
        changed: config fields the study row sets; a field only encoder-decoders have cannot carry over
            (`num_decoder_layers` aside: it is part of the sum).

    Returns:
        The family's validated config.

    Raises:
        ValueError: `changed` names an encoder-decoder-only field (e.g. the Funnel Transformer row's
            `decoder_layer_stack`), or the family's config refuses a value (e.g. `block_sharing="encoder"`).
    """
    target_class = CONFIG_MAPPING[FAMILIES[family].model_type]
    own_fields = {f.name for f in dataclasses.fields(target_class)}
    only_encoder_decoder = {f.name for f in dataclasses.fields(type(config))} - own_fields
    carried = sorted(set(changed) & only_encoder_decoder - {"num_decoder_layers"})  # the depth is summed below
    if carried:
        raise ValueError(f"changes {carried}, which only an encoder-decoder has; the row has no {family} form")
    values = {k: v for k, v in config.to_dict().items() if k not in only_encoder_decoder and k != "model_type"}
    values["num_hidden_layers"] = config.num_hidden_layers + config.num_decoder_layers
    values["is_encoder_decoder"] = False
    if family == "encoder":
        values["type_vocab_size"] = 0
    try:
        return target_class.from_dict(values)
    except (TypeError, ValueError, StrictDataclassError) as err:
        raise ValueError(str(err.__cause__ if err.__cause__ is not None else err)) from None


def planned_tokenizer_fields(family: str, vocab_size: int) -> dict[str, Any]:
    """`vocab_size` and the special token ids that the study's tokenizer of `family` will have.

    `hfzoo.tokenization.train_bpe_tokenizer` gives the family's special tokens (`FAMILY_SPECIAL_TOKENS`) the
    first ids, in their listed order (a token with two roles once), so the configs can be checked before
    the tokenizer is trained.
    """
    roles = FAMILY_SPECIAL_TOKENS[family]["special_tokens"]
    tokens = list(dict.fromkeys(roles.values()))
    ids = {role: tokens.index(token) for role, token in roles.items()}
    return {
        "vocab_size": vocab_size,
        "pad_token_id": ids.get("pad_token"),
        "eos_token_id": ids.get("eos_token"),
        "bos_token_id": ids.get("bos_token"),
    }


def _tokenizer_fields(tokenizer) -> dict[str, Any]:
    return {
        "vocab_size": len(tokenizer),
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": tokenizer.bos_token_id,
    }


def _row_changes(settings: StudySettings, variant: str, tokenizer) -> dict[str, Any]:
    """The variant's config changes to the study's base, with `Scaled` values resolved."""
    checked, literal = _overrides_and_literals(settings.config_overrides)
    base = build_config(settings.config_name, checked, **literal, **_tokenizer_fields(tokenizer))
    return resolve_row(variant, base.to_dict(), rows=STUDY_ROWS)


def pretraining_model_class(config: PreTrainedConfig):
    """The auto class the pretraining recipe builds `config` with (its family's objective's).

    Raises:
        ValueError: `config` is not of a study family (`protocol.FAMILIES`).
    """
    from ..training.objectives import get_objective

    for family in FAMILIES.values():
        if family.model_type == config.model_type:
            return get_objective(family.objective).auto_class
    raise ValueError(f"model_type {config.model_type!r} is not one of {[f.model_type for f in FAMILIES.values()]}")


def count_parameters(config: PreTrainedConfig) -> int:
    """Unique parameters (tied matrices once) of the pretraining model (with its LM head), built on the meta device."""
    with torch.device("meta"):
        model = pretraining_model_class(config).from_config(config)
    return sum(p.numel() for p in model.parameters())


def target_length(settings: StudySettings) -> int | None:
    """Decoder tokens per sequence of an encoder-decoder study (the span-corrupted targets); None otherwise."""
    if settings.family != "encoder-decoder":
        return None
    return compute_input_and_target_lengths(
        settings.block_size, settings.noise_density, settings.mean_noise_span_length
    )[1]


def ladder_size_settings(settings: StudySettings, hidden_size: int) -> StudySettings:
    """The settings of one size of a scale ladder: the base's width scaled to `hidden_size`, its depth kept.

    The width rule: with r = hidden_size / (the base's hidden_size), the feed-forward width becomes
    round(r x intermediate_size) and the per-head width r x head_dim (d_kv), while the number of heads, the
    number of layers and the vocabulary stay the base's. The base's proportions (d_ff / d_model, heads x d_kv /
    d_model) and depth are those of every size, as in Tay et al. 2022's width-only scaling of T5, so a row's
    changes (GLU rows' d_ff x 2/3, the deeper row's half-width heads, ...) resolve against each size exactly as
    they do against the base (`build_variant_config`). Depth is not scaled: rows that act per layer (experts on
    every 4th layer, block sharing) keep the same layout at every size.

    Args:
        settings: the study settings (their `config_overrides` describe the base).
        hidden_size: d_model of this size (a positive integer).

    Returns:
        The settings with `config_overrides` giving this size's `hidden_size`, `intermediate_size` and
        `head_dim`.

    Raises:
        ValueError: `hidden_size` is not a positive integer, or gives a fractional head width (naming the size,
            the base's head_dim and hidden_size, and which sizes give whole ones).
    """
    if isinstance(hidden_size, bool) or not isinstance(hidden_size, int) or hidden_size < 1:
        raise ValueError(f"ladder.hidden_sizes: {hidden_size!r} is not a positive integer")
    checked, literal = _overrides_and_literals(settings.config_overrides)
    base = build_config(settings.config_name, checked, **literal)
    ratio = hidden_size / base.hidden_size
    head_dim = base.head_dim * ratio
    if head_dim != int(head_dim):
        step = base.hidden_size // math.gcd(base.hidden_size, base.head_dim)
        raise ValueError(
            f"ladder.hidden_sizes: {hidden_size} gives a per-head width of {head_dim:g} (the base's head_dim "
            f"{base.head_dim} x {hidden_size}/{base.hidden_size}); use multiples of {step}"
        )
    overrides = {
        **settings.config_overrides,
        "hidden_size": hidden_size,
        "intermediate_size": max(1, round(base.intermediate_size * ratio)),
        "head_dim": int(head_dim),
    }
    return dataclasses.replace(settings, config_overrides=overrides)
