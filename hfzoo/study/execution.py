"""One run of the study (`execute_run`): pretrain a row, finetune it on every GLUE task, return its record.

Finished stages are reused; the "No pretraining" row finetunes the vanilla model from its random
initialisation instead.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

from ..data.glue import get_glue_task
from ..models.flops import count_training_flops
from ..models.modern import row_pretrain_args
from .arguments import glue_argv, pretrain_argv
from .configs import (
    _row_changes,
    count_parameters,
    pretraining_model_class,
    target_length,
)
from .processes import run_stage
from .protocol import BASELINE, EARLY_FRACTION, NO_PRETRAINING
from .runs import start_run
from .settings import StudySettings
from .storage import _read_json


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
    tokenizer, config = start_run(settings, variant, seed, folder, tokenizer_dir)
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

    tokenizer, config = start_run(settings, NO_PRETRAINING, seed, folder, tokenizer_dir, row=BASELINE)
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
