"""Convert a checkpoint folder between transformers' GPT-2 / BERT / T5 / Llama / Qwen3 / Mistral and hfzoo.

    hfzoo-convert --model_name_or_path gpt2-folder --output_dir gpt2-hfzoo       # GPT-2 -> hfzoo decoder
    hfzoo-convert --model_name_or_path gpt2-hfzoo --output_dir gpt2-again         # hfzoo decoder -> GPT-2
    hfzoo-convert --model_name_or_path smollm2-folder --output_dir smollm2-hfzoo # Llama -> hfzoo decoder

The direction follows from the source's `model_type` (`CHECKPOINT_CONVERTERS` at the bottom of this
file): `gpt2`, `bert`, `t5`, `llama`, `qwen3` and `mistral` convert to hfzoo, `hfzoo_encoder` to BERT and
`hfzoo_encoder_decoder` to T5; `hfzoo_decoder` converts to the Llama family when it has rotary positions
(Llama; Qwen3 with QK-norm; Mistral with a sliding window, `hfzoo.convert.llama`), else to GPT-2. The class
follows from the source's `architectures`: the task heads of BERT, GPT-2, T5 and the Llama family convert to
hfzoo's and back. The output is a `save_pretrained` folder (weights, config, generation config where the model
generates) with the source's tokenizer and, for a sentence-transformers model, its `modules.json` and module
folders (pooling, normalisation, dense layers), so that `SentenceTransformer(output_dir)` computes the source's
embeddings. Also `python -m hfzoo.convert`.

`--to gguf` instead writes a Llama-shaped decoder (hfzoo, or native Llama / Qwen3) and its tokenizer as one GGUF
file for llama.cpp, `{output_dir}/model-{outtype}.gguf` (`hfzoo.convert.gguf`; needs `pip install "hfzoo[gguf]"`):

    hfzoo-convert --model_name_or_path smollm2-hfzoo --output_dir smollm2-gguf --to gguf --outtype f16
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer

from .. import AUTO_CLASSES
from ..hub import check_model_path, copy_sentence_transformers_files
from ..models.encoder import HfzooEncoderConfig, HfzooEncoderModel
from ..outputs import check_output_folder, check_output_is_not_source, removed_if_refused
from .bert import convert_bert_checkpoint, hfzoo_to_bert
from .common import HFZOO_DECODER_HEADS, task_head_architectures
from .gguf import GGUF_OUTTYPES, convert_to_gguf
from .gpt2 import GPT2_HEADS, gpt2_to_hfzoo, hfzoo_to_gpt2
from .llama import NATIVE_LLAMA_HEADS, hfzoo_to_llama, llama_config_from_hfzoo, llama_to_hfzoo
from .t5 import HFZOO_T5_HEADS, T5_HEADS, hfzoo_to_t5, t5_to_hfzoo


def _class_of(config, classes: tuple[type, ...], source: Path, converter: str) -> type:
    """The class of `classes` that `config.architectures` names; the first (the language model) when it names none.

    Raises:
        ValueError: `architectures` names a class outside `classes` (a task head the converter has no counterpart
            for, whose weights loading as the language model would drop).
    """
    by_name = {cls.__name__: cls for cls in classes}
    architectures = config.architectures or []
    named = [by_name[name] for name in architectures if name in by_name]
    if named:
        return named[0]
    others = task_head_architectures(config)
    if others:
        raise ValueError(
            f"{source}: {others[0]} is a task head the {converter} conversion has no counterpart for (it converts "
            f"{', '.join(by_name)}); loading it as the language model would drop the head's weights"
        )
    return classes[0]


def _load(model_class: type, source: Path) -> torch.nn.Module:
    """`model_class.from_pretrained(source)`, refusing a checkpoint that lacks some of the class's weights.

    transformers initialises missing weights at random with a warning; converted, they would pass for trained
    ones (a T5 folder whose config has more layers than its weights hold).

    Raises:
        ValueError: names the class, the number of missing weights and the first of them.
    """
    model, info = model_class.from_pretrained(source, output_loading_info=True)
    missing = sorted(info["missing_keys"])
    if missing:
        architectures = getattr(model.config, "architectures", None) or ["(none)"]
        raise ValueError(
            f"{source}: loaded as {model_class.__name__}, {len(missing)} of its weights are not in the checkpoint "
            f"(first: {', '.join(missing[:3])}) and would start at random values; the checkpoint is a "
            f"{architectures[0]}"
        )
    return model


def _from_gpt2(source: Path, output_dir: Path) -> torch.nn.Module:
    return gpt2_to_hfzoo(_load(_class_of(AutoConfig.from_pretrained(source), GPT2_HEADS, source, "GPT-2"), source))


def _from_decoder(source: Path, output_dir: Path) -> torch.nn.Module:
    config = AutoConfig.from_pretrained(source)
    if config.position_embedding_type == "rotary":  # the Llama family (GPT-2 has learned positions)
        llama_config_from_hfzoo(config)  # refused before the weights are read
        model = _load(_class_of(config, HFZOO_DECODER_HEADS, source, "Llama"), source)
        converted = hfzoo_to_llama(model)
        return _with_generation_config(converted, model) if converted.can_generate() else converted
    return hfzoo_to_gpt2(_load(_class_of(config, HFZOO_DECODER_HEADS, source, "GPT-2"), source))


def _from_llama(source: Path, output_dir: Path) -> torch.nn.Module:
    config = AutoConfig.from_pretrained(source)
    model = _load(_class_of(config, NATIVE_LLAMA_HEADS[config.model_type], source, "Llama"), source)
    converted = llama_to_hfzoo(model)
    return _with_generation_config(converted, model) if converted.can_generate() else converted


def _with_generation_config(converted: torch.nn.Module, source: torch.nn.Module) -> torch.nn.Module:
    """`converted` with the source's generation defaults (its `generation_config.json`: sampling, token ids)."""
    if getattr(source, "generation_config", None) is not None:
        converted.generation_config = copy.deepcopy(source.generation_config)
    return converted


def _from_bert(source: Path, output_dir: Path) -> None:
    convert_bert_checkpoint(source, output_dir)  # keeps the pooler and the masked-LM head, writes the folder


def _to_bert(source: Path, output_dir: Path) -> torch.nn.Module:
    config = AutoConfig.from_pretrained(source)
    classes = {cls.__name__: cls for cls in AUTO_CLASSES[HfzooEncoderConfig].values()}  # the encoder's heads
    model_class = next((classes[a] for a in config.architectures or [] if a in classes), HfzooEncoderModel)
    return hfzoo_to_bert(_load(model_class, source))


def _from_t5(source: Path, output_dir: Path) -> torch.nn.Module:
    return t5_to_hfzoo(_load(_class_of(AutoConfig.from_pretrained(source), T5_HEADS, source, "T5"), source))


def _to_t5(source: Path, output_dir: Path) -> torch.nn.Module:
    return hfzoo_to_t5(_load(_class_of(AutoConfig.from_pretrained(source), HFZOO_T5_HEADS, source, "T5"), source))


def convert_checkpoint(model_name_or_path: str | Path, output_dir: str | Path) -> Path:
    """Convert a checkpoint folder to the other side (see the module docstring) and save it with its tokenizer.

    An hfzoo decoder with rotary positions converts to `LlamaForCausalLM` (`Qwen3ForCausalLM` with QK-norm,
    `MistralForCausalLM` with a sliding window), or to the family's `...ForSequenceClassification`,
    `...ForTokenClassification` or `...ForQuestionAnswering` when its `architectures` names that hfzoo head (and
    back: a native head converts to the hfzoo decoder's); any other decoder converts to GPT-2, its heads to
    `GPT2ForSequenceClassification`, `GPT2ForTokenClassification` and `GPT2ForQuestionAnswering` (and back). The
    Llama family's language models keep the source's generation config. T5 converts its language model,
    `T5ForSequenceClassification`, `T5ForQuestionAnswering`, `T5ForTokenClassification` and `T5EncoderModel`. A
    folder whose `architectures` names a head the conversion has no counterpart for (`GPT2DoubleHeadsModel`) is
    refused, since loading it as the language model would drop the head's weights, and so is a folder that lacks
    weights of the class it loads as, which would start at random values. An hfzoo encoder converts to the BERT
    class of its
    `architectures` (`HfzooEncoderForMaskedLM` -> `BertForMaskedLM`, `...ForSequenceClassification` ->
    `BertForSequenceClassification`, `...ForQuestionAnswering` -> `BertForQuestionAnswering`,
    `...ForTokenClassification` -> `BertForTokenClassification`, else `BertModel`). A sentence-transformers model
    keeps its module configuration (`hfzoo.hub.copy_sentence_transformers_files`).

    Args:
        model_name_or_path: the source checkpoint folder (or hub id).
        output_dir: the folder to write (created).

    Returns:
        `output_dir` as a `Path`.

    Raises:
        ValueError: a `model_type` without a converter, a config the other side cannot express (the message names
            the field), a task head the converter has no counterpart for (`architectures`), or a folder lacking
            weights of the class it loads as.
        OSError: no loadable checkpoint at `model_name_or_path`.
    """
    output_dir = Path(output_dir)
    model_type = AutoConfig.from_pretrained(model_name_or_path).model_type
    if model_type not in CHECKPOINT_CONVERTERS:
        raise ValueError(
            f"{model_name_or_path}: model_type {model_type!r} has no converter; "
            f"choose a checkpoint of {sorted(CHECKPOINT_CONVERTERS)}"
        )
    model = CHECKPOINT_CONVERTERS[model_type](Path(model_name_or_path), output_dir)
    if model is not None:
        model.save_pretrained(output_dir)
        try:
            AutoTokenizer.from_pretrained(model_name_or_path).save_pretrained(output_dir)
        except (OSError, ValueError):
            pass  # a checkpoint without tokenizer files converts all the same
        copy_sentence_transformers_files(model_name_or_path, output_dir)
    return output_dir


def build_parser() -> argparse.ArgumentParser:
    """Return the parser of `hfzoo-convert`."""
    parser = argparse.ArgumentParser(
        prog="hfzoo-convert",
        description="Convert a checkpoint between transformers' GPT-2 / BERT / T5 / Llama / Qwen3 / Mistral and "
        "hfzoo (the direction follows from the source's model_type; an hfzoo decoder with rotary positions "
        "becomes Llama, Qwen3 or Mistral, any other GPT-2).",
    )
    parser.add_argument("--model_name_or_path", required=True, help="source checkpoint folder (or hub id)")
    parser.add_argument("--output_dir", required=True, help="where to write the converted checkpoint")
    parser.add_argument(
        "--to",
        choices=("auto", "gguf"),
        default="auto",
        help="auto (default): the other side of the source's model_type; gguf: one GGUF file for llama.cpp, "
        "{output_dir}/model-{outtype}.gguf, from an hfzoo decoder or a native Llama / Qwen3 checkpoint",
    )
    parser.add_argument(
        "--outtype",
        choices=GGUF_OUTTYPES,
        default=None,
        help="with --to gguf: the tensor type of the matrices (default f16; vectors stay f32)",
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    """Entry point of `hfzoo-convert` and `python -m hfzoo.convert`.

    Args:
        argv: arguments without the program name (default: `sys.argv[1:]`).

    Raises:
        SystemExit: an argparse error (among them an `--output_dir` that is the source folder itself, which the
            conversion would overwrite; a GGUF file may be written there), or a one-line `error: ...` for a
            checkpoint that cannot be converted.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.outtype is not None and args.to != "gguf":
        parser.error(f"--outtype {args.outtype} needs --to gguf")
    if args.to == "auto":  # a GGUF file may be written into the source folder
        try:
            check_output_is_not_source(args.output_dir, args.model_name_or_path, "the converted weights and config")
        except ValueError as err:
            parser.error(str(err))
    try:
        check_model_path(args.model_name_or_path)
    except ValueError as err:
        parser.error(str(err))
    target = args.output_dir
    try:
        with removed_if_refused(args.output_dir):  # a refused conversion leaves no empty output folder behind
            check_output_folder(args.output_dir)
            if args.to == "gguf":
                outtype = args.outtype or "f16"
                target = convert_to_gguf(
                    args.model_name_or_path, Path(args.output_dir) / f"model-{outtype}.gguf", outtype
                )
            else:
                convert_checkpoint(args.model_name_or_path, args.output_dir)
    except (OSError, ValueError, TypeError, ImportError) as err:
        raise SystemExit(f"error: {str(err).splitlines()[0]}") from None
    print(f"converted {args.model_name_or_path} -> {target}")


#: source `model_type` -> `(source folder, output folder) -> converted model` (None: the function wrote the folder).
CHECKPOINT_CONVERTERS: dict[str, Callable[[Path, Path], torch.nn.Module | None]] = {
    "gpt2": _from_gpt2,
    "hfzoo_decoder": _from_decoder,
    "llama": _from_llama,
    "qwen3": _from_llama,
    "mistral": _from_llama,
    "bert": _from_bert,
    "hfzoo_encoder": _to_bert,
    "t5": _from_t5,
    "hfzoo_encoder_decoder": _to_t5,
}
