"""The checks of a study's settings before anything is trained (`check_settings`).

Everything that can be refused is refused here, with one line naming the key and the value: the rows, seeds
and steps, the files, every row's config and every run's recipe arguments.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer

from ..choices import choice_hint
from ..data.glue import get_glue_task
from ..data.loading import check_distinct_files
from ..finetuning import parse_glue_args, resolve_max_length
from ..models.modern import STUDY_ROWS
from ..models.narang import load_paper_table
from ..pretraining import check_block_size, parse_pretrain_args
from ..tokenization import check_vocab_size
from ..training.accelerator import check_device_arguments
from ..training.arguments import MAX_SEED, check_scheduler_arguments
from .arguments import glue_argv, glue_batch_size, pretrain_argv, sequences_per_device, study_set_flags
from .configs import (
    _tokenizer_fields,
    build_variant_config,
    ladder_size_settings,
    planned_tokenizer_fields,
    pretraining_model_class,
)
from .ladder import budget_settings, parse_ladder
from .protocol import EARLY_FRACTION, FAMILIES
from .runs import _slug
from .settings import StudySettings, _glue_files


def check_settings(settings: StudySettings, num_processes: int = 1) -> dict[str, Any]:
    """Refuse bad settings before anything is trained; return what the runs need.

    Checks: at least one variant and seed, known and distinct variant names, distinct seeds in [0, 2**32 - 1],
    at least `EARLY_FRACTION` steps, the data (each file once, none both trained on and held out), tokenizer,
    GLUE and paper files, every variant's config (built with
    the planned vocabulary) with `block_size` and `glue_max_length` within its position table, every variant's
    model built (on the meta device) with an `attn_implementation` other than eager or sdpa, the recipes' own
    argument checks on every run's arguments, the batch arithmetic, and no `pretrain_args` / `glue_args` flag
    that the study sets itself (`study_set_flags`: a seed or output folder there would give every run the same).

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
    out_of_range = [s for s in settings.seeds if not 0 <= s <= MAX_SEED]
    if out_of_range:
        raise ValueError(f"seeds: {out_of_range} outside [0, {MAX_SEED}] (the seeds NumPy's generator accepts)")
    slugs = [_slug(v) for v in settings.variants]
    if len(set(slugs)) != len(slugs):
        raise ValueError(f"variants: {settings.variants} contain two names with the same folder name")
    if settings.max_train_steps < EARLY_FRACTION:
        raise ValueError(
            f"max_train_steps={settings.max_train_steps}: needs at least {EARLY_FRACTION} steps "
            f"(the early loss is measured at 1/{EARLY_FRACTION} of training)"
        )
    for key in (
        "block_size",
        "gradient_accumulation_steps",
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
    check_distinct_files(settings.train_file, settings.validation_file, ("train_file", "validation_file"))
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
        try:
            check_vocab_size(settings.tokenizer_vocab_size, settings.family)
        except ValueError as err:
            raise ValueError(f"tokenizer_vocab_size: {err}") from None
        fields = planned_tokenizer_fields(settings.family, settings.tokenizer_vocab_size)
    for variant in settings.variants:  # the lengths each run's recipes refuse only once the tokenizer is built
        config = build_variant_config(settings, variant, fields)
        try:
            check_block_size(settings.block_size, config)
        except ValueError as err:
            raise ValueError(f"variant {variant!r}: the pretraining arguments are refused: {err}") from None
        try:
            if settings.glue_tasks:
                resolve_max_length(config, settings.glue_max_length)
        except ValueError as err:
            raise ValueError(f"variant {variant!r}: the GLUE arguments are refused: {err}") from None
    ladder = _check_ladder(settings, fields)
    # the settings each pretraining stage runs with: a ladder's budgets each have their steps and schedule
    stages = [budget_settings(settings, budget, {}) for budget in ladder.budgets] if ladder else [settings]
    scratch = Path("/nonexistent-study-check")
    tokenizer_path = settings.tokenizer_name or str(scratch)
    for variant in settings.variants:  # every row's arguments (a row may change them: the Muon rows)
        for stage in stages:
            argv = pretrain_argv(stage, tokenizer_path, scratch / "config.json", 0, scratch, num_processes, variant)
            try:
                _check_recipe_arguments("pretraining", parse_pretrain_args, argv)
            except ValueError as err:
                raise ValueError(f"variant {variant!r}: {err}") from None
    pretrain = pretrain_argv(stages[-1], tokenizer_path, scratch / "config.json", 0, scratch, num_processes)
    for task in settings.glue_tasks:
        argv = glue_argv(settings, task, scratch, None, 0, scratch, num_processes)
        _check_recipe_arguments("GLUE", parse_glue_args, argv)
    for variant in settings.variants:  # after the recipes' device checks (a FlashAttention kernel on the CPU)
        _check_attention_kernel(settings.attn_implementation, variant, build_variant_config(settings, variant, fields))
    _check_study_set_flags(settings, num_processes)
    if settings.tokenizer_name is not None:
        from ..training.objectives import get_objective

        objective = get_objective(FAMILIES[settings.family].objective)
        try:
            objective.build_collator(parse_pretrain_args(pretrain), tokenizer, settings.block_size)
        except ValueError as err:
            raise ValueError(f"tokenizer_name {settings.tokenizer_name}: {err}") from None
    return {"tokenizer_fields": fields}


def _check_ladder(settings: StudySettings, fields: dict[str, Any]):
    """Refuse a bad ladder before any training: its keys and every row's config at every size.

    Each budget's recipe arguments, its schedule among them, are checked with the other runs' (`check_settings`).

    Returns:
        The parsed `Ladder`, or None for a study without one.
    """
    ladder = parse_ladder(settings)
    if ladder is None:
        return None
    for hidden_size in ladder.hidden_sizes:
        sized = ladder_size_settings(settings, hidden_size)
        for variant in settings.variants:
            try:
                build_variant_config(sized, variant, fields)
            except ValueError as err:
                raise ValueError(f"ladder.hidden_sizes: {hidden_size}: {err}") from None
    return ladder


def _check_study_set_flags(settings: StudySettings, num_processes: int) -> None:
    """Refuse `pretrain_args` / `glue_args` that change a flag the study sets for its runs (`study_set_flags`).

    Each recipe's arguments are parsed with and without them for two runs with different per-run values (seed,
    folders, task), so a flag given by an abbreviation argparse accepts, or a value equal to one run's, is caught.
    Called after the recipes' own checks passed on the same arguments.

    Raises:
        ValueError: naming the settings key, the flag and the study key to change instead.
    """
    bare = dataclasses.replace(settings, pretrain_args={}, glue_args={})
    tasks = settings.glue_tasks
    for key, remedies in study_set_flags(settings).items():
        if key == "glue_args" and not tasks:  # no finetuning: glue_args are not used
            continue
        for seed in (0, 1):
            folder = Path("/nonexistent-study-check") / f"run-{seed}"
            if key == "pretrain_args":
                parse = parse_pretrain_args
                run = (str(folder / "tok"), folder / "config.json", seed, folder, num_processes)
                expected, given = (pretrain_argv(s, *run) for s in (bare, settings))
            else:
                parse = parse_glue_args
                run = (tasks[seed % len(tasks)], folder / "model", folder / "subset.tsv", seed, folder, num_processes)
                expected, given = (glue_argv(s, *run) for s in (bare, settings))
            expected, given = parse(expected), parse(given)
            changed = [flag for flag in remedies if getattr(given, flag) != getattr(expected, flag)]
            if changed:
                flag = changed[0]
                raise ValueError(
                    f"{key}: sets --{flag} {getattr(given, flag)}, which the study sets for its runs (it would "
                    f"override the study's value and what its report assumes); {remedies[flag]}"
                )


def _check_attention_kernel(attn_implementation: str | None, variant: str, config) -> None:
    """Build the row's pretraining model on the meta device with `attn_implementation`; raise ValueError if refused.

    transformers refuses a kernel when its package is missing (`flash_attention_2` without `flash-attn`), when a
    hub kernel cannot be fetched, or when the model does not support it (the encoder-decoder's relative position
    bias and FlashAttention); the recipes find out only once their data is ready. eager and sdpa (every hfzoo model
    supports both) are not built.
    """
    if attn_implementation in (None, "eager", "sdpa"):
        return
    try:
        with torch.device("meta"):
            pretraining_model_class(config).from_config(config, attn_implementation=attn_implementation)
    except (ImportError, ValueError) as err:
        raise ValueError(
            f"attn_implementation {attn_implementation}: variant {variant!r}: {' '.join(str(err).split())}"
        ) from None


def _check_recipe_arguments(recipe: str, parse, argv: list[str]) -> None:
    """Run a recipe's own argument checks on `argv`, then its device's and its schedule's; raise ValueError.

    The device's checks (`hfzoo.training.accelerator.check_device_arguments`) and the schedule's
    (`hfzoo.training.arguments.check_scheduler_arguments`) are the ones a run applies only after the study's
    tokenizer and data are built. argparse's message is kept.
    """
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            args = parse(argv)
            check_device_arguments(args)
            check_scheduler_arguments(args)
    except (SystemExit, ValueError) as err:
        reason = captured.getvalue().strip().splitlines()[-1] if captured.getvalue().strip() else str(err)
        raise ValueError(f"the {recipe} arguments are refused: {reason}") from None


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
