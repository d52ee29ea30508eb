"""The study file: its keys (`StudySettings`), how they are read and typed (`load_settings`), and its paths.

Every key of a study file is required and is also a `hfzoo-study` flag of the same name, which overrides the
file. Paths are kept as given (`PATH_KEYS`) and made absolute for the runs by `resolve_paths`.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import yaml

from ..data.glue import get_glue_task
from ..models.presets import PRESETS, parse_overrides
from ..yaml_input import load_yaml, yaml_problem


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
        pretrain_args: further `hfzoo-pretrain` arguments for every run (mapping; true = a bare flag); a flag
            the study sets itself (`hfzoo.study.arguments.study_set_flags`: seed, output folder, the flags of
            the keys above) is refused by `check_settings`.
        glue_data_dir: a folder in the GLUE layout (null: the hub's `nyu-mll/glue`).
        glue_tasks: GLUE tasks to finetune on.
        glue_max_train_samples: training examples per task: a fixed random subset, the same for every run.
        glue_subset_seed: seed choosing those subsets.
        glue_num_train_epochs: finetuning epochs (the last epoch's model is evaluated).
        glue_learning_rate: finetuning learning rate.
        glue_train_batch_size: finetuning examples per step over all processes.
        glue_max_length: tokens per example after truncation.
        glue_args: further `hfzoo-finetune-glue` arguments for every task (mapping; a flag the study sets
            itself is refused, as in `pretrain_args`).
        paper_table: the paper's Table 1 as TSV (`load_paper_table`), or null for no comparison.
        ladder: null (every row at the base's size and `max_train_steps`), or a scale ladder (`hfzoo.study.ladder`):
            `{hidden_sizes: [...], token_budgets: [...], cooldown_fraction: 0.2}` trains every row at every
            hidden size (`configs.ladder_size_overrides`) and seed, each run giving every token budget through a
            warmup-stable-decay schedule with cooldowns branched from its stable phase.
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
    ladder: dict | None


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
    return {key: yaml.safe_load(value) for key, value in parse_overrides(text, argument=None).items()}


def load_settings(path: str | os.PathLike, overrides: dict[str, Any] | None = None) -> StudySettings:
    """Read a study file, apply command-line values and check types; paths stay as given (see `resolve_paths`).

    Args:
        path: the YAML study file; every `StudySettings` field must be a key.
        overrides: `{key: value}` from the command line (strings, lists of strings), or None.

    Returns:
        The settings.

    Raises:
        FileNotFoundError: no such study file.
        ValueError: not valid YAML (one line: the problem and its line and column), not a mapping, a missing or
            unknown key, or a value of the wrong type.
    """
    path = Path(path)
    if path.is_dir():
        raise FileNotFoundError(f"--study {path}: is a directory, not a study file (.yaml)")
    if not path.is_file():
        raise FileNotFoundError(f"--study {path}: no such file")
    values = load_yaml(path.read_text(encoding="utf-8"), f"--study {path}")
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
        except yaml.YAMLError as err:
            raise ValueError(f"--{key}: not valid YAML ({yaml_problem(err)}): {value!r}") from None
        except ValueError as err:
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


def _glue_files(settings: StudySettings, task: str) -> list[Path]:
    spec = get_glue_task(task)
    folder = Path(settings.glue_data_dir) / spec.folder
    return [folder / spec.train_file, *(folder / name for name in spec.validation_files.values())]
