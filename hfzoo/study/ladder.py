"""The study's scale ladder: every row at several model sizes and token budgets (`ladder` in the study file).

    ladder:
      hidden_sizes: [64, 96, 128]             # d_model of each size (configs.ladder_size_settings: width rule)
      token_budgets: [204800, 409600, 819200]  # training tokens (multiples of train_batch_tokens)
      cooldown_fraction: 0.2                   # each budget's last 20% of steps decay the learning rate

One run per (row, size, seed) trains the largest budget with a warmup-stable-decay schedule (transformers'
`warmup_stable_decay`: linear warmup, constant learning rate, then a decay over the budget's last
`cooldown_fraction` of steps). Every smaller budget branches from that run's stable phase: the run saves a
checkpoint where the budget's cooldown starts, and the budget's own stage resumes from it with its shorter
schedule (Hägele et al. 2024, "Scaling Laws and Compute-Optimal Training Beyond Fixed Training Durations",
arXiv 2405.18392, §3: "cooldowns" branched from one constant-learning-rate run match separate cosine runs). Up to
the branch point the schedule of a budget's separate run is the longest run's (the same warmup, the same constant
rate), and the resumed stage reads the same batches as that separate run would, so a branched budget is that
separate run, computed once for all budgets (tested: `tests/study/test_ladder.py`). The budgets cost the longest
run plus each smaller budget's cooldown, instead of the sum of all budgets.

A run's folder (`runs/<row>/h<hidden_size>/seed_<seed>`) holds `pretrain/` (the longest budget, with the
branch checkpoints until every budget is done) and `budget_<steps>/` per smaller budget; finished stages are
reused, a killed longest run resumes from its newest checkpoint, and its record (`result.json`) has every
budget's held-out loss and training FLOPs.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import time
from pathlib import Path
from typing import Any

import torch

from ..models.flops import count_training_flops
from ..models.modern import row_pretrain_args
from .arguments import pretrain_argv
from .configs import (
    _row_changes,
    count_parameters,
    ladder_size_settings,
    pretraining_model_class,
    target_length,
)
from .processes import run_stage
from .runs import start_run
from .settings import StudySettings
from .storage import _read_json

#: The keys of a study file's `ladder` mapping.
LADDER_KEYS = ("hidden_sizes", "token_budgets", "cooldown_fraction")
#: The learning-rate schedule a ladder needs: one whose stable phase the budgets branch from.
LADDER_SCHEDULE = "warmup_stable_decay"
#: Schedule arguments the ladder sets per budget (a study file must not give them).
_SET_PER_BUDGET = ("num_decay_steps", "num_stable_steps")
#: Most checkpoints a longest run may keep for its branches (`ladder_checkpoint_interval`).
MAX_BRANCH_CHECKPOINTS = 64


@dataclasses.dataclass(frozen=True)
class LadderBudget:
    """One token budget of a ladder.

    Attributes:
        train_steps: optimizer steps (tokens / `train_batch_tokens`).
        train_tokens: training tokens.
        cooldown_steps: the steps of its learning-rate decay: max(1, round(cooldown_fraction x train_steps)).
        branch_step: where its cooldown starts (train_steps - cooldown_steps): the longest run's checkpoint it
            resumes from (the longest budget itself: where its own decay starts).
    """

    train_steps: int
    train_tokens: int
    cooldown_steps: int
    branch_step: int


@dataclasses.dataclass(frozen=True)
class Ladder:
    """A checked `ladder` mapping: sizes and budgets in increasing order.

    Attributes:
        hidden_sizes: d_model of each size.
        budgets: one `LadderBudget` per token budget, the longest last.
        cooldown_fraction: each budget's share of decay steps.
    """

    hidden_sizes: tuple[int, ...]
    budgets: tuple[LadderBudget, ...]
    cooldown_fraction: float


def parse_ladder(settings: StudySettings) -> Ladder | None:
    """The study's ladder, checked against its other settings, or None for a study without one.

    Raises:
        ValueError: one line naming the key and value: an unknown or missing key; sizes or budgets that are not
            distinct positive integers; a budget that is not a multiple of `train_batch_tokens`; a cooldown
            fraction outside (0, 1); `max_train_steps` other than the longest budget's steps; a schedule other
            than `warmup_stable_decay` or schedule arguments the ladder sets itself; warmup that reaches a
            cooldown; GLUE tasks (a ladder measures the pretraining loss only); branch points needing more than
            `MAX_BRANCH_CHECKPOINTS` checkpoints.
    """
    values = settings.ladder
    if values is None:
        return None
    unknown = sorted(set(values) - set(LADDER_KEYS))
    missing = [k for k in LADDER_KEYS if k not in values]
    if unknown or missing:
        raise ValueError(f"ladder: expected the keys {list(LADDER_KEYS)}; unknown {unknown}, missing {missing}")
    for key in ("hidden_sizes", "token_budgets"):
        given = values[key]
        if (not isinstance(given, list) or not given
                or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in given)):  # fmt: skip
            raise ValueError(f"ladder.{key}={given!r}: expected a list of positive integers")
        if len(set(given)) != len(given):
            raise ValueError(f"ladder.{key}={given!r} lists a value twice")
    fraction = values["cooldown_fraction"]
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise ValueError(f"ladder.cooldown_fraction={fraction!r}: expected a number between 0 and 1 (e.g. 0.2)")
    budgets = []
    for tokens in sorted(values["token_budgets"]):
        if tokens % settings.train_batch_tokens:
            raise ValueError(
                f"ladder.token_budgets: {tokens} is not a multiple of train_batch_tokens={settings.train_batch_tokens}"
            )
        steps = tokens // settings.train_batch_tokens
        cooldown = max(1, round(fraction * steps))
        budgets.append(LadderBudget(steps, tokens, cooldown, steps - cooldown))
    longest = budgets[-1]
    if settings.max_train_steps != longest.train_steps:
        raise ValueError(
            f"max_train_steps={settings.max_train_steps}: a ladder's longest run trains its largest budget, "
            f"{longest.train_tokens} tokens = {longest.train_steps} steps; set max_train_steps to {longest.train_steps}"
        )
    if settings.lr_scheduler_type != LADDER_SCHEDULE:
        raise ValueError(
            f"lr_scheduler_type={settings.lr_scheduler_type!r}: a ladder branches its budgets from a stable "
            f"learning rate; use {LADDER_SCHEDULE!r}"
        )
    given = sorted(set(settings.lr_scheduler_kwargs) & set(_SET_PER_BUDGET))
    if given:
        raise ValueError(
            f"lr_scheduler_kwargs: {given} are set per budget by the ladder (cooldown_fraction); remove them"
        )
    if settings.num_warmup_steps >= budgets[0].branch_step:
        raise ValueError(
            f"num_warmup_steps={settings.num_warmup_steps}: the smallest budget ({budgets[0].train_steps} steps) "
            f"starts its cooldown at step {budgets[0].branch_step}; warmup must end before"
        )
    if settings.glue_tasks:
        raise ValueError(
            f"glue_tasks={settings.glue_tasks}: a ladder measures the pretraining loss of every size and budget; "
            "set glue_tasks: []"
        )
    ladder = Ladder(tuple(sorted(values["hidden_sizes"])), tuple(budgets), float(fraction))
    interval = ladder_checkpoint_interval(ladder)
    if interval is not None and longest.train_steps // interval > MAX_BRANCH_CHECKPOINTS:
        raise ValueError(
            f"ladder.token_budgets: the cooldowns start at steps {[b.branch_step for b in budgets[:-1]]}, whose "
            f"greatest common divisor {interval} means {longest.train_steps // interval} checkpoints in every run; "
            "choose budgets whose cooldowns start at multiples of a larger number of steps"
        )
    return ladder


def ladder_checkpoint_interval(ladder: Ladder) -> int | None:
    """Steps between the longest run's checkpoints (None: one budget, no branches).

    The greatest common divisor of the smaller budgets' branch steps, so that a checkpoint exists at each.
    """
    steps = [b.branch_step for b in ladder.budgets[:-1]]
    return math.gcd(*steps) if steps else None


def ladder_plan(settings: StudySettings) -> list[tuple[str, int, int]]:
    """The ladder's runs, `(row, seed, hidden_size)`: largest size first, then row and seed in study order.

    The longest runs start first, so that parallel study processes end at about the same time.
    """
    ladder = parse_ladder(settings)
    return [
        (variant, seed, hidden)
        for hidden in reversed(ladder.hidden_sizes)
        for variant in settings.variants
        for seed in settings.seeds
    ]


def budget_settings(settings: StudySettings, budget: LadderBudget, extra: dict[str, Any]) -> StudySettings:
    """The settings of one budget's pretraining stage: its steps and decay, and `extra` recipe arguments.

    `extra` (checkpoints, resume) and evaluation at the end only go on top of the study's `pretrain_args`.
    """
    return dataclasses.replace(
        settings,
        max_train_steps=budget.train_steps,
        lr_scheduler_kwargs={**settings.lr_scheduler_kwargs, "num_decay_steps": budget.cooldown_steps},
        pretrain_args={**settings.pretrain_args, "eval_steps": budget.train_steps, **extra},
    )


def non_embedding_parameters(config) -> int:
    """Unique parameters of the pretraining model without its token embedding and output matrices.

    Kaplan et al. 2020's N (non-embedding parameters), counted on the meta device.
    """
    with torch.device("meta"):
        model = pretraining_model_class(config).from_config(config)
    embeddings = {id(m.weight) for m in (model.get_input_embeddings(), model.get_output_embeddings()) if m is not None}
    unique = {id(p): p for p in model.parameters()}
    return sum(p.numel() for key, p in unique.items() if key not in embeddings)


def _stage(argv_settings: StudySettings, variant: str, seed: int, tokenizer_dir: str, folder: Path, output: Path,
           launcher: str | None, num_processes: int) -> float:  # fmt: skip
    start = time.perf_counter()
    argv = pretrain_argv(argv_settings, tokenizer_dir, folder / "config.json", seed, output, num_processes, variant)
    run_stage("hfzoo.pretraining", argv, launcher)
    return time.perf_counter() - start


def _finished(output: Path, steps: int) -> dict[str, Any] | None:
    results = _read_json(output / "all_results.json")
    return results if results is not None and results.get("train_steps") == steps else None


def execute_ladder_run(
    settings: StudySettings,
    variant: str,
    seed: int,
    hidden_size: int,
    folder: Path,
    tokenizer_dir: str,
    launcher: str | None,
    num_processes: int,
) -> dict[str, Any]:
    """Pretrain one (row, size, seed) of the ladder for every token budget, reusing finished stages.

    The longest budget trains in `pretrain/`, saving a checkpoint every `ladder_checkpoint_interval` steps
    (resumed from the newest one if the run was killed); each smaller budget resumes from the checkpoint at its
    `branch_step` into `budget_<steps>/` with its own schedule. Once every budget is done the checkpoints are
    deleted.

    Returns:
        The record: `variant`, `seed`, `hidden_size`, `config_changes`, `pretrain_changes`, `parameters`,
        `non_embedding_parameters`, `flops_per_token` (training FLOPs per input token, `count_training_flops`:
        forward and backward, active experts only), `flops_per_step`, `budgets` (per budget, increasing:
        `train_steps`, `train_tokens`, `total_flops`, `final_loss`, `branched_from_step`: None for the
        longest), `train_steps`, `final_loss` (the longest budget's), `timing`, `mixed_precision`,
        `host_capability`.

    Raises:
        RuntimeError: a stage failed or wrote no results.
    """
    ladder = parse_ladder(settings)
    sized = ladder_size_settings(settings, hidden_size)
    tokenizer, config = start_run(sized, variant, seed, folder, tokenizer_dir)
    timing: dict[str, float] = {}
    longest, smaller = ladder.budgets[-1], ladder.budgets[:-1]
    main_dir = folder / "pretrain"
    checkpoints = main_dir / "checkpoints"
    pending = [b for b in smaller if _finished(folder / f"budget_{b.train_steps}", b.train_steps) is None]
    branch_points = [checkpoints / f"step_{b.branch_step}" for b in pending]
    interval = ladder_checkpoint_interval(ladder)
    results = _finished(main_dir, longest.train_steps)
    if results is not None and not all(p.is_dir() for p in branch_points):
        shutil.rmtree(main_dir)  # a budget still to branch lost its checkpoint: train the longest run again
        results = None
    if results is None:
        if not checkpoints.is_dir():
            shutil.rmtree(main_dir, ignore_errors=True)  # killed before its first checkpoint: start again
        extra: dict[str, Any] = {"resume_from_checkpoint": "latest"} if checkpoints.is_dir() else {}
        if interval is not None:
            extra |= {"checkpointing_steps": interval, "checkpoints_total_limit": longest.train_steps // interval + 1}
        timing["pretrain_seconds"] = _stage(budget_settings(sized, longest, extra), variant, seed, tokenizer_dir,
                                            folder, main_dir, launcher, num_processes)  # fmt: skip
        results = _finished(main_dir, longest.train_steps)
        if results is None:
            raise RuntimeError(f"pretraining wrote no all_results.json for {longest.train_steps} steps in {main_dir}")
        timing["train_step_seconds"] = results.get("train_step_seconds", math.nan)
        timing["pretrain_eval_seconds"] = results.get("eval_seconds", math.nan)
    for budget in pending:
        output = folder / f"budget_{budget.train_steps}"
        shutil.rmtree(output, ignore_errors=True)
        extra = {"resume_from_checkpoint": str(checkpoints / f"step_{budget.branch_step}")}
        seconds = _stage(budget_settings(sized, budget, extra), variant, seed, tokenizer_dir, folder, output,
                         launcher, num_processes)  # fmt: skip
        timing["pretrain_seconds"] = timing.get("pretrain_seconds", 0.0) + seconds
        branch = _finished(output, budget.train_steps)
        if branch is None:
            raise RuntimeError(f"pretraining wrote no all_results.json for {budget.train_steps} steps in {output}")
        for key, part in (("train_step_seconds", "train_step_seconds"), ("pretrain_eval_seconds", "eval_seconds")):
            timing[key] = timing.get(key, 0.0) + branch.get(part, math.nan)
    shutil.rmtree(checkpoints, ignore_errors=True)  # every budget is done: the branch points are not needed

    flops = count_training_flops(config, settings.block_size, target_length(settings))
    flops_per_step = flops.total * (settings.train_batch_tokens // settings.block_size)
    budgets = []
    for budget in ladder.budgets:
        output = main_dir if budget is longest else folder / f"budget_{budget.train_steps}"
        stage = _read_json(output / "all_results.json")
        budgets.append({
            "train_steps": budget.train_steps,
            "train_tokens": budget.train_tokens,
            "total_flops": flops_per_step * budget.train_steps,
            "final_loss": float(stage["eval_loss"]),
            "branched_from_step": None if budget is longest else budget.branch_step,
        })  # fmt: skip
    step_seconds = results.get("train_step_seconds")
    timing["steps_per_second"] = longest.train_steps / step_seconds if step_seconds else math.nan
    return {
        "variant": variant,
        "seed": seed,
        "hidden_size": hidden_size,
        "config_changes": _row_changes(sized, variant, tokenizer),
        "pretrain_changes": row_pretrain_args(variant),
        "parameters": count_parameters(config),
        "non_embedding_parameters": non_embedding_parameters(config),
        "flops_per_token": flops.per_token,
        "flops_per_step": flops_per_step,
        "budgets": budgets,
        "train_steps": longest.train_steps,
        "final_loss": budgets[-1]["final_loss"],
        "timing": timing,
        **{key: results.get(key) for key in ("mixed_precision", "host_capability")},
    }


__all__ = [
    "LADDER_KEYS",
    "Ladder",
    "LadderBudget",
    "budget_settings",
    "execute_ladder_run",
    "ladder_checkpoint_interval",
    "ladder_plan",
    "non_embedding_parameters",
    "parse_ladder",
]
