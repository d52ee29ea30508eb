"""PEFT for every hfzoo family (and stock transformers models): LoRA, prefix tuning, full finetuning.

- LoRA (Hu et al. 2021): low-rank updates `W + (alpha / r) B A` on `target_modules`; default for hfzoo
  models: every linear projection of the blocks (attention `q/k/v/o_proj`, feed-forward
  `gate/up/down_proj`, as QLoRA, Dettmers et al. 2023 §4, recommends; in the encoder-decoder's decoder the
  names also match the cross-attention), PEFT's per-architecture defaults for stock models.
- Prefix tuning (Li & Liang 2021): `num_virtual_tokens` learned key/value vectors prepended to the
  self-attention of every layer. For the encoder-decoder, PEFT alone would feed only the decoder; here
  the prefix covers `num_hidden_layers + num_decoder_layers` layers and the model routes the first
  block to the encoder (`hfzoo.models.encoder_decoder.modeling_encoder_decoder.split_prefix_cache`); its token
  classifier, the encoder alone, gets the encoder's layers only.
- `none`: every parameter trains.

With sequence classification, PEFT trains and saves the classification head (`classifier` /
`score`) with the adapter. Only this package (`hfzoo.training`) and the recipes import peft.
"""

from __future__ import annotations

from pathlib import Path

import torch
from peft import LoraConfig, PeftConfig, PeftModel, PrefixTuningConfig, TaskType, get_peft_model
from transformers import AutoModelForSequenceClassification, PreTrainedModel

from hfzoo.modules.mixers import TOKEN_MIXERS

__all__ = [
    "PEFT_METHODS",
    "build_peft_config",
    "check_prefix_fits",
    "count_parameters",
    "default_lora_target_modules",
    "load_peft_model",
    "prefix_num_layers",
    "wrap_with_peft",
]

PEFT_METHODS = ("lora", "prefix", "none")
#: PEFT task types whose model calls the base model's `generate`.
GENERATION_TASK_TYPES = (TaskType.CAUSAL_LM, TaskType.SEQ_2_SEQ_LM)

_HFZOO_MODEL_TYPES = ("hfzoo_encoder", "hfzoo_decoder", "hfzoo_encoder_decoder")


# Every linear projection of hfzoo's blocks (names in hfzoo.modules.attention and .feed_forward).
LORA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def default_lora_target_modules(config) -> list[str] | None:
    """LoRA's default `target_modules`: every linear projection of the attention and feed-forward blocks.

    Hu et al. 2021 (§7.1) adapt only the query and value projections; Dettmers et al. 2023 (QLoRA, §4)
    find that adapting all linear layers of the blocks is needed to match full finetuning. Measured
    here on all-MiniLM-L6-v2 converted to hfzoo, r 8, lr 1e-3 (docs/glue.md): query/value only gave
    SST-2 0.843 / MRPC accuracy 0.753 / STS-B Spearman 0.841, all projections 0.860 / 0.804 / 0.859
    (2.07% of the parameters trainable, classification head included).

    Args:
        config: the model config.

    Returns:
        `LORA_TARGET_MODULES` (`q/k/v/o_proj` of self-attention everywhere and of the decoder's
        cross-attention in the encoder-decoder, `gate/up/down_proj` of the feed-forward blocks and
        experts) for the three hfzoo families; None for other models, so that PEFT picks its own
        default for the architecture (e.g. BERT's `query`, `value`).
    """
    return list(LORA_TARGET_MODULES) if config.model_type in _HFZOO_MODEL_TYPES else None


def prefix_num_layers(config, task_type: str | None = None) -> int:
    """Number of self-attention layers the prefix covers: both stacks for the encoder-decoder.

    Args:
        config: the model config.
        task_type: the PEFT task type; `TOKEN_CLS` on the encoder-decoder is its token classifier, which has the
            encoder alone (`HfzooEncoderDecoderForTokenClassification`).

    Returns:
        `num_hidden_layers + num_decoder_layers` for `hfzoo_encoder_decoder` (its encoder's `num_hidden_layers`
        with `TOKEN_CLS`), else `num_hidden_layers`.
    """
    if config.model_type == "hfzoo_encoder_decoder" and task_type != TaskType.TOKEN_CLS:
        return config.num_hidden_layers + config.num_decoder_layers
    return config.num_hidden_layers


def check_prefix_fits(config, num_virtual_tokens: int, max_length: int) -> None:
    """Refuse a prefix that leaves no room for `max_length` input tokens within the position table.

    The prefix occupies the first `num_virtual_tokens` positions (as in BERT with a cache), so inputs
    are placed at positions `num_virtual_tokens ... num_virtual_tokens + max_length - 1`.

    Args:
        config: the model config (`max_position_embeddings`, `position_embedding_type`).
        num_virtual_tokens: prefix length (tokens).
        max_length: longest tokenized input (tokens).

    Raises:
        ValueError: `num_virtual_tokens < 1`, or `num_virtual_tokens + max_length >
            max_position_embeddings` for a model with absolute positions; the message gives the numbers.
    """
    if num_virtual_tokens < 1:
        raise ValueError(f"--num_virtual_tokens must be >= 1, got {num_virtual_tokens}")
    limit = getattr(config, "max_position_embeddings", None)
    if limit is None or getattr(config, "position_embedding_type", None) == "none":
        return
    if num_virtual_tokens + max_length > limit:
        raise ValueError(
            f"prefix of --num_virtual_tokens {num_virtual_tokens} + --max_length {max_length} = "
            f"{num_virtual_tokens + max_length} positions exceeds max_position_embeddings={limit}; "
            f"shorten the prefix or use --max_length <= {limit - num_virtual_tokens}"
        )


def build_peft_config(
    method: str,
    config,
    *,
    task_type: str = TaskType.SEQ_CLS,
    lora_r: int = 8,
    lora_alpha: float = 16,
    lora_dropout: float = 0.1,
    target_modules: list[str] | None = None,
    num_virtual_tokens: int = 20,
    prefix_projection: bool = False,
    encoder_hidden_size: int | None = None,
) -> PeftConfig | None:
    """Build the PEFT config of `method` for a model with config `config`.

    Args:
        method: one of `PEFT_METHODS` (`none` returns None).
        config: the base model's config.
        task_type: PEFT task type (`SEQ_CLS` trains and saves the classification head with the adapter).
        lora_r: LoRA rank r.
        lora_alpha: LoRA scale alpha (updates are scaled by alpha / r).
        lora_dropout: dropout on the LoRA input.
        target_modules: module names for LoRA (default: `default_lora_target_modules`).
        num_virtual_tokens: prefix length (tokens).
        prefix_projection: reparametrize the prefix through a two-layer MLP (Li & Liang 2021, §4.3).
        encoder_hidden_size: hidden size of that MLP (default: the attention width).

    Returns:
        A `LoraConfig`, a `PrefixTuningConfig`, or None.

    Raises:
        ValueError: an unknown method, a non-positive rank, or prefix tuning of an hfzoo model with a token
            mixer that has no keys and values to prepend the prefix to (no KV cache in its `TOKEN_MIXERS`
            entry, e.g. FNet, Linformer, BigBird).
    """
    if method not in PEFT_METHODS:
        raise ValueError(f"--peft {method!r} is not supported; choose one of {list(PEFT_METHODS)}")
    if method == "none":
        return None
    if method == "lora":
        if lora_r < 1:
            raise ValueError(f"--lora_r must be >= 1, got {lora_r}")
        return LoraConfig(
            task_type=task_type,
            r=lora_r,
            lora_alpha=lora_alpha,
            lora_dropout=lora_dropout,
            target_modules=target_modules or default_lora_target_modules(config),
        )
    if config.model_type in _HFZOO_MODEL_TYPES:
        mixers = {"token_mixer": config.token_mixer}
        if getattr(config, "decoder_token_mixer", None):
            mixers["decoder_token_mixer"] = config.decoder_token_mixer
        for field, name in mixers.items():
            if not TOKEN_MIXERS[name].kv_cache:
                raise ValueError(
                    f"--peft prefix prepends learned keys and values to every token mixer, but {field}={name!r} "
                    "has no key/value cache to take them; use --peft lora or --peft none"
                )
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return PrefixTuningConfig(
        task_type=task_type,
        num_virtual_tokens=num_virtual_tokens,
        num_layers=prefix_num_layers(config, task_type),
        num_attention_heads=heads,
        token_dim=heads * head_dim,
        prefix_projection=prefix_projection,
        encoder_hidden_size=encoder_hidden_size or heads * head_dim,
    )


def wrap_with_peft(model: PreTrainedModel, peft_config: PeftConfig | None) -> PreTrainedModel | PeftModel:
    """Wrap `model` for PEFT training (`peft.get_peft_model`), or return it unchanged for full finetuning.

    Args:
        model: the base model (e.g. an `*ForSequenceClassification`).
        peft_config: from `build_peft_config`, or None.

    Returns:
        The `PeftModel` (base weights frozen; adapter and classification head trainable) or `model`.

    Raises:
        ValueError: a generation task (`CAUSAL_LM`, `SEQ_2_SEQ_LM`) for a model that cannot generate (an
            encoder: PEFT's model for the task would call its `generate` / `prepare_inputs_for_generation`); or a
            `target_modules` entry that names no module of `model` (PEFT adapts the entries that match and ignores
            the others: `["q_proj", "v_prj"]` would adapt the queries alone), naming its linear layers. The
            names of `LORA_TARGET_MODULES` are accepted for every hfzoo model: a variant may lack one (`gate_proj`
            without a gated feed-forward).
    """
    if peft_config is None:
        return model
    targets = getattr(peft_config, "target_modules", None)
    if isinstance(targets, (list, tuple, set)):  # a string is PEFT's regular expression or "all-linear"
        names = [name for name, _ in model.named_modules()]
        # PEFT's rule for a list: the module's full name, or its name ending with "." + the entry. hfzoo's own
        # projection names (the defaults) stand for every variant, some of which lack one (gate_proj).
        own = LORA_TARGET_MODULES if model.config.model_type in _HFZOO_MODEL_TYPES else ()
        unmatched = sorted(t for t in targets if t not in own and not any(n == t or n.endswith(f".{t}") for n in names))
        if unmatched:
            linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
            raise ValueError(
                f"target_modules {unmatched}: no module of {type(model).__name__} has that name (PEFT would adapt "
                f"the other entries and ignore these); its linear layers are named {linear}"
            )
    if peft_config.task_type in GENERATION_TASK_TYPES and not model.can_generate():
        raise ValueError(
            f"task_type {peft_config.task_type} needs a model that generates, but {type(model).__name__} cannot "
            "(an encoder is bidirectional: no next-token generation); use a decoder or an encoder-decoder, or "
            "task_type SEQ_CLS / TOKEN_CLS / QUESTION_ANS"
        )
    return get_peft_model(model, peft_config)


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """Return `(trainable, total)` parameter counts (shared tensors counted once).

    Args:
        model: any module.

    Returns:
        Two ints: elements of parameters with `requires_grad`, and of all parameters.
    """
    seen: set[int] = set()
    trainable = total = 0
    for param in model.parameters():
        if id(param) in seen:
            continue
        seen.add(id(param))
        total += param.numel()
        trainable += param.numel() if param.requires_grad else 0
    return trainable, total


def load_peft_model(
    path: str | Path, base_model_name_or_path: str | Path | None = None, *, merge: bool = False, **model_kwargs
) -> PreTrainedModel | PeftModel:
    """Load a finetuned sequence classifier: a full checkpoint, or an adapter onto its base checkpoint.

    Args:
        path: a folder written by the GLUE recipe: either a full model (`config.json`) or a PEFT adapter
            (`adapter_config.json`, with the classification head inside).
        base_model_name_or_path: the base checkpoint for an adapter (default: the one recorded in
            `adapter_config.json`).
        merge: fold LoRA updates into the base weights (`merge_and_unload`) and return a plain model.
        **model_kwargs: passed to `AutoModelForSequenceClassification.from_pretrained` (`num_labels`,
            `attn_implementation`, ...).

    Returns:
        The model in eval mode (a `PeftModel` for an unmerged adapter).

    Raises:
        FileNotFoundError: `path` holds neither `adapter_config.json` nor `config.json`.
    """
    path = Path(path)
    if (path / "adapter_config.json").is_file():
        peft_config = PeftConfig.from_pretrained(path)
        base = AutoModelForSequenceClassification.from_pretrained(
            base_model_name_or_path or peft_config.base_model_name_or_path, **model_kwargs
        )
        model = PeftModel.from_pretrained(base, path)
        if merge:
            model = model.merge_and_unload()
    elif (path / "config.json").is_file():
        model = AutoModelForSequenceClassification.from_pretrained(path, **model_kwargs)
    else:
        raise FileNotFoundError(f"{path}: neither a PEFT adapter (adapter_config.json) nor a model (config.json)")
    return model.eval()
