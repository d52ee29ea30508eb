"""Finetune one checkpoint on several GLUE tasks with one method and write a results table.

    python recipes/glue_sweep.py --model_name_or_path CKPT --data_dir ../shared/data/glue \
        --tasks stsb mrpc sst2 --peft lora --output_dir runs/minilm-lora -- --learning_rate 1e-3

(or `python -m hfzoo.finetuning.sweep ...`). Each task runs the GLUE recipe (`hfzoo.finetuning.glue`)
in this process with the task's defaults from `TASK_DEFAULTS` (3 epochs, as transformers'
`run_glue_no_trainer.py`; SST-2 on a seeded 20,000-sentence training subset for 1 epoch), then the
arguments after `--` (which override them).
Every task's arguments and data files are checked before the first task trains, so a bad flag or a
missing file does not stop the sweep after hours of finished tasks; the flags the sweep sets itself
(`SWEEP_OWNED`) are refused after `--`, as is a duplicate task. With `-- --push_to_hub` each task uploads to its
own repository, `<name>-<task>`, where `<name>` is `--hub_model_id` after `--` (`me/minilm-lora` ->
`me/minilm-lora-rte`, ...), else the sweep's `--output_dir` folder's name (`task_hub_model_id`).
After every task, `<output_dir>/results.json`, `results.md` (task, metric, value, epoch, trainable
parameters, steps, wall time) and the bar chart `results.png` are rewritten, so an interrupted sweep
keeps what it finished: run again with the same arguments, it keeps the tasks `results.json` records as finished
with them (`finished_tasks`) and runs the others (an interrupted task with checkpoints continues with
`-- --resume_from_checkpoint latest`); `-- --overwrite_output_dir` runs every task again. A run that names other
`--tasks` adds their rows to the tables, which keep those of the tasks it does not name (if they ran with the
arguments this run would give them: one table holds one configuration).
Under `accelerate launch` (DDP, DeepSpeed) every process runs each task; the main process prints the task lines
and writes the tables.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Any

from ..data.glue import GLUE_TASKS, get_glue_task, glue_files
from ..hub import public_arguments
from ..outputs import write_json_atomic, write_text_atomic
from ..training import faults
from ..training.arguments import OneLineErrorParser, check_hub_repository, secret_free_command
from ..training.checkpointing import earlier_run_checkpoints
from ..training.plots import plot_results_bars
from .glue import main as finetune
from .glue import parse_glue_args

#: Per-task arguments of the sweep (before the user's, which override them).
TASK_DEFAULTS: dict[str, list[str]] = {
    "cola": ["--num_train_epochs", "3"],
    "sst2": ["--num_train_epochs", "1", "--max_train_samples", "20000"],
    "mrpc": ["--num_train_epochs", "3"],
    "stsb": ["--num_train_epochs", "3"],
    "qqp": ["--num_train_epochs", "1"],
    "mnli": ["--num_train_epochs", "1"],
    "qnli": ["--num_train_epochs", "1"],
    "rte": ["--num_train_epochs", "3"],
    "wnli": ["--num_train_epochs", "3"],
}


#: GLUE recipe arguments the sweep sets for every task, and why each is refused after `--` (where it would
#: override the sweep for every task: every task's folder and row would hold one run).
SWEEP_OWNED = {
    "task_name": "each task's comes from --tasks",
    "model_name_or_path": "give the sweep's --model_name_or_path",
    "peft": "give the sweep's --peft",
    "output_dir": "each task writes to <the sweep's --output_dir>/<task>",
    "data_dir": "give the sweep's --data_dir",
    "train_file": "one file cannot serve several tasks: give the sweep's --data_dir (a folder in the GLUE layout)",
    "validation_file": "one file cannot serve several tasks: give the sweep's --data_dir (a folder in the GLUE layout)",
}


def task_arguments(task: str, args: argparse.Namespace) -> list[str]:
    """The GLUE recipe's arguments for one task of the sweep, before the user's (`TASK_DEFAULTS` included)."""
    command = ["--task_name", task, "--model_name_or_path", args.model_name_or_path, "--peft", args.peft]
    command += ["--output_dir", str(Path(args.output_dir) / task), *TASK_DEFAULTS[task]]
    if args.data_dir:
        command += ["--data_dir", args.data_dir]
    return command


def task_hub_model_id(task: str, args: argparse.Namespace, extra: list[str]) -> str | None:
    """The hub repository one task of the sweep uploads to with `-- --push_to_hub`; None without it.

    `<name>-<task>`, where `<name>` is the `--hub_model_id` given after `--` (a namespace included:
    `me/minilm-lora` -> `me/minilm-lora-rte`), else the sweep's `--output_dir` folder's name (`runs/minilm-lora`
    -> `minilm-lora-rte`), so that every task, and every sweep into another folder, has its own repository.

    Args:
        task: the task's name as `GLUE_TASKS` spells it.
        args: the sweep's own arguments.
        extra: the arguments after `--`.

    Raises:
        SystemExit: the GLUE recipe's argparse error for a bad argument in `extra`.
        ValueError: a repository name the hub would refuse (`huggingface_hub`'s `validate_repo_id`), naming where
            `<name>` came from.
    """
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    given = parse_glue_args(task_arguments(task, args) + extra)
    if not given.push_to_hub:
        return None
    name = f"{given.hub_model_id or Path(args.output_dir).resolve().name}-{task}"
    try:
        validate_repo_id(name)
    except HFValidationError as err:
        source = f"--hub_model_id {given.hub_model_id}" if given.hub_model_id else "the sweep's --output_dir folder"
        raise ValueError(
            f"--push_to_hub: task {task}'s repository would be {name!r} (after {source}), which is not a hub "
            f"repository id ({str(err).splitlines()[0]}); give another --hub_model_id after `--`"
        ) from None
    return name


def task_argv(task: str, args: argparse.Namespace, extra: list[str]) -> list[str]:
    """One task's whole GLUE recipe command line: `task_arguments`, the arguments after `--`, and its repository."""
    hub_model_id = task_hub_model_id(task, args, extra)
    return task_arguments(task, args) + extra + ([] if hub_model_id is None else ["--hub_model_id", hub_model_id])


#: GLUE recipe arguments that may differ between the run that finished a task and a rerun of the sweep that keeps
#: its results: they say how a run starts or how long it waits for its processes, not what it trains.
RERUN_FREE = ("resume_from_checkpoint", "overwrite_output_dir", "ddp_timeout")


def comparable_arguments(given: argparse.Namespace) -> dict[str, Any]:
    """A task's GLUE arguments as `results.json` records them: JSON values, secrets and `RERUN_FREE` left out."""
    public = {name: value for name, value in public_arguments(given).items() if name not in RERUN_FREE}
    return json.loads(json.dumps(public, default=str))


def recorded_tasks(output_dir: Path) -> dict[str, dict]:
    """The per-task results an earlier run of this sweep recorded in `<output_dir>/results.json`, by task name.

    Tables of an older hfzoo (no `arguments` in a task's record) give nothing.

    Raises:
        ValueError: a `results.json` that is not a sweep's table (one line naming it).
    """
    table = output_dir / "results.json"
    if not table.is_file():
        return {}
    try:
        return {r["task"]: r for r in json.loads(table.read_text())["tasks"] if "arguments" in r}
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(
            f"{table}: not a results table of the GLUE sweep ({type(err).__name__}: {err}); remove it to run every "
            "task again, or give another --output_dir"
        ) from None


def finished_tasks(
    output_dir: Path, recorded: dict[str, dict], commands: dict[str, argparse.Namespace], named: bool = True
) -> dict[str, dict]:
    """The tasks an earlier run of this sweep finished with the same arguments: their results, to keep.

    A task counts as finished when the sweep's `results.json` holds its results with the arguments it ran with
    (`arguments`: `comparable_arguments`; an argument only one side has is not compared) and its folder still
    holds its `all_results.json`.

    Args:
        output_dir: the sweep's `--output_dir`.
        recorded: what its `results.json` records (`recorded_tasks`).
        commands: each task's GLUE arguments in this run (`parse_glue_args`), by task name.
        named: the tasks are this run's `--tasks` (False: tasks recorded by an earlier run that this one does not
            name, whose rows the tables keep; only the message differs).

    Returns:
        `{task: its recorded results}`.

    Raises:
        ValueError: a task recorded with other arguments (one line naming the first argument that differs, with both
            values): one table would mix two configurations.
    """
    kept = {}
    for task, given in commands.items():
        if task not in recorded or not (output_dir / task / "all_results.json").is_file():
            continue
        here, there = comparable_arguments(given), recorded[task]["arguments"]
        # an argument only one side has (one hfzoo release added or removed it) is no difference the run made
        differ = sorted(name for name in here.keys() & there.keys() if here[name] != there[name])
        if differ:
            name = differ[0]
            remedy = (
                "give -- --overwrite_output_dir to run every task again"
                if named
                else f"its row stays in the tables only with the same arguments; give -- --overwrite_output_dir to "
                f"start the tables over with --tasks ({task}'s folder is left as it is)"
            )
            raise ValueError(
                f"task {task}{'' if named else ' (not in --tasks)'} was finished by an earlier run of this sweep with "
                f"other arguments (--{name} {there.get(name)} there, {here.get(name)} here); {remedy}, or another "
                "--output_dir"
            )
        kept[task] = recorded[task]
    return kept


def _refuse_earlier_checkpoints(task: str, given: argparse.Namespace) -> None:
    if earlier := earlier_run_checkpoints(given):
        raise ValueError(
            f"task {task}: {given.output_dir} holds the checkpoints of an interrupted or earlier run ({earlier}); give "
            "-- --resume_from_checkpoint latest to continue it (the tasks this sweep finished are kept), -- "
            "--overwrite_output_dir to run every task again, or another --output_dir"
        )


def check_sweep(
    tasks: list[str], args: argparse.Namespace, extra: list[str]
) -> tuple[dict[str, dict], dict[str, dict]]:
    """Check every task's arguments and data files before the first task runs; find the tasks to keep.

    Each task's arguments are parsed as the GLUE recipe parses them (`parse_glue_args`). The tasks an earlier run
    of this sweep finished with the same arguments are kept (`finished_tasks`; none with `-- --overwrite_output_dir`),
    and so are the rows of the tasks an earlier run finished that `--tasks` does not name (refused if they ran with
    other arguments than this run would give them: one table holds one configuration).
    For each other task the files of `--data_dir` are checked to exist (`glue_files`; without `--data_dir` the
    hub's copy is loaded per task), and its output folder may not hold an earlier run's checkpoints unless
    `-- --resume_from_checkpoint latest` continues them or `-- --overwrite_output_dir` deletes them (as the GLUE
    recipe's `refuse_earlier_checkpoints`, in the sweep's words); with `-- --push_to_hub` the main process creates
    its hub repository (`check_hub_repository`).

    Args:
        tasks: task names as `GLUE_TASKS` spells them.
        args: the sweep's own arguments.
        extra: the arguments after `--`.

    Raises:
        SystemExit: an argparse error of the GLUE recipe (its one-line message); a `SWEEP_OWNED` argument after
            `--` (`error: ...` naming it and why); a bad value, a task repository name the hub would refuse
            (`task_hub_model_id`), a task finished with other arguments, a missing data file or a task folder with
            an earlier run's checkpoints, a task repository the hub does not create (`error: ...`).

    Returns:
        `(kept, carried)`: the recorded results, by task name, of the tasks of `tasks` an earlier run finished with
        these arguments, and of the other tasks it finished whose rows the tables keep.
    """
    try:
        commands = {}
        for task in tasks:
            expected = parse_glue_args(task_arguments(task, args))
            commands[task] = given = parse_glue_args(task_argv(task, args, extra))  # its repository name checked too
            for name, reason in SWEEP_OWNED.items():
                if getattr(given, name) != getattr(expected, name):
                    raise ValueError(f"--{name} {getattr(given, name)} after `--`: {reason}")
        overwrite = any(given.overwrite_output_dir for given in commands.values())
        output_dir = Path(args.output_dir)
        recorded = {} if overwrite else recorded_tasks(output_dir)
        kept = finished_tasks(output_dir, recorded, commands)
        others = [task for task in recorded if task not in commands and task in TASK_DEFAULTS]  # in the table's order
        others = {task: parse_glue_args(task_argv(task, args, extra)) for task in others}
        carried = finished_tasks(output_dir, recorded, others, named=False)  # the rows of tasks not in --tasks
        for task, given in commands.items():
            if task not in kept:
                glue_files(task, args.data_dir)
                _refuse_earlier_checkpoints(task, given)  # a later task's folder must not stop the sweep after hours
                if faults.launched_rank() == 0:  # the main process asks the hub (another's failure stops the launch)
                    check_hub_repository(given)  # with --push_to_hub: the task's repository, before any task
    except (ValueError, FileNotFoundError) as err:
        raise SystemExit(f"error: {err}") from None
    return kept, carried


#: Columns of every row besides task, metric and value (from the task's `all_results.json`).
ROW_FIELDS = ("peft", "epoch", "best_epoch", "trainable_parameters", "trainable_fraction", "train_steps",
              "train_examples", "train_seconds")  # fmt: skip


def results_rows(results: list[dict]) -> list[dict]:
    """Flatten per-task results into one row per (task, dev split, metric): the saved epoch's `eval_<metric>`.

    MNLI's mismatched dev set (`eval_<metric>_mm`) is the task `mnli (mismatched)`.
    """
    rows = []
    for r in results:
        metrics = get_glue_task(r["task"]).metrics
        for suffix, task in (("", r["task"]), ("_mm", f"{r['task']} (mismatched)")):
            for metric in metrics:
                if f"eval_{metric}{suffix}" in r:
                    value = r[f"eval_{metric}{suffix}"]
                    rows.append({"task": task, "metric": metric, "value": value, **{k: r[k] for k in ROW_FIELDS}})
    return rows


def write_tables(output_dir: Path, results: list[dict]) -> None:
    """Write `results.json` (per-task results and flattened rows), `results.md` and the bar chart `results.png`."""
    rows = results_rows(results)
    write_json_atomic(output_dir / "results.json", {"tasks": results, "rows": rows})
    lines = [
        "| task | metric | value | method | epoch (best) | trainable params | trainable % | steps | train examples "
        "| wall time (s) |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['task']} | {row['metric']} | {row['value']:.4f} | {row['peft']} | {row['epoch']} | "
            f"{row['trainable_parameters']:,} | {100 * row['trainable_fraction']:.2f} | {row['train_steps']} | "
            f"{row['train_examples']:,} | {row['train_seconds']:.0f} |"
        )
    write_text_atomic(output_dir / "results.md", "\n".join(lines) + "\n")
    title = f"{results[0]['model_name_or_path']} ({results[0]['peft']})" if results else None
    plot_results_bars({f"{r['task']} {r['metric']}": r["value"] for r in rows}, output_dir / "results.png", title)


def main(argv: list[str] | None = None) -> list[dict]:
    """Entry point of `recipes/glue_sweep.py`: run the sweep, rewriting the tables after every task.

    Args:
        argv: the sweep's arguments, then optionally `--` and arguments for every task's run
            (default: `sys.argv[1:]`).

    Returns:
        The per-task results (as `hfzoo.finetuning.glue.run_glue` returns them).

    Raises:
        SystemExit: an unknown or repeated task, bad arguments, a sweep-owned argument after `--` or a missing
            data file (all before any training: `check_sweep`), or a task's bad input found while it runs.
    """
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = OneLineErrorParser(prog="glue_sweep.py", description=__doc__.splitlines()[0])
    parser.add_argument("--model_name_or_path", required=True)
    parser.add_argument("--tasks", nargs="+", required=True, help=f"from {sorted(GLUE_TASKS)}")
    parser.add_argument("--peft", choices=("lora", "prefix", "none"), required=True)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--data_dir", default=None)
    args = parser.parse_args(argv)
    try:
        tasks = [get_glue_task(t).name for t in args.tasks]
    except ValueError as err:
        parser.error(f"--tasks: {err}")
    if len(set(tasks)) < len(tasks):
        parser.error(f"--tasks names a task twice: {args.tasks}")
    kept, carried = check_sweep(tasks, args, extra)  # every task's flags and files, before any training
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    main_process = faults.launched_rank() == 0  # under a launcher, every process runs each task; one reports
    results = []
    for task in tasks:
        if task in kept:
            if main_process:
                print(f"=== {task}: kept, finished by an earlier run of this sweep with these arguments", flush=True)
            results.append(kept[task])
            continue
        command = task_argv(task, args, extra)
        if main_process:
            print(f"=== {task}: finetune_glue.py {shlex.join(secret_free_command(command))}", flush=True)
        results.append({**finetune(command), "arguments": comparable_arguments(parse_glue_args(command))})
        if main_process:  # the task's processes have all finished it (its outputs are saved by all)
            write_tables(output_dir, [*carried.values(), *results])
    if (kept or carried) and main_process:
        write_tables(output_dir, [*carried.values(), *results])  # the kept tasks in --tasks' order, after the others
    return results


def cli() -> None:
    """`recipes/glue_sweep.py`: `main`, then the process ends with its exit status.

    A process of a multi-process run ends without the interpreter's teardown (`hfzoo.training.faults.run_launched`).
    """
    faults.run_launched(main)


if __name__ == "__main__":
    cli()
