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
