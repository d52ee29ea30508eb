"""Export a Llama-shaped decoder (hfzoo or transformers' native Llama / Qwen3) as a GGUF file for llama.cpp.

GGUF is llama.cpp's single-file format: key/value metadata (hyperparameters, the tokenizer) and named tensors.
The file is written with `gguf`, llama.cpp's own Python package (`pip install "hfzoo[gguf]"`), following what
llama.cpp's `convert_hf_to_gguf.py` writes for `LlamaForCausalLM` and `Qwen3ForCausalLM`:

- `general.architecture`: `llama`, or `qwen3` for a decoder with QK-norm (`qk_norm="rms_norm"`);
- `{arch}.context_length` (`max_position_embeddings`), `.embedding_length`, `.block_count`,
  `.feed_forward_length`, `.attention.head_count`, `.attention.head_count_kv` (`num_key_value_heads`),
  `.attention.key_length` / `.value_length` / `.rope.dimension_count` (`head_dim`), `.rope.freq_base`
  (`rope_theta`), `.attention.layer_norm_rms_epsilon`, `.vocab_size`, `general.file_type`;
- the tokenizer: `tokenizer.ggml.model="gpt2"` (byte-level BPE), `.pre="gpt-2"`, `.tokens`, `.token_type`,
  `.merges`, the bos / eos / unknown / padding ids and `.add_bos_token` / `.add_eos_token` as the tokenizer's
  post-processor adds them;
- every tensor under llama.cpp's name (`gguf.get_tensor_name_map`: `token_embd`, `blk.{i}.attn_q`, ...,
  `output_norm`, `output`); a tied output layer is left out (llama.cpp reuses `token_embd`). For the `llama`
  architecture the rows of the query and key projections (weights and biases) are permuted per head from
  transformers' "rotate half" layout (pairs `(i, i + head_dim / 2)`) to GGML's interleaved one (pairs
  `(2i, 2i + 1)`), exactly as `LlamaModel.permute` of `convert_hf_to_gguf.py` does (`gguf_permute_qk` and its
  inverse `gguf_unpermute_qk`); `qwen3` rotates in the "rotate half" layout (NeoX) and keeps them as they are.

Pre-tokenizer: llama.cpp picks its pre-tokenization regex from `tokenizer.ggml.pre`. `convert_hf_to_gguf.py`
finds that name by hashing the token ids of a test string and refuses vocabularies whose hash it does not list,
so a newly trained tokenizer never passes it. Here the name is derived from the tokenizer's structure instead:
hfzoo's tokenizers (`hfzoo.tokenization.train_bpe_tokenizer`) are GPT-2's byte-level BPE without normalizer,
with `ByteLevel(add_prefix_space=False, use_regex=True)`, which splits text with exactly GPT-2's regex, the one
llama.cpp uses for `"gpt-2"`. A tokenizer of another structure is refused.

File types (`outtype`): `"f32"` (every tensor float32), `"f16"` (matrices float16, vectors float32, as llama.cpp)
and `"q8_0"` (matrices in llama.cpp's 8-bit blocks of 32 values, quantized by `gguf.quants`; a matrix whose rows
are not a multiple of 32 stays float16, as in llama.cpp).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedTokenizerBase,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from ..models.decoder import HfzooDecoderConfig, HfzooDecoderForCausalLM
from .common import task_head_architectures
from .llama import hfzoo_to_llama, llama_config_from_hfzoo

__all__ = [
    "GGUF_OUTTYPES",
    "check_gguf_config",
    "convert_to_gguf",
    "gguf_permute_qk",
    "gguf_unpermute_qk",
    "write_gguf",
]

#: The file types `write_gguf` writes (llama.cpp's `--outtype` names).
GGUF_OUTTYPES = ("f32", "f16", "q8_0")
#: The model types a GGUF file can be written from.
_SOURCES = ("hfzoo_decoder", "llama", "qwen3", "mistral")


def _import_gguf() -> Any:
    """Import llama.cpp's `gguf` package, with an install hint when it is missing."""
    try:
        import gguf
    except ImportError as err:
        raise ImportError('exporting GGUF needs the gguf package: pip install "hfzoo[gguf]"') from err
    return gguf


def gguf_permute_qk(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Reorder the rows of a query or key projection from transformers' rotary layout to GGML's.

    transformers rotates feature pairs `(i, i + head_dim / 2)` of each head ("rotate half"), llama.cpp's `llama`
    architecture pairs `(2i, 2i + 1)`; within each head, row `h * head_dim + j * half + i` moves to
    `h * head_dim + 2i + j`. The same as `LlamaModel.permute` of llama.cpp's `convert_hf_to_gguf.py`.

    Args:
        weight: `(num_heads * head_dim, ...)`: a projection weight `(out, in)` or bias `(out,)`.
        num_heads: the heads the rows hold (the key/value heads for the key projection).

    Returns:
        A tensor of the same shape and dtype with the rows reordered.
    """
    half = weight.shape[0] // num_heads // 2
    return weight.reshape(num_heads, 2, half, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def gguf_unpermute_qk(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """The inverse of `gguf_permute_qk`: GGML's interleaved rotary rows back to transformers' "rotate half" order.

    Args:
        weight: `(num_heads * head_dim, ...)` as written to the GGUF file.
        num_heads: the heads the rows hold.

    Returns:
        A tensor of the same shape and dtype with the rows reordered.
    """
    half = weight.shape[0] // num_heads // 2
    return weight.reshape(num_heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


# ------------------------------------------------------------------------------------------------- checks


def _native_problems(config: LlamaConfig | Qwen3Config | MistralConfig) -> list[str]:
    """The settings of a native config that llama.cpp's `llama` / `qwen3` architectures do not express."""
    problems = []
    if config.hidden_act != "silu":
        problems.append(f"hidden_act={config.hidden_act!r} (llama.cpp's feed-forward is SwiGLU; needs 'silu')")
    rope_type = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope_type != "default":
        problems.append(f"rope_type={rope_type!r} (needs 'default')")
    if isinstance(config, MistralConfig) and config.sliding_window is not None:
        problems.append(f"sliding_window={config.sliding_window} (llama.cpp's llama attends to every earlier token)")
    if isinstance(config, Qwen3Config):
        if getattr(config, "use_sliding_window", False):
            problems.append("use_sliding_window=True (llama.cpp's qwen3 attends to every earlier token)")
        if config.attention_bias:
            problems.append("attention_bias=True (llama.cpp's qwen3 has no attention biases)")
    if getattr(config, "pretraining_tp", 1) not in (None, 1):
        problems.append(f"pretraining_tp={config.pretraining_tp} (needs 1)")
    return problems


def _hfzoo_problems(config: HfzooDecoderConfig) -> list[str]:
    """The hfzoo settings llama.cpp cannot express although transformers' native classes can."""
    problems = []
    if config.token_mixer == "sliding_window":
        problems.append(
            "token_mixer='sliding_window' (llama.cpp's llama and qwen3 attend to every earlier token; needs "
            "'self_attention')"
        )
    if config.hidden_act != "silu":
        problems.append(f"hidden_act={config.hidden_act!r} (llama.cpp's feed-forward is SwiGLU; needs 'silu')")
    if config.qk_norm is not None and config.attention_bias:
        problems.append("attention_bias=True with qk_norm (llama.cpp's qwen3 has no attention biases)")
    return problems


def check_gguf_config(config: HfzooDecoderConfig | LlamaConfig | Qwen3Config | MistralConfig) -> str:
    """Check that llama.cpp can run a decoder of this config; return the GGUF architecture it is written as.

    An hfzoo decoder must first convert to a native class (`hfzoo.convert.llama_config_from_hfzoo`); then the
    settings llama.cpp lacks are refused: a sliding window (Mistral, Qwen3's sliding-window layers), an
    activation other than SiLU, scaled RoPE, attention biases with QK-norm. Every such field is named in one
    message.

    Args:
        config: an `HfzooDecoderConfig`, `LlamaConfig`, `Qwen3Config` or `MistralConfig`.

    Returns:
        `"llama"` or `"qwen3"` (QK-norm).

    Raises:
        TypeError: another config class.
        ValueError: one message naming every field that does not map, with its value.
    """
    if isinstance(config, HfzooDecoderConfig):
        problems = _hfzoo_problems(config)
        try:
            native = llama_config_from_hfzoo(config)
        except ValueError as err:
            raise ValueError(f"{err}{'; and for llama.cpp: ' + ', '.join(problems) if problems else ''}") from None
    elif isinstance(config, (LlamaConfig, Qwen3Config, MistralConfig)):
        native, problems = config, _native_problems(config)
    else:
        raise TypeError(f"expected an HfzooDecoderConfig, LlamaConfig, Qwen3Config or MistralConfig, got "
                        f"{type(config).__name__}")  # fmt: skip
    if problems:
        raise ValueError(f"this config cannot be exported to GGUF for llama.cpp, which has no equivalent for: "
                         f"{', '.join(problems)}")  # fmt: skip
    return "qwen3" if isinstance(native, Qwen3Config) else "llama"


# ---------------------------------------------------------------------------------------------- tokenizer


def _tokenizer_metadata(tokenizer: PreTrainedTokenizerBase, vocab_size: int, gguf: Any) -> dict[str, Any]:
    """The `tokenizer.ggml.*` values of a byte-level BPE tokenizer; refuses any other kind (see the module doc)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(f"{type(tokenizer).__name__}: GGUF export needs a fast tokenizer (a tokenizer.json)")
    spec = json.loads(backend.to_str())
    model, pre, decoder = spec.get("model") or {}, spec.get("pre_tokenizer") or {}, spec.get("decoder") or {}
    problems = []
    if model.get("type") != "BPE":
        problems.append(f"model type {model.get('type')!r} (needs 'BPE')")
    if model.get("continuing_subword_prefix") or model.get("end_of_word_suffix") or model.get("byte_fallback"):
        problems.append("a BPE with subword prefix / suffix or byte fallback (needs plain byte-level BPE)")
    if spec.get("normalizer") is not None:
        problems.append(f"normalizer {spec['normalizer'].get('type')!r} (needs none)")
    if (pre.get("type"), pre.get("add_prefix_space"), pre.get("use_regex", True)) != ("ByteLevel", False, True):
        problems.append(
            f"pre_tokenizer {pre.get('type')!r} (add_prefix_space={pre.get('add_prefix_space')}, use_regex="
            f"{pre.get('use_regex')}; needs ByteLevel(add_prefix_space=False, use_regex=True), llama.cpp's 'gpt-2')"
        )
    if decoder.get("type") != "ByteLevel":
        problems.append(f"decoder {decoder.get('type')!r} (needs 'ByteLevel')")
    vocab = tokenizer.get_vocab()
    if vocab and max(vocab.values()) >= vocab_size:
        problems.append(f"token id {max(vocab.values())} (the model's vocab_size is {vocab_size})")
    if problems:
        raise ValueError(f"this tokenizer cannot be written as llama.cpp's byte-level BPE: {', '.join(problems)}")
    by_id = {i: token for token, i in vocab.items()}
    added = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")  # ids of the embedding matrix the tokenizer never produces
            types.append(gguf.TokenType.UNUSED)
        else:
            tokens.append(by_id[i])
            if i in added:
                types.append(gguf.TokenType.CONTROL if added[i].special else gguf.TokenType.USER_DEFINED)
            else:
                types.append(gguf.TokenType.NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    plain = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a")["input_ids"]
    start = full.index(plain[0]) if plain and plain[0] in full else 0
    return {
        "tokens": tokens,
        "types": types,
        "merges": merges,
        "ids": {
            role: getattr(tokenizer, f"{role}_token_id")
            for role in ("bos", "eos", "unk", "pad")
            if getattr(tokenizer, f"{role}_token_id") is not None
        },
        "add_bos": start > 0 and full[0] == tokenizer.bos_token_id,
        "add_eos": len(full) > start + len(plain) and full[-1] == tokenizer.eos_token_id,
    }


# ------------------------------------------------------------------------------------------------- writing


def _tensor_type(array: np.ndarray, outtype: str, gguf: Any) -> Any:
    """The GGML type a tensor is stored in: vectors stay float32; matrices follow `outtype` (Q8_0 needs rows % 32)."""
    q = gguf.GGMLQuantizationType
    if outtype == "f32" or array.ndim < 2:
        return q.F32
    if outtype == "q8_0" and array.shape[-1] % gguf.GGML_QUANT_SIZES[q.Q8_0][0] == 0:
        return q.Q8_0
    return q.F16


def write_gguf(
    model: HfzooDecoderForCausalLM | LlamaForCausalLM | Qwen3ForCausalLM | MistralForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    path: str | Path,
    outtype: str = "f16",
    name: str | None = None,
) -> Path:
    """Write a decoder and its tokenizer as one GGUF file that llama.cpp loads (see the module docstring).

    Everything is checked before the file is opened: the config (`check_gguf_config`), the tokenizer
    (byte-level BPE as hfzoo trains it, ids below `vocab_size`) and `outtype`.

    Args:
        model: an `HfzooDecoderForCausalLM` the native classes express, or a `LlamaForCausalLM`,
            `Qwen3ForCausalLM` or `MistralForCausalLM` without sliding window (any dtype; written from float32).
        tokenizer: its fast tokenizer.
        path: the `.gguf` file to write (its folder must exist; an existing file is replaced).
        outtype: `"f32"`, `"f16"` or `"q8_0"`.
        name: `general.name` (default: the file's stem).

    Returns:
        `path` as a `Path`.

    Raises:
        ImportError: the `gguf` package is not installed.
        TypeError: another model class.
        ValueError: an `outtype` not in `GGUF_OUTTYPES`, a config llama.cpp cannot express (every field named),
            or a tokenizer it cannot (every problem named).
    """
    gguf = _import_gguf()
    if outtype not in GGUF_OUTTYPES:
        raise ValueError(f"outtype={outtype!r}: expected one of {', '.join(GGUF_OUTTYPES)}")
    if not isinstance(model, (HfzooDecoderForCausalLM, LlamaForCausalLM, Qwen3ForCausalLM, MistralForCausalLM)):
        raise TypeError(
            "expected an HfzooDecoderForCausalLM, LlamaForCausalLM, Qwen3ForCausalLM or MistralForCausalLM, got "
            f"{type(model).__name__}"
        )
    arch = check_gguf_config(model.config)
    native = hfzoo_to_llama(model) if isinstance(model, HfzooDecoderForCausalLM) else model
    c = native.config
    vocab = _tokenizer_metadata(tokenizer, c.vocab_size, gguf)
    path = Path(path)
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv_heads = c.num_key_value_heads or c.num_attention_heads
    file_type = {"f32": "ALL_F32", "f16": "MOSTLY_F16", "q8_0": "MOSTLY_Q8_0"}[outtype]

    writer = gguf.GGUFWriter(path, arch)  # writes general.architecture
    writer.add_name(name or path.stem)
    writer.add_file_type(gguf.LlamaFileType[file_type])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_vocab_size(c.vocab_size)
    writer.add_context_length(c.max_position_embeddings)
    writer.add_embedding_length(c.hidden_size)
    writer.add_block_count(c.num_hidden_layers)
    writer.add_feed_forward_length(c.intermediate_size)
    writer.add_head_count(c.num_attention_heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(float(c.rope_parameters["rope_theta"]))
    writer.add_layer_norm_rms_eps(c.rms_norm_eps)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(vocab["tokens"])
    writer.add_token_types(vocab["types"])
    writer.add_token_merges(vocab["merges"])
    for role, token_id in vocab["ids"].items():
        getattr(writer, f"add_{role}_token_id")(token_id)
    writer.add_add_bos_token(vocab["add_bos"])
    writer.add_add_eos_token(vocab["add_eos"])

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], c.num_hidden_layers)
    for key, tensor in native.state_dict().items():
        if key == "lm_head.weight" and c.tie_word_embeddings:
            continue  # llama.cpp uses token_embd for the output layer when output.weight is absent
        stem, suffix = key.rsplit(".", 1)
        gguf_name = names.get_name(stem)
        if gguf_name is None:
            raise ValueError(f"{key}: gguf has no {arch} tensor name for it")
        data = tensor.detach().to(device="cpu", dtype=torch.float32)
        if arch == "llama" and stem.endswith(("self_attn.q_proj", "self_attn.k_proj")):
            data = gguf_permute_qk(data, c.num_attention_heads if stem.endswith("q_proj") else kv_heads)
        array = data.numpy()
        qtype = _tensor_type(array, outtype, gguf)
        writer.add_tensor(f"{gguf_name}.{suffix}", gguf.quants.quantize(array, qtype), raw_dtype=qtype)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    return path


def convert_to_gguf(model_name_or_path: str | Path, output_file: str | Path, outtype: str = "f16") -> Path:
    """Read a checkpoint folder (hfzoo decoder, or native Llama / Qwen3) and write it as one GGUF file.

    The config is checked before the weights are read; the tokenizer comes from the same folder.

    Args:
        model_name_or_path: the checkpoint folder (or hub id) with its tokenizer.
        output_file: the `.gguf` file to write.
        outtype: `"f32"`, `"f16"` or `"q8_0"`.

    Returns:
        `output_file` as a `Path`.

    Raises:
        ImportError: the `gguf` package is not installed.
        ValueError: another `model_type`, an unknown `outtype`, a task head (`architectures`: a sequence classifier,
            ...), a config or tokenizer llama.cpp cannot express.
        OSError: no loadable checkpoint or tokenizer at `model_name_or_path`.
    """
    _import_gguf()
    if outtype not in GGUF_OUTTYPES:
        raise ValueError(f"outtype={outtype!r}: expected one of {', '.join(GGUF_OUTTYPES)}")
    config = AutoConfig.from_pretrained(model_name_or_path)
    if config.model_type not in _SOURCES:
        raise ValueError(
            f"{model_name_or_path}: model_type {config.model_type!r} cannot be exported to GGUF; choose a checkpoint "
            f"of {', '.join(_SOURCES)}"
        )
    heads = task_head_architectures(config)
    if heads:  # loaded as the language model, a classifier would lose its head (and get a random lm_head if untied)
        raise ValueError(
            f"{model_name_or_path}: {heads[0]} is a task head; a GGUF file holds a language model (a ...ForCausalLM "
            "checkpoint)"
        )
    check_gguf_config(config)  # before the weights are read
    tokenizer = AutoTokenizer.from_pretrained(model_name_or_path)
    if config.model_type == "hfzoo_decoder":
        model = HfzooDecoderForCausalLM.from_pretrained(model_name_or_path)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_name_or_path)
    return write_gguf(model, tokenizer, output_file, outtype, name=Path(str(model_name_or_path)).name)
