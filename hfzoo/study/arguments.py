"""The recipes' command lines of a run: the `hfzoo-pretrain` and `hfzoo-finetune-glue` arguments, and batch sizes.

A run's stages are the recipes' own commands (`pretrain_argv`, `glue_argv`), so a study run trains exactly as
the same command typed by hand would.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..models.modern import row_pretrain_args
from .protocol import EARLY_FRACTION, FAMILIES
from .settings import StudySettings


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


def _pretrain_flags(
    settings: StudySettings, tokenizer: str, config_path: Path, seed: int, output: Path, num_processes: int
) -> dict[str, Any]:
    """The `hfzoo-pretrain` flags the study sets for one run, before its `pretrain_args` and the row's."""
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
    return flags


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
    flags = _pretrain_flags(settings, tokenizer, config_path, seed, output, num_processes)
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


def _glue_flags(
    settings: StudySettings, task: str, model: Path, train_subset: Path | None, seed: int, output: Path,
    num_processes: int,
) -> dict[str, Any]:  # fmt: skip
    """The `hfzoo-finetune-glue` flags the study sets for one task of one run, before its `glue_args`."""
    return {
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


def glue_argv(
    settings: StudySettings, task: str, model: Path, train_subset: Path | None, seed: int, output: Path,
    num_processes: int = 1,
) -> list[str]:  # fmt: skip
    """The `hfzoo-finetune-glue` arguments of one task of one run (full finetuning, the last epoch evaluated)."""
    flags = _glue_flags(settings, task, model, train_subset, seed, output, num_processes)
    return _flag_list({**flags, **settings.glue_args})


# What to do instead of giving, in `pretrain_args` / `glue_args`, a recipe flag the study sets for its runs,
# where that is not "change the study key of the same name instead".
STUDY_FLAG_REMEDIES = {
    "pretrain_args": {
        "objective": "change the study key family instead",
        "config_name": "change the study keys config_name, config_overrides or variants instead",
        "per_device_train_batch_size": "change the study key train_batch_tokens instead",
        "eval_steps": f"change the study key max_train_steps instead (the study validates every 1/{EARLY_FRACTION} "
        "of training)",
        "logging_steps": f"change the study key max_train_steps instead (the study logs every 1/{4 * EARLY_FRACTION} "
        "of training)",
        "mlm_probability": "change the study key noise_density instead",
        "seed": "change the study key seeds instead (one run per seed)",
        "output_dir": "change hfzoo-study's --output_dir instead (each run has its folder there)",
    },
    "glue_args": {
        "task_name": "change the study key glue_tasks instead",
        "model_name_or_path": "each run finetunes its own pretrained model",
        "peft": "the study finetunes the whole model",
        "save_last_epoch": "the study evaluates the last epoch",
        "data_dir": "change the study key glue_data_dir instead",
        "train_file": "change the study keys glue_data_dir or glue_max_train_samples instead (one fixed subset for "
        "every run)",
        "max_train_samples": "change the study key glue_max_train_samples instead",
        "num_train_epochs": "change the study key glue_num_train_epochs instead",
        "learning_rate": "change the study key glue_learning_rate instead",
        "per_device_train_batch_size": "change the study key glue_train_batch_size instead",
        "max_length": "change the study key glue_max_length instead",
        "seed": "change the study key seeds instead (one run per seed)",
        "output_dir": "change hfzoo-study's --output_dir instead (each run has its folder there)",
    },
}


def study_set_flags(settings: StudySettings) -> dict[str, dict[str, str]]:
    """The recipe flags the study sets for its runs, by settings key, each with what to change instead.

    `{"pretrain_args": {flag: remedy, ...}, "glue_args": {...}}`: each flag of the family's pretraining command
    or of the GLUE command that the study sets itself (`pretrain_argv`, `glue_argv`), whether or not it has a
    value in this study, with the study key (or hfzoo-study flag) that sets it (`STUDY_FLAG_REMEDIES`).

    Raises:
        ValueError: the batch does not divide among one process's sequences (`sequences_per_device`).
    """
    scratch = Path("/study-set-flags")
    sets = {
        "pretrain_args": _pretrain_flags(settings, "", scratch, 0, scratch, 1),
        "glue_args": _glue_flags(settings, "", scratch, None, 0, scratch, 1),
    }
    return {
        key: {flag: STUDY_FLAG_REMEDIES[key].get(flag, f"change the study key {flag} instead") for flag in flags}
        for key, flags in sets.items()
    }
