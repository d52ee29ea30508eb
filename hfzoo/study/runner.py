r"""Narang et al. 2021's modification study at small scale: pretrain every variant, finetune on GLUE, compare.

    hfzoo-study --study recipes/studies/narang_small.yaml --output_dir outputs/study
    python recipes/study.py --study recipes/studies/narang_small.yaml --output_dir outputs/study \
        --variants "Vanilla Transformer" SwiGLU --seeds 0 1 --max_train_steps 400

(also `python -m hfzoo.study`). A YAML study file names the base model (a preset plus
`config_overrides`), the variants (row names of Narang et al.'s Table 1, `hfzoo.models.narang.TABLE_1_ROWS`,
or of today's modifications, `hfzoo.models.modern.MODERN_ROWS`, resolved against the base; a row may also
change the pretraining arguments, `hfzoo.models.modern.ROW_PRETRAIN_ARGS`: the Muon rows), the seeds,
and the hyperparameters shared by every run; every key of the file must be present, and a flag of the same
name overrides it. For each (variant, seed) the study

1. pretrains with the study's family's objective (`family`: T5 span corruption for the paper's
   encoder-decoder, causal LM for a decoder, masked LM for an encoder; `protocol.FAMILIES`) through the
   pretraining recipe (`hfzoo.pretraining.main`,
   the same Accelerate code path as `hfzoo-pretrain`): the same data, tokens and hyperparameters for every
   variant, validation loss at 1/8 of training (the paper's 65,536 of 524,288 steps: "early loss") and at
   the end ("final loss") on the same held-out, identically corrupted blocks (`--eval_seed`);
2. finetunes the whole model on each GLUE task through the GLUE recipe (`hfzoo.finetuning.main`,
   `--peft none`) on a fixed training subset per task (the same examples for every run), and records each
   task's official dev metric(s);
3. writes the run's record (`runs/<variant>/seed_<seed>/result.json`: parameters, FLOPs per token and in
   total, steps/s, losses, GLUE scores, where its wall time went: `time_breakdown`) atomically, then
   rewrites the study's `results.json`, `results.md` and plots (`hfzoo.study.report`).

Before the runs, the study prepares once what they share: the tokenizer, the pretraining data tokenized and
packed (`ensure_pretraining_data`, into `datasets`' cache, which every run then loads) and the GLUE subsets.
After the variants, a "No pretraining" row (`protocol.NO_PRETRAINING`) finetunes the vanilla model from its
seeded random initialisation, once per seed: the downstream baseline the variants' gains are measured from.

Restarting the same command continues a killed study: finished runs are never repeated (their record
exists), a finished pretraining stage or GLUE task of an unfinished run is reused, and unfinished stages
start again from scratch (deterministic: same seed, same result). Several study processes on one output
folder (`--parallel_runs N` starts N of them, `--parallel_runs auto` as many as fit: `resolve_parallel_runs`;
or one per GPU: `CUDA_VISIBLE_DEVICES=i hfzoo-study ...`)
share the runs through per-run lock files. `--launcher "accelerate launch --config_file CONFIG"` runs every
stage in a child process started that way (DDP or DeepSpeed per run; `--num_processes` must then match the
config).

Everything that can be refused is checked before the tokenizer or any model is trained: unknown variants
(the closest known rows are named), missing study-file keys, absent data or GLUE files, zero seeds or steps,
invalid configs or recipe arguments, the `--launcher`'s accelerate config, an output folder that holds a study
with other settings, or whose data differs (unless `--overwrite_output_dir`), and a run folder that holds
another row, family, seed or config than the run planned there (`run.json`, `check_run_folders`). The folder's
`study.json` records the paths as given and the data they point to (sizes and sha256 digests), so a study
continues from a moved folder or with moved data.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import dataclasses
import fcntl
import io
import json
import math
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import yaml
from huggingface_hub.errors import StrictDataclassError
from transformers import CONFIG_MAPPING, AutoConfig, AutoTokenizer, PreTrainedConfig

from ..choices import choice_hint
from ..data.collators import compute_input_and_target_lengths
from ..data.glue import get_glue_task
from ..finetuning import parse_glue_args
from ..integrity import file_sha256
from ..models.flops import count_training_flops
from ..models.modern import STUDY_ROWS, row_pretrain_args
from ..models.narang import load_paper_table, resolve_row
from ..models.presets import PRESETS, build_config, parse_overrides
from ..outputs import check_output_folder, removed_if_refused
from ..pretraining import pack_pretraining_data, parse_pretrain_args, train_tokenizer
from ..tokenization import FAMILY_SPECIAL_TOKENS
from ..training.arguments import OneLineErrorParser
from ..training.faults import EXIT_PREEMPTED
from ..training.launch_config import check_launch_config, launcher_config_file
from ..training.precision import resolve_mixed_precision
from .parallel import ParallelPlan, available_ram_bytes, cpu_cores, estimate_run_bytes, plan_parallel_runs
from .protocol import BASELINE, EARLY_FRACTION, FAMILIES, NO_PRETRAINING, SELECTION_KEYS, study_plan

__all__ = ["EARLY_FRACTION", "StudySettings", "load_settings", "main", "run_study"]

STUDY_FILE = "study.json"
RECORD_FILE = "result.json"
#: What a run folder trains (row, family, seed, resolved config), written before its first stage: a folder is
#: reused only for the same key (`check_run_folders`).
RUN_KEY_FILE = "run.json"
#: Wall times of the study's one-time preparation (tokenizer, tokenized data), beside `study.json`.
PREPARATION_FILE = "preparation.json"


@dataclasses.dataclass
class StudySettings:
    """The study file's keys (all required in the file; each also a command-line flag of the same name).

    Attributes:
        config_name: the base model: a preset (default study: `narang-vanilla`) or a `config.json`.
        config_overrides: base config fields to change (a mapping; `key=value,...` on the command line).
        family: the model family every run pretrains (`protocol.FAMILIES`): `encoder-decoder` (T5 span
            corruption, the paper's), `decoder` (causal LM) or `encoder` (masked LM). An encoder-decoder base
            runs in another family as one stack of the same width with the layers of both its stacks
            (`single_stack_config`); a base of the study's family runs as it is.
        variants: row names of `hfzoo.models.modern.STUDY_ROWS` (Table 1's and today's modifications),
            resolved against the base.
        seeds: training seeds; every variant runs once per seed.
        tokenizer_name: a tokenizer folder to use, or null to train one for the study (the family's special
            tokens) on `tokenizer_train_file`.
        tokenizer_train_file: files for the study's tokenizer (null: `train_file`).
        tokenizer_vocab_size: its vocabulary size (special tokens and 100 sentinels included).
        tokenizer_max_characters: characters read to train it.
        train_file: pretraining files (text, JSON lines, parquet; compressed or not), or null with `dataset_name`.
        validation_file: held-out files, or null to hold out `validation_split_percentage` % of the documents.
        dataset_name: a hub dataset instead of `train_file`.
        dataset_config_name: its configuration.
        validation_split_percentage: percent of training documents held out when `validation_file` is null.
        block_size: input tokens per sequence (an encoder-decoder's span-corrupted encoder input; the paper: 512).
        train_batch_tokens: input tokens per optimizer step over all processes (the paper: 65,536).
        gradient_accumulation_steps: micro-batches per optimizer step.
        max_train_steps: optimizer steps of every pretraining run (the paper: 524,288); at least 8.
        learning_rate: peak AdamW learning rate (every variant; the paper's ReZero and Fixup exception, Adam
            instead of Adafactor, does not arise: every run uses AdamW).
        weight_decay: AdamW weight decay.
        lr_scheduler_type: `transformers.get_scheduler` name.
        lr_scheduler_kwargs: the schedule's own arguments (mapping).
        num_warmup_steps: linear warmup steps.
        noise_density: span corruption: fraction of tokens corrupted (T5: 0.15); masked LM: fraction of tokens
            selected (BERT: 0.15).
        mean_noise_span_length: span corruption: mean span length (T5: 3).
        max_eval_samples: held-out blocks the losses are measured on.
        per_device_eval_batch_size: evaluation batch size.
        eval_seed: seed of the held-out blocks' corruption, the same for every run.
        mixed_precision: `auto` (bf16 where the device computes it natively, else fp32:
            `hfzoo.training.precision.resolve_mixed_precision`), `no`, `bf16` or `fp16`.
        attn_implementation: `eager`, `sdpa`, ...
        preprocessing_num_workers: processes for tokenization (null: one).
        pretrain_args: further `hfzoo-pretrain` arguments for every run (mapping; true = a bare flag); they
            override the study's own.
        glue_data_dir: a folder in the GLUE layout (null: the hub's `nyu-mll/glue`).
        glue_tasks: GLUE tasks to finetune on.
        glue_max_train_samples: training examples per task: a fixed random subset, the same for every run.
        glue_subset_seed: seed choosing those subsets.
        glue_num_train_epochs: finetuning epochs (the last epoch's model is evaluated).
        glue_learning_rate: finetuning learning rate.
        glue_train_batch_size: finetuning examples per step over all processes.
        glue_max_length: tokens per example after truncation.
        glue_args: further `hfzoo-finetune-glue` arguments for every task (mapping; override the study's).
        paper_table: the paper's Table 1 as TSV (`load_paper_table`), or null for no comparison.
    """

    config_name: str
    config_overrides: dict
    family: str
    variants: list
    seeds: list
    tokenizer_name: str | None
    tokenizer_train_file: list | None
    tokenizer_vocab_size: int
    tokenizer_max_characters: int
    train_file: list | None
    validation_file: list | None
    dataset_name: str | None
    dataset_config_name: str | None
    validation_split_percentage: int
    block_size: int
    train_batch_tokens: int
    gradient_accumulation_steps: int
    max_train_steps: int
    learning_rate: float
    weight_decay: float
    lr_scheduler_type: str
    lr_scheduler_kwargs: dict
    num_warmup_steps: int
    noise_density: float
    mean_noise_span_length: float
    max_eval_samples: int
    per_device_eval_batch_size: int
    eval_seed: int
    mixed_precision: str
    attn_implementation: str
    preprocessing_num_workers: int | None
    pretrain_args: dict
    glue_data_dir: str | None
    glue_tasks: list
    glue_max_train_samples: int
    glue_subset_seed: int
    glue_num_train_epochs: int
    glue_learning_rate: float
    glue_train_batch_size: int
    glue_max_length: int
    glue_args: dict
    paper_table: str | None


#: Keys holding paths: kept as given (relative to the working directory) in the settings and `study.json`, made
#: absolute for the run (`resolve_paths`); a study folder records what data they point to (`data_fingerprints`).
PATH_KEYS = (
    "config_name",
    "tokenizer_name",
    "tokenizer_train_file",
    "train_file",
    "validation_file",
    "glue_data_dir",
    "paper_table",
)


def _field_kind(field: dataclasses.Field) -> tuple[str, bool]:
    """`(kind, optional)` of a settings field: kind is one of str, int, float, list, dict."""
    annotation = str(field.type)
    optional = "None" in annotation
    kind = annotation.split("|")[0].strip()
    return kind, optional


def _check_type(key: str, value: Any, source: str) -> Any:
    """Check (and lightly normalise) one setting's value against its field type."""
    kind, optional = _field_kind(_FIELDS[key])
    if value is None:
        if optional:
            return None
        raise ValueError(f"{source}: {key} must not be null")
    if kind == "list" and isinstance(value, (str, int)) and not isinstance(value, bool):
        value = [value]  # a single file or seed
    expected = {"str": str, "int": int, "float": (int, float), "list": list, "dict": dict}[kind]
    if isinstance(value, bool) and kind in ("int", "float") or not isinstance(value, expected):
        raise ValueError(f"{source}: {key}={value!r} should be {'a' if kind != 'int' else 'an'} {kind}")
    if kind == "float":
        value = float(value)
    if key == "seeds" and not all(isinstance(s, int) and not isinstance(s, bool) for s in value):
        raise ValueError(f"{source}: seeds={value!r} should be a list of integers")
    if key in ("variants", "glue_tasks", "train_file", "validation_file", "tokenizer_train_file") and not all(
        isinstance(v, str) for v in value
    ):
        raise ValueError(f"{source}: {key}={value!r} should be a list of strings")
    return value


_FIELDS = {f.name: f for f in dataclasses.fields(StudySettings)}


def _parse_mapping(text: str) -> dict:
    """A command-line mapping: YAML/JSON (`{a: 1}`) or `key=value,...` with YAML-typed values."""
    text = text.strip()
    if text.startswith("{"):
        parsed = yaml.safe_load(text)
        if not isinstance(parsed, dict):
            raise ValueError(f"{text!r} is not a mapping")
        return parsed
    return {key: yaml.safe_load(value) for key, value in parse_overrides(text).items()}


def build_parser() -> argparse.ArgumentParser:
    """The parser of `hfzoo-study`: the study file, run options, and one flag per study-file key."""
    p = OneLineErrorParser(
        prog="hfzoo-study",
        description="Reproduce Narang et al. 2021's modification study at small scale (pretraining + GLUE).",
    )
    p.add_argument("--study", required=True, help="YAML study file (e.g. recipes/studies/narang_small.yaml)")
    p.add_argument("--output_dir", required=True, help="where runs, results.json, results.md and plots go")
    p.add_argument(
        "--overwrite_output_dir",
        action="store_true",
        help="delete a study with other settings found in --output_dir and start again",
    )
    p.add_argument(
        "--launcher",
        default=None,
        help="run each stage in a child process started with this command, e.g. "
        "'accelerate launch --config_file accelerate_configs/ddp.yaml' or 'python' (default: in this process)",
    )
    p.add_argument(
        "--num_processes",
        type=int,
        default=1,
        help="processes per run the launcher starts (the per-device batch is divided by it)",
    )
    p.add_argument(
        "--parallel_runs",
        type=parallel_runs_value,
        default=1,
        help="study processes this command runs at once on --output_dir (itself and N-1 child processes); "
        "each takes the runs no other holds. On one GPU, several keep it busy with models this small. "
        "'auto': as many as the GPU's free memory (or, on the CPU, the cores and RAM) allow, each with "
        "OMP_NUM_THREADS = cores / processes (hfzoo.study.parallel)",
    )
    p.add_argument(
        "--report_only",
        action="store_true",
        help="rewrite results.json, results.md and the plots from the finished runs; train nothing",
    )
    g = p.add_argument_group("study-file keys (override the file)")
    for name, field in _FIELDS.items():
        kind, _ = _field_kind(field)
        if kind == "list":
            g.add_argument(f"--{name}", nargs="+", default=None)
        else:
            g.add_argument(f"--{name}", default=None, help=None)
    return p


def parallel_runs_value(text: str) -> int | str:
    """`--parallel_runs`: a positive integer or `auto`.

    Raises:
        argparse.ArgumentTypeError: anything else (argparse names the flag).
    """
    if text.strip().lower() == "auto":
        return "auto"
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'auto', got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'auto', got {value}")
    return value


def load_settings(path: str | os.PathLike, overrides: dict[str, Any] | None = None) -> StudySettings:
    """Read a study file, apply command-line values and check types; paths stay as given (see `resolve_paths`).

    Args:
        path: the YAML study file; every `StudySettings` field must be a key.
        overrides: `{key: value}` from the command line (strings, lists of strings), or None.

    Returns:
        The settings.

    Raises:
        FileNotFoundError: no such study file.
        ValueError: not a mapping, a missing or unknown key, or a value of the wrong type.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"--study {path}: no such file")
    values = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(values, dict):
        raise ValueError(f"--study {path}: expected a mapping of study keys to values")
    missing = [k for k in _FIELDS if k not in values]
    if missing:
        raise ValueError(f"--study {path}: missing keys {missing} (every key of the study file is required)")
    unknown = sorted(set(values) - set(_FIELDS))
    if unknown:
        raise ValueError(f"--study {path}: unknown keys {unknown}; valid keys: {list(_FIELDS)}")
    checked = {key: _check_type(key, values[key], f"--study {path}") for key in _FIELDS}
    for key, value in (overrides or {}).items():
        if value is None:
            continue
        kind, _ = _field_kind(_FIELDS[key])
        try:
            if kind == "dict":
                value = _parse_mapping(value)
            elif kind == "list":
                value = [yaml.safe_load(v) if key == "seeds" else v for v in value]
            else:
                value = yaml.safe_load(value) if kind in ("int", "float") or value.lower() in ("null", "~") else value
        except (ValueError, yaml.YAMLError) as err:
            raise ValueError(f"--{key}: {err}") from None
        checked[key] = _check_type(key, value, f"--{key}")
    return StudySettings(**checked)


def resolve_paths(settings: StudySettings) -> StudySettings:
    """The settings with every path made absolute (relative ones against the working directory), for the runs.

    The recipes' child processes (`--launcher`) get these, so they find the data wherever they run.
    """
    resolved = {}
    for key in PATH_KEYS:
        value = getattr(settings, key)
        if key == "config_name" and value in PRESETS:
            continue
        if isinstance(value, list):
            resolved[key] = [str(Path(v).resolve()) for v in value]
        elif value is not None:
            resolved[key] = str(Path(value).resolve())
    return dataclasses.replace(settings, **resolved)


# ----------------------------------------------------------------------------------------------- checks


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


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "row"


def run_dir(output_dir: Path, variant: str, seed: int) -> Path:
    """The folder of one (variant, seed) run: `runs/<variant slug>/seed_<seed>`."""
    return output_dir / "runs" / _slug(variant) / f"seed_{seed}"


def _config_values(config: PreTrainedConfig) -> dict[str, Any]:
    """Every field of `config` as plain JSON (the transformers version left out)."""
    values = json.loads(config.to_json_string(use_diff=False))
    values.pop("transformers_version", None)
    return values


def run_key(settings: StudySettings, variant: str, seed: int, config: PreTrainedConfig) -> dict[str, Any]:
    """What one run trains: `{"variant", "family", "seed", "config"}` (the resolved config as plain JSON)."""
    return {"variant": variant, "family": settings.family, "seed": seed, "config": _config_values(config)}


def _held_key(folder: Path) -> dict[str, Any] | None:
    """The key of the run a folder holds (`run_key`), or None for a folder with nothing of a run yet.

    A folder written before `run.json` existed gives the row and seed of its `result.json` and its `config.json`.
    """
    key = _read_json(folder / RUN_KEY_FILE)
    if key is not None:
        return key
    record, config = _read_json(folder / RECORD_FILE), folder / "config.json"
    if record is None and not config.is_file():
        return None
    key = {"variant": None, "seed": None, "config": None} if record is None else dict(record)
    if config.is_file():
        with contextlib.suppress(OSError, ValueError):
            key["config"] = _config_values(AutoConfig.from_pretrained(folder))
    return key


def check_run_folders(
    output_dir: Path, settings: StudySettings, plan: list[tuple[str, int]], tokenizer_fields: dict[str, Any]
) -> None:
    """Refuse a planned run whose folder holds a run of another row, family, seed or config, before any work.

    Two row names can share a folder name (`"Factorized & shared embeddings"` and `"+ Factorized & shared
    embeddings"` both give `runs/factorized-shared-embeddings/`); a study file naming one must not reuse (and
    report under its name) the other's finished run. Each existing run folder's key (`run.json`, see
    `run_key`) must name the requested row, the study's family, the seed and the config the row resolves to.

    Args:
        output_dir: the study folder.
        settings: the study settings.
        plan: the `(variant, seed)` runs of this selection.
        tokenizer_fields: the tokenizer's `vocab_size` and special token ids; where they are only planned
            (the study's tokenizer is not trained yet), pass `planned=True` fields: those keys are not compared.

    Raises:
        ValueError: one line naming the folder, the row (family, seed or config field) it holds and the one
            requested.
    """
    planned = tokenizer_fields.get("planned", False)
    fields = {k: v for k, v in tokenizer_fields.items() if k != "planned"}
    configs: dict[str, dict[str, Any]] = {}
    for variant, seed in plan:
        folder = run_dir(output_dir, variant, seed)
        held = _held_key(folder) if folder.is_dir() else None
        if held is None:
            continue
        advice = f"use another --output_dir, or delete {folder} to train {variant!r} there"
        if held.get("variant") not in (None, variant):
            raise ValueError(
                f"{folder} holds the run of row {held['variant']!r}, not of the requested row {variant!r} "
                f"(both rows have the folder name {folder.parent.name!r}); {advice}"
            )
        for key, wanted in (("family", settings.family), ("seed", seed)):
            if held.get(key) not in (None, wanted):
                raise ValueError(
                    f"{folder} holds a run of {variant!r} with {key} {held[key]!r}, "
                    f"not the requested {wanted!r}; {advice}"
                )
        if held.get("config") is None:
            continue
        if variant not in configs:
            row = BASELINE if variant == NO_PRETRAINING else variant
            configs[variant] = run_key(settings, variant, seed, build_variant_config(settings, row, fields))["config"]
        wanted = configs[variant]
        skip = set(fields) if planned else set()
        differ = sorted(
            k for k in set(wanted) | set(held["config"]) if k not in skip and held["config"].get(k) != wanted.get(k)
        )
        if differ:
            key = differ[0]
            raise ValueError(
                f"{folder} holds a run of {variant!r} with another config ({key}={held['config'].get(key)!r} there, "
                f"{wanted.get(key)!r} requested); {advice}"
            )


def sequences_per_device(settings: StudySettings, num_processes: int) -> int:
    """Per-device batch size (sequences) giving `train_batch_tokens` per optimizer step.

    Raises:
        ValueError: the tokens do not divide into whole sequences per device and micro-batch.
    """
    per_step = settings.block_size * settings.gradient_accumulation_steps * num_processes
    if settings.train_batch_tokens % per_step:
        raise ValueError(
            f"train_batch_tokens={settings.train_batch_tokens} is not a multiple of block_size x "
            f"gradient_accumulation_steps x processes = {per_step}"
        )
    return settings.train_batch_tokens // per_step


def _flag_list(flags: dict[str, Any]) -> list[str]:
    """`{"learning_rate": 0.1, "train_file": [a, b], "streaming": True, "x": None}` -> command-line arguments.

    A list gives several values after one flag, True a bare flag; None and False leave the flag out.
    """
    argv = []
    for key, value in flags.items():
        if value is False or value is None:
            continue
        argv.append(f"--{key}")
        if value is not True:
            argv.extend(str(v) for v in (value if isinstance(value, list) else [value]))
    return argv


def pretrain_argv(
    settings: StudySettings,
    tokenizer: str,
    config_path: Path,
    seed: int,
    output: Path,
    num_processes: int,
    variant: str | None = None,
) -> list[str]:
    """The `hfzoo-pretrain` arguments of one run (the family's objective, evaluation every 1/8 of training).

    The study's own flags, then its `pretrain_args`, then the row's pretraining arguments
    (`hfzoo.models.modern.row_pretrain_args(variant)`, e.g. `--optim muon`); a later one wins.
    """
    early_step = settings.max_train_steps // EARLY_FRACTION
    objective = FAMILIES[settings.family].objective
    corruption = {
        "span": {"noise_density": settings.noise_density, "mean_noise_span_length": settings.mean_noise_span_length},
        "mlm": {"mlm_probability": settings.noise_density},
    }.get(objective, {})
    flags = {
        "objective": objective,
        "tokenizer_name": tokenizer,
        "config_name": str(config_path),
        **{key: getattr(settings, key) for key in ("train_file", "validation_file", "dataset_name",
                                                   "dataset_config_name", "preprocessing_num_workers",
                                                   "validation_split_percentage", "block_size")},
        "per_device_train_batch_size": sequences_per_device(settings, num_processes),
        **{key: getattr(settings, key) for key in ("gradient_accumulation_steps", "learning_rate", "weight_decay",
                                                   "lr_scheduler_type")},
        "lr_scheduler_kwargs": json.dumps(settings.lr_scheduler_kwargs),
        **{key: getattr(settings, key) for key in ("num_warmup_steps", "max_train_steps")},
        "eval_steps": early_step,  # validation loss at 1/8, 2/8, ... of training: the early loss is the first
        "logging_steps": max(1, early_step // 4),
        **{key: getattr(settings, key) for key in ("max_eval_samples", "per_device_eval_batch_size")},
        **corruption,
        **{key: getattr(settings, key) for key in ("mixed_precision", "attn_implementation")},
        "seed": seed,
        "eval_seed": settings.eval_seed,
        "output_dir": str(output),
    }  # fmt: skip
    row = row_pretrain_args(variant) if variant is not None else {}
    return _flag_list({**flags, **settings.pretrain_args, **row})


def glue_batch_size(settings: StudySettings, num_processes: int) -> int:
    """Per-device finetuning batch size giving `glue_train_batch_size` examples per step over all processes.

    Raises:
        ValueError: the batch does not divide among the processes.
    """
    if settings.glue_train_batch_size % num_processes:
        raise ValueError(f"glue_train_batch_size={settings.glue_train_batch_size} does not divide among "
                         f"{num_processes} processes")  # fmt: skip
    return settings.glue_train_batch_size // num_processes


def glue_argv(
    settings: StudySettings, task: str, model: Path, train_subset: Path | None, seed: int, output: Path,
    num_processes: int = 1,
) -> list[str]:  # fmt: skip
    """The `hfzoo-finetune-glue` arguments of one task of one run (full finetuning, the last epoch evaluated)."""
    flags = {
        "task_name": task,
        "model_name_or_path": str(model),
        "peft": "none",
        "save_last_epoch": True,
        "data_dir": settings.glue_data_dir,
        # the study's fixed subset; without local files the recipe draws one with the run's seed
        "train_file": None if train_subset is None else str(train_subset),
        "max_train_samples": settings.glue_max_train_samples if train_subset is None else None,
        "num_train_epochs": settings.glue_num_train_epochs,
        "learning_rate": settings.glue_learning_rate,
        "per_device_train_batch_size": glue_batch_size(settings, num_processes),
        "max_length": settings.glue_max_length,
        "mixed_precision": settings.mixed_precision,
        "attn_implementation": settings.attn_implementation,
        "seed": seed,
        "output_dir": str(output),
    }
    return _flag_list({**flags, **settings.glue_args})


def _glue_files(settings: StudySettings, task: str) -> list[Path]:
    spec = get_glue_task(task)
    folder = Path(settings.glue_data_dir) / spec.folder
    return [folder / spec.train_file, *(folder / name for name in spec.validation_files.values())]


def check_settings(settings: StudySettings, num_processes: int = 1) -> dict[str, Any]:
    """Refuse bad settings before anything is trained; return what the runs need.

    Checks: at least one variant and seed, known and distinct variant names, at least `EARLY_FRACTION`
    steps, the data, tokenizer, GLUE and paper files, every variant's config (built with the planned
    vocabulary), the recipes' own argument checks on every run's arguments, and the batch arithmetic.

    Args:
        settings: from `load_settings`.
        num_processes: processes per run (the launcher's).

    Returns:
        `{"tokenizer_fields": {...}}` for building configs before the study's tokenizer exists.

    Raises:
        ValueError, FileNotFoundError: the first problem found, naming the key and the value.
    """
    if settings.family not in FAMILIES:
        raise ValueError(f"family={settings.family!r}: {choice_hint(settings.family, FAMILIES)}")
    if not settings.variants:
        raise ValueError("variants: the study has no variants")
    if not settings.seeds:
        raise ValueError("seeds: the study has no seeds (give at least one)")
    unknown = [v for v in settings.variants if v not in STUDY_ROWS]
    if unknown:
        hints = "; ".join(
            f"unknown row {v!r}: {choice_hint(v, STUDY_ROWS, 'hfzoo.models.modern.STUDY_ROWS')}" for v in unknown
        )
        raise ValueError(f"variants: {hints}")
    for key in ("variants", "seeds", "glue_tasks"):
        values = getattr(settings, key)
        if len(set(values)) != len(values):
            raise ValueError(f"{key}: {values} lists an entry twice")
    slugs = [_slug(v) for v in settings.variants]
    if len(set(slugs)) != len(slugs):
        raise ValueError(f"variants: {settings.variants} contain two names with the same folder name")
    if settings.max_train_steps < EARLY_FRACTION:
        raise ValueError(
            f"max_train_steps={settings.max_train_steps}: needs at least {EARLY_FRACTION} steps "
            f"(the early loss is measured at 1/{EARLY_FRACTION} of training)"
        )
    for key in (
        "tokenizer_vocab_size",
        "tokenizer_max_characters",
        "train_batch_tokens",
        "max_eval_samples",
        "glue_max_train_samples",
        "glue_num_train_epochs",
    ):
        if getattr(settings, key) < 1:
            raise ValueError(f"{key} must be positive, got {getattr(settings, key)}")
    if not settings.train_file and not settings.dataset_name:
        raise ValueError("give train_file or dataset_name (the pretraining data)")
    for key in ("train_file", "validation_file", "tokenizer_train_file"):
        for file in getattr(settings, key) or []:
            if not Path(file).is_file():
                raise FileNotFoundError(f"{key}: {file}: no such file")
    if settings.tokenizer_name is None and not (settings.tokenizer_train_file or settings.train_file):
        raise ValueError("tokenizer_name is null and there are no files to train the study's tokenizer on")
    if settings.paper_table is not None:
        load_paper_table(settings.paper_table)
    if settings.glue_data_dir is not None:
        for task in settings.glue_tasks:
            get_glue_task(task)
            absent = [str(f) for f in _glue_files(settings, task) if not f.is_file()]
            if absent:
                raise FileNotFoundError(f"glue_tasks: {task}: files absent: {absent}")
    else:
        for task in settings.glue_tasks:
            get_glue_task(task)
    sequences_per_device(settings, num_processes)
    glue_batch_size(settings, num_processes)

    if settings.tokenizer_name is not None:
        try:
            tokenizer = AutoTokenizer.from_pretrained(settings.tokenizer_name)
        except (OSError, ValueError) as err:
            raise ValueError(
                f"tokenizer_name {settings.tokenizer_name}: cannot load ({str(err).splitlines()[0]})"
            ) from None
        fields = _tokenizer_fields(tokenizer)
    else:  # the ids the study's tokenizer will get, its planned size
        fields = planned_tokenizer_fields(settings.family, settings.tokenizer_vocab_size)
    for variant in settings.variants:
        build_variant_config(settings, variant, fields)
    scratch = Path("/nonexistent-study-check")
    tokenizer_path = settings.tokenizer_name or str(scratch)
    for variant in settings.variants:  # every row's arguments (a row may change them: the Muon rows)
        argv = pretrain_argv(settings, tokenizer_path, scratch / "config.json", 0, scratch, num_processes, variant)
        try:
            _check_recipe_arguments("pretraining", parse_pretrain_args, argv)
        except ValueError as err:
            raise ValueError(f"variant {variant!r}: {err}") from None
    pretrain = pretrain_argv(settings, tokenizer_path, scratch / "config.json", 0, scratch, num_processes)
    for task in settings.glue_tasks:
        argv = glue_argv(settings, task, scratch, None, 0, scratch, num_processes)
        _check_recipe_arguments("GLUE", parse_glue_args, argv)
    if settings.tokenizer_name is not None:
        from ..training.objectives import get_objective

        objective = get_objective(FAMILIES[settings.family].objective)
        try:
            objective.build_collator(parse_pretrain_args(pretrain), tokenizer, settings.block_size)
        except ValueError as err:
            raise ValueError(f"tokenizer_name {settings.tokenizer_name}: {err}") from None
    return {"tokenizer_fields": fields}


def _check_recipe_arguments(recipe: str, parse, argv: list[str]) -> None:
    """Run a recipe's own argument checks on `argv`; raise ValueError with its message (argparse's included)."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            parse(argv)
    except (SystemExit, ValueError) as err:
        reason = captured.getvalue().strip().splitlines()[-1] if captured.getvalue().strip() else str(err)
        raise ValueError(f"the {recipe} arguments are refused: {reason}") from None


def _tokenizer_fields(tokenizer) -> dict[str, Any]:
    return {
        "vocab_size": len(tokenizer),
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": tokenizer.bos_token_id,
    }


# ------------------------------------------------------------------------------------------- execution


def _write_json(path: Path, value: Any) -> None:
    """Write JSON atomically (a temporary file renamed into place)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(value, indent=2, default=float) + "\n")
    os.replace(tmp, path)


def _read_json(path: Path) -> Any:
    """The JSON in `path`, or None when it is absent or unreadable (a torn write)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def _lock(path: Path, blocking: bool) -> Iterator[bool]:
    """An exclusive `flock` on `path` for the duration; yields False if not blocking and another process holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _saved_settings(settings: StudySettings) -> dict[str, Any]:
    values = dataclasses.asdict(settings)
    return {k: v for k, v in values.items() if k not in SELECTION_KEYS}


#: Files of a tokenizer folder its fingerprint leaves out: model weights, which the tokenizer does not read.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack")


def _fingerprint(path: Path, files: list[str] | None = None) -> dict[str, Any] | None:
    """A file's `{"size", "sha256"}`; a folder's `{"files": {relative path: that or None}}`; None if absent.

    A folder's `files` default to the files directly in it, weights aside.
    """
    if path.is_file():
        return {"size": path.stat().st_size, "sha256": file_sha256(path)}
    if not path.is_dir():
        return None
    if files is None:
        files = sorted(f.name for f in path.iterdir() if f.is_file() and f.suffix not in _WEIGHT_SUFFIXES)
    return {"files": {name: _fingerprint(path / name) for name in files}}


def data_fingerprints(settings: StudySettings) -> dict[str, Any]:
    """What each path setting points to, so that a study folder recognises its data under another path.

    Per key of `PATH_KEYS`: None when there is no local data (null, a preset, a hub name), else the
    `_fingerprint` of the data the study reads: each file of a list; of `glue_data_dir` the study's tasks'
    training and dev files; of a `config_name` folder its `config.json`; a file or tokenizer folder whole.
    """
    prints: dict[str, Any] = {}
    for key in PATH_KEYS:
        value = getattr(settings, key)
        if value is None or key == "config_name" and value in PRESETS:
            prints[key] = None
        elif isinstance(value, list):
            prints[key] = [_fingerprint(Path(v)) for v in value]
        elif key == "glue_data_dir":
            files = [f.relative_to(value).as_posix() for t in settings.glue_tasks for f in _glue_files(settings, t)]
            prints[key] = _fingerprint(Path(value), files)
        else:
            prints[key] = _fingerprint(Path(value), ["config.json"] if key == "config_name" else None)
    return prints


def _data_difference(there: Any, here: Any) -> str:
    """What differs between two fingerprints (`_fingerprint`, or lists of them), in a few words."""
    if there is None or here is None:
        return "absent there" if there is None else "absent here"
    if isinstance(there, list) or isinstance(here, list):
        if not (isinstance(there, list) and isinstance(here, list)) or len(there) != len(here):
            count = [len(v) if isinstance(v, list) else 1 for v in (there, here)]
            return f"{count[0]} file(s) there, {count[1]} here"
        index = next(i for i, (a, b) in enumerate(zip(there, here)) if a != b)
        return f"file {index + 1}: {_data_difference(there[index], here[index])}"
    if "files" in there and "files" in here:
        a, b = there["files"], here["files"]
        if set(a) != set(b):
            return f"files only there: {sorted(set(a) - set(b))}, only here: {sorted(set(b) - set(a))}"
        name = next(n for n in sorted(a) if a[n] != b[n])
        return f"{name}: {_data_difference(a[name], b[name])}"
    if "files" in there or "files" in here:
        return "a folder there, a file here" if "files" in there else "a file there, a folder here"
    if there["size"] != here["size"]:
        return f"size {there['size']} bytes there, {here['size']} here"
    return f"same size ({here['size']} bytes) but sha256 {there['sha256'][:12]}... there, {here['sha256'][:12]}... here"


def _study_differences(saved: dict[str, Any], settings: StudySettings, data: dict[str, Any]) -> tuple[list, list]:
    """`(settings, data)`: one line per setting, and per path setting whose data, that differs from `saved`.

    A path setting compares by its data (`data_fingerprints`), however it is spelled; where a side has no
    local data (null, a preset, a hub name, an absent path), by its value first. A `study.json` without
    `data` (written before data was recorded) holds absolute paths: they compare with the resolved ones.
    """
    old, current = saved.get("settings", {}), _saved_settings(settings)
    old = {"family": "encoder-decoder", **old}  # recorded before studies had families: the encoder-decoder
    old_data = saved.get("data")
    if old_data is None:
        current.update({k: v for k, v in _saved_settings(resolve_paths(settings)).items() if k in PATH_KEYS})
    other_settings, other_data = [], []
    for key in sorted(set(old) | set(current)):
        shown = f"{key}: {old.get(key)!r} there, {current.get(key)!r} here"
        same_value = old.get(key) == current.get(key)
        if old_data is None or key not in PATH_KEYS:
            if not same_value:
                other_settings.append(shown)
            continue
        there, here = old_data.get(key), data[key]
        if None in (there, here) and not same_value:
            other_settings.append(shown)  # no local data on one side: the values tell
        elif there != here:
            other_data.append(f"{shown} ({_data_difference(there, here)})")
    return other_settings, other_data


def prepare_output_dir(output_dir: Path, settings: StudySettings, overwrite: bool) -> None:
    """Record the settings and their data in `study.json`, or refuse a folder holding another study.

    The variants and seeds are not part of the comparison: one folder can be filled a subset at a time.
    Paths are recorded as given, and with them the data they point to (`data_fingerprints`): a path
    spelled otherwise (the data or the folder moved, another working directory) is the same study if its
    data is the same; the record is then updated to the new paths.

    Raises:
        ValueError: the folder's study differs (the message names the first differing keys, and for a path
            setting what differs in its data), unless `overwrite`, which deletes the folder's contents first.
    """
    saved_file = output_dir / STUDY_FILE
    record = {"settings": _saved_settings(settings), "data": data_fingerprints(settings)}
    saved = _read_json(saved_file)
    if saved is None and output_dir.is_dir() and any(output_dir.iterdir()) and not overwrite:
        if (output_dir / "runs").exists() or saved_file.exists():
            raise ValueError(
                f"--output_dir {output_dir}: holds study runs without a readable {STUDY_FILE}; "
                "use --overwrite_output_dir to start again"
            )
    other_settings, other_data = _study_differences(saved, settings, record["data"]) if saved else ([], [])
    if (other_settings or other_data) and not overwrite:
        shown = "; ".join((other_settings + other_data)[:3])
        raise ValueError(
            f"--output_dir {output_dir} holds a study with other {'settings' if other_settings else 'data'} "
            f"({shown}); use --overwrite_output_dir to replace it, or another --output_dir"
        )
    if other_settings or other_data:
        for child in output_dir.iterdir():
            if child.name.startswith(".study"):
                continue
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    output_dir.mkdir(parents=True, exist_ok=True)
    if saved != record:
        _write_json(saved_file, record)


def ensure_tokenizer(settings: StudySettings, output_dir: Path) -> str:
    """The tokenizer folder of the study: `tokenizer_name`, or one trained once into `output_dir/tokenizer`.

    A trained tokenizer has the study family's special tokens (`hfzoo.tokenization.FAMILY_SPECIAL_TOKENS`).
    """
    if settings.tokenizer_name is not None:
        return settings.tokenizer_name
    folder = output_dir / "tokenizer"
    if (folder / "tokenizer_config.json").is_file():
        return str(folder)
    tmp = output_dir / "tokenizer.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    files = settings.tokenizer_train_file or settings.train_file
    argv = [
        "--model_family",
        settings.family,
        "--vocab_size",
        str(settings.tokenizer_vocab_size),
        "--max_characters",
        str(settings.tokenizer_max_characters),
        "--output_dir",
        str(tmp),
    ]
    argv += ["--train_file", *files] if files else ["--dataset_name", settings.dataset_name]
    if not files and settings.dataset_config_name:
        argv += ["--dataset_config_name", settings.dataset_config_name]
    print(f"=== study tokenizer: hfzoo-train-tokenizer {shlex.join(argv)}", flush=True)
    start = time.perf_counter()
    train_tokenizer(argv)
    os.replace(tmp, folder)
    record = _read_json(output_dir / PREPARATION_FILE) or {}
    record["tokenizer_seconds"] = time.perf_counter() - start
    _write_json(output_dir / PREPARATION_FILE, record)
    return str(folder)


def ensure_pretraining_data(settings: StudySettings, output_dir: Path, tokenizer_dir: str, num_processes: int = 1):
    """Tokenize and pack the pretraining data once per study, before any run, into `datasets`' cache.

    The study's runs all read the same data with the same tokenizer and block size, so they all ask
    `datasets` for the same maps: this does them once (`hfzoo.pretraining.pack_pretraining_data`, the pretraining
    recipe's own call, with the study's arguments), and every run, every other study process on the folder and every
    rerun then loads the blocks from `datasets`' cache (its fingerprints are those of the data files, the
    tokenizer and the block size; the cache lives under `HF_DATASETS_CACHE`) instead of tokenizing again.
    Called under the study lock, so that parallel study processes do not tokenize the same data at once.
    With `pretrain_args: {streaming: true}` there is nothing to prepare (the stream is read by each run).

    Returns:
        `{"train_blocks", "validation_blocks", "seconds"}` (wall seconds of this call; a cache hit is fast),
        or None when streaming.
    """
    scratch = Path("/nonexistent-study-check")
    args = parse_pretrain_args(
        pretrain_argv(settings, tokenizer_dir, scratch / "config.json", 0, scratch, num_processes)
    )
    if args.streaming:
        return None
    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    from ..training.objectives import get_objective

    objective = get_objective(args.objective)
    _, raw_block_size = objective.build_collator(args, tokenizer, args.block_size)
    print(f"=== study data: tokenized once into datasets' cache (blocks of {raw_block_size} tokens)", flush=True)
    packed = pack_pretraining_data(args, tokenizer, objective, raw_block_size)  # the recipe's own call
    seconds = time.perf_counter() - start
    prepared = {
        "train_blocks": len(packed["train"]),
        "validation_blocks": len(packed["validation"]),
        "seconds": seconds,
    }
    record = _read_json(output_dir / PREPARATION_FILE) or {}
    record.setdefault("data", prepared)  # the first preparation of the folder (later ones load the cache)
    _write_json(output_dir / PREPARATION_FILE, record)
    return prepared


def ensure_glue_subsets(settings: StudySettings, output_dir: Path) -> dict[str, Path | None]:
    """Write each task's fixed training subset (the same examples for every run) as a TSV in the task's layout.

    `glue_max_train_samples` rows drawn with `glue_subset_seed` from the task's `train.tsv` (all rows if
    fewer), in file order, header kept. Without `glue_data_dir` (hub data) there is no file to subset and
    the GLUE recipe draws `--max_train_samples` with the run's seed instead (value None).
    """
    if settings.glue_data_dir is None:
        return dict.fromkeys(settings.glue_tasks)
    folder = output_dir / "glue_train_subsets"
    folder.mkdir(parents=True, exist_ok=True)
    subsets = {}
    for task in settings.glue_tasks:
        path = folder / f"{task}.tsv"
        if not path.is_file():
            source = _glue_files(settings, task)[0]
            lines = source.read_text(encoding="utf-8").splitlines(keepends=True)
            header, rows = ([], lines) if get_glue_task(task).header is not None else (lines[:1], lines[1:])
            rows = [r if r.endswith("\n") else r + "\n" for r in rows if r.strip()]
            keep = sorted(
                random.Random(settings.glue_subset_seed).sample(
                    range(len(rows)), min(len(rows), settings.glue_max_train_samples)
                )
            )
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text("".join(header + [rows[i] for i in keep]), encoding="utf-8")
            os.replace(tmp, path)
        subsets[task] = path
    return subsets


def _pdeathsig() -> None:  # pragma: no cover - runs in the child before exec
    """Ask Linux to send SIGTERM to this child when the study process dies (prctl PR_SET_PDEATHSIG)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


class StudyInterrupted(Exception):
    """A stage was stopped by SIGTERM or SIGINT: the whole study stops (the same command continues it)."""


#: Exit statuses of a child process stopped by SIGTERM/SIGINT: a recipe's graceful stop, or the signal itself.
_STOPPED_BY_SIGNAL = (EXIT_PREEMPTED, -signal.SIGTERM, -signal.SIGINT)


def run_stage(module: str, argv: list[str], launcher: str | None) -> None:
    """Run a recipe's `main(argv)`: in this process, or `launcher -m module argv` in a child process.

    Raises:
        StudyInterrupted: the stage was stopped by SIGTERM/SIGINT (the recipe's exit code
            `faults.EXIT_PREEMPTED`, or a child process ended by one of these signals).
        RuntimeError: the recipe refused its input or failed (the message says which).
    """
    print(f"=== {module} {shlex.join(argv)}", flush=True)
    if launcher is None:
        from importlib import import_module

        try:
            import_module(module).main(argv)
        except SystemExit as err:
            if err.code == EXIT_PREEMPTED:
                raise StudyInterrupted(f"{module} was stopped by a signal") from None
            raise RuntimeError(f"{module} stopped: {err}") from None
        return
    command = [*shlex.split(launcher), "-m", module, *argv]
    completed = subprocess.run(command, preexec_fn=_pdeathsig if sys.platform.startswith("linux") else None)
    if completed.returncode in _STOPPED_BY_SIGNAL:
        raise StudyInterrupted(f"{shlex.join(command)} was stopped by a signal (status {completed.returncode})")
    if completed.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)} exited with status {completed.returncode}")


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


def _glue_task_score(task: str, results: dict[str, Any]) -> tuple[float, dict[str, float]]:
    """A task's score as GLUE reports it: the mean of its official metrics, x 100.

    A constant prediction (common for a model finetuned from random initialization) has no correlation with
    the labels: scipy's Pearson and Spearman correlations are then undefined (NaN), and the score counts them
    as 0, as scikit-learn's `matthews_corrcoef` (CoLA) does for a constant prediction.
    """
    metrics = {m: float(results[f"eval_{m}"]) for m in get_glue_task(task).metrics}
    metrics = {m: 0.0 if math.isnan(v) and m in ("pearson", "spearmanr") else v for m, v in metrics.items()}
    return 100.0 * sum(metrics.values()) / len(metrics), metrics


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def execute_run(
    settings: StudySettings,
    variant: str,
    seed: int,
    folder: Path,
    tokenizer_dir: str,
    subsets: dict[str, Path | None],
    launcher: str | None,
    num_processes: int,
) -> dict[str, Any]:
    """Pretrain and finetune one (variant, seed), reusing finished stages; return its record.

    Returns:
        The record (see `docs/study.md`): `variant`, `seed`, `config_changes`, `pretrain_changes` (the
        row's pretraining arguments, e.g. `{"optim": "muon"}`), `parameters`,
        `flops_per_token`, `flops_per_step`, `total_flops`, `train_steps`, `train_tokens`, `early_step`,
        `init_loss`, `early_loss`, `final_loss`, `eval_losses` (`[step, loss]`), `glue` (per task: `score`
        and `metrics`), `glue_average`, and `timing` (wall-clock figures, which differ between repeats).
    """
    if variant == NO_PRETRAINING:
        return _execute_without_pretraining(settings, seed, folder, tokenizer_dir, subsets, launcher, num_processes)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = build_variant_config(settings, variant, _tokenizer_fields(tokenizer))
    folder.mkdir(parents=True, exist_ok=True)
    _write_json(folder / RUN_KEY_FILE, run_key(settings, variant, seed, config))
    config.save_pretrained(folder)  # config.json: the variant's model, read by the pretraining recipe
    timing: dict[str, float] = {}

    pretrain_dir = folder / "pretrain"
    results, history = _read_json(pretrain_dir / "all_results.json"), _read_json(pretrain_dir / "train_history.json")
    if results is None or history is None or results.get("train_steps") != settings.max_train_steps:
        shutil.rmtree(pretrain_dir, ignore_errors=True)
        start = time.perf_counter()
        argv = pretrain_argv(
            settings, tokenizer_dir, folder / "config.json", seed, pretrain_dir, num_processes, variant
        )
        run_stage("hfzoo.pretraining", argv, launcher)
        timing["pretrain_seconds"] = time.perf_counter() - start
        results = _read_json(pretrain_dir / "all_results.json")
        history = _read_json(pretrain_dir / "train_history.json")
        if results is None or history is None:
            raise RuntimeError(f"pretraining wrote no all_results.json / train_history.json in {pretrain_dir}")
        # this session's share of the stage: the optimizer steps and the validation passes the loop timed
        timing["train_step_seconds"] = results.get("train_step_seconds", math.nan)
        timing["pretrain_eval_seconds"] = results.get("eval_seconds", math.nan)
    early_step = settings.max_train_steps // EARLY_FRACTION
    losses = {int(r["step"]): float(r["eval_loss"]) for r in history["eval_history"]}
    if early_step not in losses:
        raise RuntimeError(f"{pretrain_dir}/train_history.json has no validation loss at step {early_step}")
    tokens_per_step = results["train_tokens_seen"] / results["train_steps"]
    throughput = [r["tokens_per_second"] for r in history["log_history"] if "tokens_per_second" in r]
    timing["steps_per_second"] = _median(throughput) / tokens_per_step if throughput else math.nan
    timing["pretrain_train_runtime"] = results["train_runtime"]
    glue, glue_seconds = _finetune(settings, folder, pretrain_dir, seed, subsets, launcher, num_processes, timing)

    flops = count_training_flops(config, settings.block_size, target_length(settings))
    sequences_per_step = settings.train_batch_tokens // settings.block_size
    total_flops = flops.total * sequences_per_step * results["train_steps"]
    step_seconds = results.get("train_step_seconds")  # the pretraining's own (also when the stage was reused)
    timing["train_tflops"] = total_flops / step_seconds / 1e12 if step_seconds else math.nan
    return {
        "variant": variant,
        "seed": seed,
        "config_changes": _row_changes(settings, variant, tokenizer),
        "pretrain_changes": row_pretrain_args(variant),
        "parameters": count_parameters(config),
        "flops_per_token": flops.per_token,
        "flops_per_step": flops.total * sequences_per_step,
        "total_flops": total_flops,
        "train_steps": results["train_steps"],
        "train_tokens": results["train_tokens_seen"],
        "early_step": early_step,
        "init_loss": losses.get(0, math.nan),
        "early_loss": losses[early_step],
        "final_loss": float(results["eval_loss"]),
        "eval_losses": [[step, loss] for step, loss in sorted(losses.items())],
        "glue": glue,
        "glue_average": sum(t["score"] for t in glue.values()) / len(glue) if glue else math.nan,
        "timing": timing,
        **_precision_fields(results),
    }


def _precision_fields(results: dict[str, Any]) -> dict[str, Any]:
    """The precision a stage trained in and the device's capability, from its `all_results.json` (None: unknown)."""
    return {key: results.get(key) for key in ("mixed_precision", "host_capability")}


def _finetune(
    settings: StudySettings,
    folder: Path,
    model_dir: Path,
    seed: int,
    subsets: dict[str, Path | None],
    launcher: str | None,
    num_processes: int,
    timing: dict[str, float],
) -> tuple[dict[str, Any], float]:
    """Finetune `model_dir` on every GLUE task (finished tasks reused); `(per-task results, wall seconds)`."""
    glue: dict[str, Any] = {}
    glue_seconds = 0.0
    for task in settings.glue_tasks:
        task_dir = folder / "glue" / task
        task_results = _read_json(task_dir / "all_results.json")
        if task_results is None:
            shutil.rmtree(task_dir, ignore_errors=True)
            start = time.perf_counter()
            run_stage(
                "hfzoo.finetuning",
                glue_argv(settings, task, model_dir, subsets[task], seed, task_dir, num_processes),
                launcher,
            )
            glue_seconds += time.perf_counter() - start
            task_results = _read_json(task_dir / "all_results.json")
            if task_results is None:
                raise RuntimeError(f"GLUE {task} wrote no all_results.json in {task_dir}")
        score, metrics = _glue_task_score(task, task_results)
        glue[task] = {"score": score, "metrics": metrics, "train_examples": task_results["train_examples"],
                      **_precision_fields(task_results)}  # fmt: skip
        timing[f"glue_{task}_train_seconds"] = task_results["train_seconds"]
    if glue_seconds:
        timing["glue_seconds"] = glue_seconds
    return glue, glue_seconds


def _execute_without_pretraining(
    settings: StudySettings,
    seed: int,
    folder: Path,
    tokenizer_dir: str,
    subsets: dict[str, Path | None],
    launcher: str | None,
    num_processes: int,
) -> dict[str, Any]:
    """The "No pretraining" row: the vanilla model, randomly initialised with `seed`, finetuned on every task.

    The model is built as the pretraining recipe builds it (`set_seed(seed)`, then `from_config` with the
    study's attention implementation) and saved untrained to `init/`; the GLUE recipe finetunes it with the
    variants' budget. The record has no losses (NaN) and no pretraining steps, tokens or FLOPs.
    """
    from accelerate.utils import set_seed

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = build_variant_config(settings, BASELINE, _tokenizer_fields(tokenizer))
    folder.mkdir(parents=True, exist_ok=True)
    _write_json(folder / RUN_KEY_FILE, run_key(settings, NO_PRETRAINING, seed, config))
    config.save_pretrained(folder)
    timing: dict[str, float] = {}
    init_dir = folder / "init"
    if not (init_dir / "config.json").is_file():
        start = time.perf_counter()
        tmp = folder / "init.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        set_seed(seed)
        model = pretraining_model_class(config).from_config(config, attn_implementation=settings.attn_implementation)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.replace(tmp, init_dir)
        timing["init_seconds"] = time.perf_counter() - start
    glue, _ = _finetune(settings, folder, init_dir, seed, subsets, launcher, num_processes, timing)
    return {
        "variant": NO_PRETRAINING,
        "seed": seed,
        "config_changes": {},
        "pretrain_changes": {},
        "parameters": count_parameters(config),
        "flops_per_token": 0.0,
        "flops_per_step": 0.0,
        "total_flops": 0.0,
        "train_steps": 0,
        "train_tokens": 0,
        "early_step": 0,
        "init_loss": math.nan,
        "early_loss": math.nan,
        "final_loss": math.nan,
        "eval_losses": [],
        "glue": glue,
        "glue_average": sum(t["score"] for t in glue.values()) / len(glue) if glue else math.nan,
        "timing": timing,
        **_precision_fields(next(iter(glue.values()), {})),
    }


#: Parts of a run's wall time in `timing["seconds"]` (and `timing["fractions"]`), in the order they happen.
TIME_PARTS = ("train_steps", "pretrain_evaluation", "pretrain_other", "finetuning", "other")


def time_breakdown(timing: dict[str, float]) -> dict[str, dict[str, float]]:
    """Split a run's wall time (`run_seconds`) into its parts, as seconds and as fractions of the whole.

    Parts (`TIME_PARTS`): `train_steps` (the pretraining loop's optimizer steps, `train_step_seconds`),
    `pretrain_evaluation` (its validation passes), `pretrain_other` (the rest of the pretraining stage:
    process start under a launcher, data loading, model build, compile, checkpoint and final save),
    `finetuning` (the GLUE stages: their data, training, evaluation and saves) and `other` (the run's own
    work: configs, tokenizer, parameter count, the record). Stages reused from an earlier session count zero
    (their time is not in this session's wall time). The parts sum to `run_seconds` exactly.

    Args:
        timing: a record's `timing` with `run_seconds` and whichever of `pretrain_seconds`,
            `train_step_seconds`, `pretrain_eval_seconds`, `glue_seconds` this session measured.

    Returns:
        `{"seconds": {part: s}, "fractions": {part: s / run_seconds}}`.
    """
    total = timing["run_seconds"]

    def get(key: str) -> float:
        value = timing.get(key, 0.0)
        return 0.0 if value is None or not math.isfinite(value) else float(value)

    pretrain = get("pretrain_seconds")
    steps, evaluation = get("train_step_seconds"), get("pretrain_eval_seconds")
    seconds = {
        "train_steps": steps,
        "pretrain_evaluation": evaluation,
        "pretrain_other": pretrain - steps - evaluation,
        "finetuning": get("glue_seconds"),
        "other": total - pretrain - get("glue_seconds"),
    }
    return {"seconds": seconds, "fractions": {k: v / total if total > 0 else math.nan for k, v in seconds.items()}}


def _row_changes(settings: StudySettings, variant: str, tokenizer) -> dict[str, Any]:
    """The variant's config changes to the study's base, with `Scaled` values resolved."""
    checked, literal = _overrides_and_literals(settings.config_overrides)
    base = build_config(settings.config_name, checked, **literal, **_tokenizer_fields(tokenizer))
    return resolve_row(variant, base.to_dict(), rows=STUDY_ROWS)


def run_study(
    settings: StudySettings,
    output_dir: str | os.PathLike,
    *,
    overwrite: bool = False,
    launcher: str | None = None,
    num_processes: int = 1,
    report_only: bool = False,
    parallel_runs: int | str = 1,
    child_argv: list[str] | None = None,
) -> list[dict]:
    """Run (or continue) a study and write its report; see the module docstring.

    Args:
        settings: from `load_settings` (relative paths: relative to the working directory).
        output_dir: the study folder.
        overwrite: replace a study with other settings or data found in `output_dir`.
        launcher: None (stages in this process) or a command prefix for child processes.
        num_processes: processes per run started by `launcher`.
        report_only: only rewrite the report from finished runs.
        parallel_runs: study processes working on `output_dir` at once: this one and `parallel_runs - 1`
            children (`python -m hfzoo.study` + `child_argv`), started once the tokenizer, the tokenized
            data and the GLUE subsets exist; the final report is written after all of them have ended.
            "auto": sized by `resolve_parallel_runs` (free device memory, cores), which also sets
            `OMP_NUM_THREADS` for every process.
        child_argv: the children's arguments (required when `parallel_runs > 1`).

    Returns:
        The records of the finished runs of this selection (variants x seeds), in study order.

    Raises:
        ValueError, FileNotFoundError: bad settings (before anything is trained).
        RuntimeError: some runs failed (after every other run was attempted and the report written).
        StudyInterrupted: a stage was stopped by SIGTERM/SIGINT; no further run is started.
    """
    output_dir = Path(output_dir)
    if parallel_runs != "auto" and (isinstance(parallel_runs, bool) or not isinstance(parallel_runs, int)
                                    or parallel_runs < 1):  # fmt: skip
        raise ValueError(f"--parallel_runs must be positive (or 'auto'), got {parallel_runs}")
    if parallel_runs != 1 and child_argv is None:
        raise ValueError("parallel_runs > 1 needs child_argv (the arguments of the other study processes)")
    given, settings = settings, resolve_paths(settings)  # study.json keeps the paths as given; the runs get these
    checked = check_settings(settings, num_processes)
    if launcher is not None:  # its launch config, as each stage would check it, but before the first stage
        config_file = launcher_config_file(shlex.split(launcher), Path.cwd())
        if isinstance(config_file, Path):
            check_launch_config(config_file)
    check_output_folder(output_dir)
    plan = study_plan(settings)
    if report_only:
        if _read_json(output_dir / STUDY_FILE) is None:
            raise ValueError(f"--output_dir {output_dir}: no study to report on ({STUDY_FILE} missing)")
        prepare_output_dir(output_dir, given, overwrite=False)
        check_run_folders(output_dir, settings, plan, _known_tokenizer_fields(settings, output_dir, checked))
        return _write_report_locked(output_dir, settings, plan)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"=== precision: {resolve_mixed_precision(settings.mixed_precision, device_type=device).reason}", flush=True)
    with _lock(output_dir / ".study.lock", blocking=True):
        prepare_output_dir(output_dir, given, overwrite)
        check_run_folders(output_dir, settings, plan, _known_tokenizer_fields(settings, output_dir, checked))
        tokenizer_dir = ensure_tokenizer(settings, output_dir)
        ensure_pretraining_data(settings, output_dir, tokenizer_dir, num_processes)
        subsets = ensure_glue_subsets(settings, output_dir)
    if parallel_runs == "auto":
        left = sum(1 for v, s in plan if _read_json(run_dir(output_dir, v, s) / RECORD_FILE) is None)
        sized = resolve_parallel_runs(settings, num_processes, checked["tokenizer_fields"], runs=left)
        print(f"=== --parallel_runs auto: {sized.reason}", flush=True)
        parallel_runs = sized.processes
        os.environ["OMP_NUM_THREADS"] = str(sized.threads)  # the child study processes inherit it
        torch.set_num_threads(sized.threads)
    helpers = [_start_study_process(child_argv) for _ in range(parallel_runs - 1)] if parallel_runs > 1 else []
    try:
        failed = _run_plan(settings, output_dir, plan, tokenizer_dir, subsets, launcher, num_processes)
    except BaseException:
        for helper in helpers:
            if helper.poll() is None:
                helper.terminate()  # SIGTERM: a helper in pretraining stops after its current step
        for helper in helpers:
            helper.wait()
        raise
    codes = [helper.wait() for helper in helpers]
    records = _write_report_locked(output_dir, settings, plan)
    if any(code in _STOPPED_BY_SIGNAL for code in codes):
        raise StudyInterrupted(
            f"a study process was stopped by a signal (exit statuses {codes}); "
            "run the same command again to continue the study"
        )
    failed += [f"study process {i + 2} exited with status {code}" for i, code in enumerate(codes) if code != 0]
    if failed:
        raise RuntimeError(f"{len(failed)} run(s) failed: " + " | ".join(failed))
    return records


def _known_tokenizer_fields(settings: StudySettings, output_dir: Path, checked: dict[str, Any]) -> dict[str, Any]:
    """The tokenizer fields the runs' configs get: the given or already trained tokenizer's, else planned ones.

    Planned fields are marked `planned` (the study's tokenizer is trained later; its size may come out smaller).
    """
    if settings.tokenizer_name is not None:
        return checked["tokenizer_fields"]
    trained = output_dir / "tokenizer"
    if (trained / "tokenizer_config.json").is_file():
        return _tokenizer_fields(AutoTokenizer.from_pretrained(trained))
    return {**checked["tokenizer_fields"], "planned": True}


def resolve_parallel_runs(
    settings: StudySettings, num_processes: int, tokenizer_fields: dict[str, Any], runs: int | None = None
) -> ParallelPlan:
    """`--parallel_runs auto` on this machine: `hfzoo.study.parallel.plan_parallel_runs` for the study's largest model.

    The per-run peak memory is estimated (`estimate_run_bytes`: the largest variant's parameters, the
    per-device batch, the input and target lengths), not measured; the free memory is the GPU's
    (`torch.cuda.mem_get_info`) when CUDA is available, else the available RAM; the cores are this process's.

    Args:
        settings: the study settings (paths resolved).
        num_processes: processes per run (`--num_processes`; the per-device batch is divided by it).
        tokenizer_fields: `vocab_size` and special token ids (`check_settings`' planned ones).
        runs: runs left to do (caps the processes), or None.

    Returns:
        The plan.
    """
    targets = target_length(settings)  # None: one stack, whose every token is predicted (or may be)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    precision = resolve_mixed_precision(settings.mixed_precision, device_type=device).mixed_precision
    half_precision = precision in ("bf16", "fp16")  # activations kept in 16 bits
    per_run = 0
    for variant in settings.variants or [BASELINE]:
        config = build_variant_config(settings, variant, tokenizer_fields)
        per_run = max(per_run, estimate_run_bytes(
            count_parameters(config),
            batch_size=sequences_per_device(settings, num_processes),
            input_length=settings.block_size,
            target_length=settings.block_size if targets is None else targets,
            hidden_size=config.hidden_size,
            num_heads=config.num_attention_heads,
            encoder_layers=0 if targets is None else config.num_hidden_layers,
            decoder_layers=config.num_hidden_layers if targets is None else config.num_decoder_layers,
            vocab_size=config.vocab_size,
            half_precision=half_precision,
            device=device,
        ))  # fmt: skip
    free = torch.cuda.mem_get_info()[0] if device == "cuda" else available_ram_bytes()
    return plan_parallel_runs(device=device, per_run_bytes=per_run, free_memory_bytes=free, cpu_cores=cpu_cores(),
                              runs=runs)  # fmt: skip


def _start_study_process(argv: list[str]) -> subprocess.Popen:
    """Start `python -m hfzoo.study argv` (stopped by SIGTERM if this process dies)."""
    return subprocess.Popen(
        [sys.executable, "-m", "hfzoo.study.runner", *argv],
        preexec_fn=_pdeathsig if sys.platform.startswith("linux") else None,
    )


def _run_plan(
    settings: StudySettings,
    output_dir: Path,
    plan: list[tuple[str, int]],
    tokenizer_dir: str,
    subsets: dict[str, Path | None],
    launcher: str | None,
    num_processes: int,
) -> list[str]:
    """Run every run of `plan` that is neither finished nor held by another study process.

    Returns:
        One line per failed run (its traceback is in the run's `error.txt`).

    Raises:
        StudyInterrupted: a stage was stopped by SIGTERM/SIGINT (after the report was rewritten).
    """
    failed = []
    for index, (variant, seed) in enumerate(plan):
        folder = run_dir(output_dir, variant, seed)
        if _read_json(folder / RECORD_FILE) is not None:
            continue
        with _lock(folder / ".lock", blocking=False) as acquired:
            if not acquired or _read_json(folder / RECORD_FILE) is not None:
                continue  # another study process has it, or finished it meanwhile
            print(
                f"=== run {index + 1}/{len(plan)}: {variant}, seed {seed} ({folder}, study process {os.getpid()})",
                flush=True,
            )
            start = time.perf_counter()
            try:
                record = execute_run(settings, variant, seed, folder, tokenizer_dir, subsets, launcher, num_processes)
            except StudyInterrupted as err:
                _write_report_locked(output_dir, settings, plan)
                raise StudyInterrupted(
                    f"{err} during {variant}, seed {seed}; the study stopped there. "
                    "Run the same command again to continue it"
                ) from None
            except Exception as err:  # noqa: BLE001 - a failed run is reported, the others still run
                failed.append(f"{variant}, seed {seed}: {err}")
                (folder / "error.txt").write_text(traceback.format_exc())
                print(
                    f"=== run failed: {variant}, seed {seed}: {err} (traceback in {folder / 'error.txt'})", flush=True
                )
                continue
            record["timing"]["run_seconds"] = time.perf_counter() - start
            record["timing"].update(time_breakdown(record["timing"]))
            _write_json(folder / RECORD_FILE, record)
            (folder / "error.txt").unlink(missing_ok=True)
        _write_report_locked(output_dir, settings, plan)
    return failed


def _write_report_locked(output_dir: Path, settings: StudySettings, plan: list[tuple[str, int]]) -> list[dict]:
    """Rewrite the report from the finished runs while holding the study lock.

    Several study processes on one folder finish runs at about the same time; the lock keeps them from
    writing the same report files (and their temporary files) at once.
    """
    from .report import write_report

    with _lock(output_dir / ".study.lock", blocking=True):
        return write_report(output_dir, settings, _records(output_dir, plan))


def _records(output_dir: Path, plan: list[tuple[str, int]]) -> list[dict]:
    records = []
    for variant, seed in plan:
        record = _read_json(run_dir(output_dir, variant, seed) / RECORD_FILE)
        if record is not None:
            records.append(record)
    return records


def main(argv: list[str] | None = None) -> list[dict]:
    """Entry point of `hfzoo-study` and `recipes/study.py`.

    Args:
        argv: arguments without the program name (default: `sys.argv[1:]`).

    Returns:
        The finished runs' records.

    Raises:
        SystemExit: bad input (a one-line `error: ...`, before anything is trained) or failed runs; a
            study stopped by SIGTERM/SIGINT during a pretraining stage exits with `faults.EXIT_PREEMPTED`
            (75) after writing the report of the finished runs.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    overrides = {key: getattr(args, key) for key in _FIELDS}
    try:
        if args.num_processes < 1:
            raise ValueError(f"--num_processes must be positive, got {args.num_processes}")
        settings = load_settings(args.study, overrides)
        with removed_if_refused(args.output_dir):  # a refused study leaves no empty output folder behind
            return run_study(
                settings,
                args.output_dir,
                overwrite=args.overwrite_output_dir,
                launcher=args.launcher,
                num_processes=args.num_processes,
                report_only=args.report_only,
                parallel_runs=1 if args.report_only else args.parallel_runs,
                child_argv=[*argv, "--parallel_runs", "1"],
            )
    except StudyInterrupted as err:
        sys.stderr.write(f"{err}\n")
        raise SystemExit(EXIT_PREEMPTED) from None
    except (ValueError, FileNotFoundError, RuntimeError) as err:
        raise SystemExit(f"error: {err}") from None


def cli() -> None:
    """Console script `hfzoo-study` (returns None: setuptools exits with what its function returns)."""
    main()


if __name__ == "__main__":
    main()
