"""Named model sizes as data, and building a config from a preset name or a path plus overrides.

`PRESETS` maps a name to the config fields that differ from the family's defaults, with
`model_type` naming the family. Recipes refer to a preset (`--config_name decoder-small`) and change
single fields with `--config_overrides "hidden_size=256,num_hidden_layers=4"`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

from huggingface_hub.errors import StrictDataclassError
from transformers import AutoConfig, PreTrainedConfig

from ..choices import choice_hint
from ..configuration_utils import other_models_name_hint


def parse_overrides(
    overrides: str | dict[str, Any] | None, argument: str | None = "--config_overrides"
) -> dict[str, str | Any]:
    """Parse `"key=value,key=value"` (transformers' `--config_overrides` format) into a dict.

    A list value is written in brackets, its commas kept: `"adaptive_input_cutoffs=[2500,8500],hidden_size=512"`.

    Args:
        overrides: the string, an already-parsed dict, or None.
        argument: the flag the string came from, for the message (None: the caller names it).

    Returns:
        `{key: value}` with string values (converted to the field's type by `build_config`).

    Raises:
        ValueError: an item without `=` or with an empty key.
    """
    if not overrides:
        return {}
    if isinstance(overrides, dict):
        return dict(overrides)
    parsed = {}
    for item in re.split(r",(?![^\[]*\])", overrides):  # commas outside [...]
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"{argument + ' ' if argument else ''}item {item!r} is not of the form key=value")
        parsed[key.strip()] = value.strip()
    return parsed


def _convert(key: str, value: Any, current: Any, annotation: str) -> Any:
    """Convert a string override to the type of the field it replaces."""
    if not isinstance(value, str):
        return value
    if value.lower() in ("none", "null") and ("None" in annotation or "Optional" in annotation):
        return None  # a field that may be None; elsewhere "none" is a value (position_embedding_type="none")
    if annotation.startswith("list["):  # a JSON list of the element type, e.g. [2500, 8500]
        try:
            items = json.loads(value)
        except json.JSONDecodeError:
            items = None
        element = int if "list[int]" in annotation else float if "list[float]" in annotation else str
        if not isinstance(items, list) or not all(type(item) is element for item in items):
            raise ValueError(
                f"--config_overrides {key}={value!r}: expected a list of {element.__name__}s in brackets, "
                "e.g. [2500,8500]"
            )
        return items
    kind = type(current) if current is not None else None
    if kind is None:  # a field that is None by default: infer from its annotation
        kind = float if "float" in annotation else int if "int" in annotation else bool if "bool" in annotation else str
    try:
        if kind is bool:
            if value.lower() in ("true", "1", "yes"):
                return True
            if value.lower() in ("false", "0", "no"):
                return False
            raise ValueError
        if kind is int:
            return int(value)
        if kind is float:
            return float(value)
    except ValueError:
        raise ValueError(
            f"--config_overrides {key}={value!r}: expected {'an' if kind is int else 'a'} {kind.__name__}"
        ) from None
    return value


def build_config(name_or_path: str, overrides: str | dict[str, Any] | None = None, **fields: Any) -> PreTrainedConfig:
    """Build a validated config from a preset name, a checkpoint folder or a `config.json`, plus overrides.

    `head_dim` follows `hidden_size / num_attention_heads` when an override changes either of them
    and the base config's `head_dim` was the derived value; likewise `num_key_value_heads` follows a new
    `num_attention_heads` when it equalled the old one (multi-head attention).

    Args:
        name_or_path: a key of `PRESETS`, a folder holding `config.json`, or a JSON file.
        overrides: `"key=value,..."` or a dict; each key must be an existing field of the config.
        **fields: further fields set by the caller (e.g. token ids from the tokenizer); unlike
            `overrides`, these are not checked against the config's fields.

    Returns:
        The config (an hfzoo config class for hfzoo presets and checkpoints).

    Raises:
        ValueError: an unknown preset or path, an unknown override key, an override value of the
            wrong type, or a resulting config that fails validation (message names the field).
    """
    if name_or_path in PRESETS:
        base = dict(PRESETS[name_or_path])
    elif Path(name_or_path).is_file():
        base = json.loads(Path(name_or_path).read_text())
    elif (Path(name_or_path) / "config.json").is_file():
        base = AutoConfig.from_pretrained(name_or_path).to_dict()
    else:
        raise ValueError(
            f"--config_name {name_or_path!r} is neither a preset ({', '.join(sorted(PRESETS))}) "
            "nor a config.json / checkpoint folder"
        )
    model_type = base.pop("model_type", None)
    if model_type is None:
        raise ValueError(f"--config_name {name_or_path!r}: no model_type in the config")
    try:
        config_class = type(AutoConfig.for_model(model_type))
    except ValueError as err:
        raise ValueError(f"--config_name {name_or_path!r}: unknown model_type {model_type!r}") from err
    known = {f.name: f for f in dataclasses.fields(config_class)} if dataclasses.is_dataclass(config_class) else {}
    defaults = config_class()
    parsed = parse_overrides(overrides)
    hidden = base.get("hidden_size", getattr(defaults, "hidden_size", None))
    heads = base.get("num_attention_heads", getattr(defaults, "num_attention_heads", None))
    head_dim_derived = hidden and heads and base.get("head_dim") in (None, hidden // heads)
    kv_heads_derived = base.get("num_key_value_heads") in (None, heads)  # multi-head: follows the heads
    for key, value in parsed.items():
        if key not in known:
            hint = other_models_name_hint(key, known)
            if hint:
                raise ValueError(f"--config_overrides: unknown key {key!r} for {model_type}: {hint}")
            generic = {f.name for f in dataclasses.fields(PreTrainedConfig)}
            valid = sorted(k for k in known if k not in generic)
            hint = choice_hint(key, valid, f"the fields of {config_class.__name__}")
            raise ValueError(f"--config_overrides: unknown key {key!r} for {model_type}; {hint}")
        current = base.get(key, getattr(defaults, key, None))
        base[key] = _convert(key, value, current, str(known[key].type))
    if head_dim_derived and "head_dim" not in parsed and {"hidden_size", "num_attention_heads"} & set(parsed):
        base.pop("head_dim", None)  # re-derived from the new hidden_size / num_attention_heads
    if kv_heads_derived and "num_key_value_heads" not in parsed and "num_attention_heads" in parsed:
        base.pop("num_key_value_heads", None)  # multi-head attention stays multi-head with the new heads
    base.update(fields)
    for key in ("transformers_version", "architectures", "_name_or_path", "auto_map"):
        base.pop(key, None)
    try:
        return AutoConfig.for_model(model_type, **base)
    except (TypeError, ValueError, StrictDataclassError) as err:
        cause = err.__cause__ if err.__cause__ is not None else err
        raise ValueError(f"invalid model config from {name_or_path!r}: {cause}") from err


def list_presets(model_type: str | None = None) -> list[str]:
    """Return the preset names, optionally only those of one `model_type`."""
    return sorted(k for k, v in PRESETS.items() if model_type is None or v["model_type"] == model_type)


PRESETS: dict[str, dict[str, Any]] = {
    # hfzoo defaults for every family: pre-LN, learned positions, GELU, tied embeddings.
    "decoder-tiny": {
        "model_type": "hfzoo_decoder",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 256,
        "max_position_embeddings": 512,
    },
    "decoder-small": {
        "model_type": "hfzoo_decoder",
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "intermediate_size": 1024,
        "max_position_embeddings": 1024,
    },
    "encoder-tiny": {
        "model_type": "hfzoo_encoder",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 256,
        "max_position_embeddings": 512,
    },
    "encoder-small": {
        "model_type": "hfzoo_encoder",
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "intermediate_size": 1024,
        "max_position_embeddings": 512,
    },
    "encoder-decoder-tiny": {
        "model_type": "hfzoo_encoder_decoder",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_decoder_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 256,
        "max_position_embeddings": 512,
    },
    "encoder-decoder-small": {
        "model_type": "hfzoo_encoder_decoder",
        "hidden_size": 256,
        "num_hidden_layers": 3,
        "num_decoder_layers": 3,
        "num_attention_heads": 4,
        "intermediate_size": 1024,
        "max_position_embeddings": 512,
    },
    "decoder-base": {
        "model_type": "hfzoo_decoder",
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
        "max_position_embeddings": 1024,
    },
    # GPT-2 small (Radford et al. 2019; 124M parameters), as `hfzoo.convert.hfzoo_config_from_gpt2(GPT2Config())`.
    "gpt2": {
        "model_type": "hfzoo_decoder",
        "vocab_size": 50257,
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
        "max_position_embeddings": 1024,
        "hidden_act": "gelu_new",
        "activation_dropout": 0.0,
        "layer_norm_eps": 1e-5,
        "norm_type": "layer_norm",
        "norm_position": "pre",
        "position_embedding_type": "learned",
        "attention_bias": True,
        "mlp_bias": True,
        "tie_word_embeddings": True,
    },
    # GPT-3 XL (Brown et al. 2020, "Language Models are Few-Shot Learners", Table 2.1: 24 layers, d_model 2048,
    # 16 heads of 128, context 2048; "1.3B"), with GPT-2's vocabulary and architecture as the paper describes
    # (§2.1; its alternating sparse attention is not reproduced): 1315.7M parameters
    # (tests/models/test_param_counts.py). The ~1B size of the scaling table in docs/distributed.md.
    "gpt3-xl": {
        "model_type": "hfzoo_decoder",
        "vocab_size": 50257,
        "hidden_size": 2048,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "intermediate_size": 8192,
        "max_position_embeddings": 2048,
        "hidden_act": "gelu_new",
        "activation_dropout": 0.0,
        "layer_norm_eps": 1e-5,
        "norm_type": "layer_norm",
        "norm_position": "pre",
        "position_embedding_type": "learned",
        "attention_bias": True,
        "mlp_bias": True,
        "tie_word_embeddings": True,
    },
    # The baseline of Narang et al. 2021 ("Do Transformer Modifications Transfer...", §2 and Table 1): a
    # T5-base-sized encoder-decoder as Mesh TensorFlow builds it: 12 + 12 pre-LN layers, ReLU, d_kv 64,
    # no biases, T5's bucketed relative attention bias shared across layers, unscaled attention scores
    # (T5 folds 1/sqrt(d_kv) into the initialisation), the three vocabulary matrices tied, no dropout in
    # pre-training. 222.9M parameters (the paper: 223M; tests/models/test_param_counts.py). Its Table 2 uses
    # learned absolute positions instead: `position_embedding_type=learned`.
    "narang-vanilla": {
        "model_type": "hfzoo_encoder_decoder",
        "vocab_size": 32128,
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_decoder_layers": 12,
        "num_attention_heads": 12,
        "head_dim": 64,
        "intermediate_size": 3072,
        "hidden_act": "relu",
        "norm_type": "layer_norm",
        "norm_position": "pre",
        "attention_bias": False,
        "mlp_bias": False,
        "position_embedding_type": "relative_attention_bias",
        "relative_attention_num_buckets": 32,
        "relative_attention_max_distance": 128,
        "share_relative_attention_bias": True,
        "scale_attention_scores": False,
        "max_position_embeddings": 512,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
        "tie_word_embeddings": True,
        "tie_encoder_decoder_embeddings": True,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "decoder_start_token_id": 0,
    },
    # T5 v1.0 base (Raffel et al. 2020; google-t5/t5-base, 223M parameters), as
    # `hfzoo.convert.hfzoo_config_from_t5(T5Config(d_model=768, d_ff=3072, num_layers=12, num_heads=12))`:
    # ReLU, output layer tied to the embeddings with its input scaled by d_model ** -0.5.
    "t5-v1.0": {
        "model_type": "hfzoo_encoder_decoder",
        "vocab_size": 32128,
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_decoder_layers": 12,
        "num_attention_heads": 12,
        "head_dim": 64,
        "intermediate_size": 3072,
        "hidden_act": "relu",
        "gated_mlp": False,
        "position_embedding_type": "relative_attention_bias",
        "relative_attention_num_buckets": 32,
        "relative_attention_max_distance": 128,
        "share_relative_attention_bias": True,
        "norm_type": "rms_norm",
        "norm_position": "pre",
        "rms_norm_eps": 1e-6,
        "attention_bias": False,
        "mlp_bias": False,
        "scale_attention_scores": False,
        "tie_word_embeddings": True,
        "scale_lm_head_input": True,
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "decoder_start_token_id": 0,
        "classifier_dropout": 0.0,
    },
    # BERT-base uncased (Devlin et al. 2019; 110M parameters), as `hfzoo.convert.hfzoo_config_from_bert(BertConfig())`:
    # post-LN, a LayerNorm over the summed embeddings, token types, exact GELU, eps 1e-12.
    "bert": {
        "model_type": "hfzoo_encoder",
        "vocab_size": 30522,
        "hidden_size": 768,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "intermediate_size": 3072,
        "max_position_embeddings": 512,
        "type_vocab_size": 2,
        "hidden_act": "gelu",
        "layer_norm_eps": 1e-12,
        "norm_type": "layer_norm",
        "norm_position": "post",
        "embedding_norm": True,
        "position_embedding_type": "learned",
        "attention_bias": True,
        "mlp_bias": True,
        "hidden_dropout_prob": 0.1,
        "attention_probs_dropout_prob": 0.1,
        "activation_dropout": 0.0,
        "tie_word_embeddings": True,
        "pad_token_id": 0,
    },
}

# T5 v1.1 base (google/t5-v1_1-base, 248M parameters): v1.0 with a GeGLU feed-forward (gelu_new, d_ff 2048)
# and an untied output layer without input scaling.
PRESETS["t5-v1.1"] = {
    **PRESETS["t5-v1.0"],
    "intermediate_size": 2048,
    "hidden_act": "gelu_new",
    "gated_mlp": True,
    "tie_word_embeddings": False,
    "scale_lm_head_input": False,
}

# The Llama architecture (Touvron et al. 2023, "LLaMA", §2.2), as transformers' `LlamaForCausalLM` runs it: pre-norm
# RMSNorm, SwiGLU feed-forward, rotary positions (rotate-half layout), no biases, no dropout; grouped-query
# attention through `num_key_value_heads`. `hfzoo.convert.hfzoo_to_llama` converts these to transformers' native
# Llama classes and back (docs/convert.md).
_LLAMA_ARCHITECTURE: dict[str, Any] = {
    "model_type": "hfzoo_decoder",
    "position_embedding_type": "rotary",
    "norm_type": "rms_norm",
    "norm_position": "pre",
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "gated_mlp": True,
    "attention_bias": False,
    "mlp_bias": False,
    "activation_dropout": 0.0,
}

PRESETS.update(
    {
        # A tiny Llama-shaped decoder for tests and smoke runs: 4 query heads sharing 2 key/value heads.
        "llama-tiny": {
            **_LLAMA_ARCHITECTURE,
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 128,
            "max_position_embeddings": 512,
            "tie_word_embeddings": False,
        },
        # The shape of SmolLM2-135M (HuggingFaceTB/SmolLM2-135M; Allal et al. 2025): 30 layers, width 576, 9 query
        # heads sharing 3 key/value heads, SwiGLU 1536, tied embeddings, RoPE base 100000, 8192 positions;
        # 134,515,008 parameters (tests/models/test_param_counts.py).
        "smollm2-135m": {
            **_LLAMA_ARCHITECTURE,
            "vocab_size": 49152,
            "hidden_size": 576,
            "num_hidden_layers": 30,
            "num_attention_heads": 9,
            "num_key_value_heads": 3,
            "intermediate_size": 1536,
            "max_position_embeddings": 8192,
            "rope_theta": 100000.0,
            "tie_word_embeddings": True,
        },
        # Qwen3 (Qwen Team 2025, "Qwen3 Technical Report" §2): Llama's architecture plus QK-norm, an RMSNorm with a
        # learned scale on each head's queries and keys before rotary (transformers' `Qwen3ForCausalLM`).
        "qwen3-tiny": {
            **_LLAMA_ARCHITECTURE,
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "intermediate_size": 128,
            "max_position_embeddings": 512,
            "rms_norm_eps": 1e-6,
            "qk_norm": "rms_norm",
            "tie_word_embeddings": True,
        },
        # The shape of Qwen3-0.6B (Qwen/Qwen3-0.6B): 28 layers, width 1024, 16 query heads of 128 sharing 8
        # key/value heads, SwiGLU 3072, tied embeddings, RoPE base 1000000, 40960 positions; 596,049,920 parameters
        # (tests/models/test_param_counts.py).
        "qwen3-0.6b": {
            **_LLAMA_ARCHITECTURE,
            "vocab_size": 151936,
            "hidden_size": 1024,
            "num_hidden_layers": 28,
            "num_attention_heads": 16,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "intermediate_size": 3072,
            "max_position_embeddings": 40960,
            "rope_theta": 1000000.0,
            "rms_norm_eps": 1e-6,
            "qk_norm": "rms_norm",
            "tie_word_embeddings": True,
        },
        # Mistral (Jiang et al. 2023, "Mistral 7B" §2): Llama's architecture with sliding-window attention. hfzoo's
        # `attention_window` w lets each token see itself and the w/2 tokens before it, Mistral's `sliding_window`
        # counts that token too: w = 8 is Mistral's sliding_window = 5 (transformers' `MistralForCausalLM`).
        "mistral-tiny": {
            **_LLAMA_ARCHITECTURE,
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 128,
            "max_position_embeddings": 512,
            "token_mixer": "sliding_window",
            "attention_window": 8,
            "tie_word_embeddings": False,
        },
    }
)
