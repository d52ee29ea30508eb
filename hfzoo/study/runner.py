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
import os
import shlex
import sys
import time
import traceback
from pathlib import Path

import torch

from ..outputs import check_output_folder, removed_if_refused
from ..training.arguments import OneLineErrorParser, positive_int
from ..training.faults import EXIT_PREEMPTED
from ..training.launch_config import check_launch_config, launcher_config_file
from ..training.precision import resolve_mixed_precision
from .arguments import pretrain_argv  # noqa: F401 - imported from here by benchmarks/study_step_cost.py
from .checks import _known_tokenizer_fields, check_settings
from .configs import (  # noqa: F401 - imported from here by benchmarks/study_step_cost.py
    _tokenizer_fields,
    build_variant_config,
    pretraining_model_class,
    target_length,
)
from .execution import execute_run
from .fingerprints import prepare_output_dir
from .ladder import execute_ladder_run, ladder_plan
from .parallel import resolve_parallel_runs
from .preparation import ensure_glue_subsets, ensure_pretraining_data, ensure_tokenizer
from .processes import _STOPPED_BY_SIGNAL, StudyInterrupted, _start_study_process
from .protocol import EARLY_FRACTION, study_plan
from .runs import _records, check_run_folders, plan_dir
from .settings import _FIELDS, StudySettings, _field_kind, load_settings, resolve_paths
from .storage import RECORD_FILE, STUDY_FILE, _lock, _read_json, _write_json
from .timing import time_breakdown

__all__ = ["EARLY_FRACTION", "StudySettings", "load_settings", "main", "run_study"]


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
    p.add_argument(
        "--bootstrap_replicates",
        type=positive_int,
        default=1000,
        help="a ladder's report: bootstrap replicates of every fit (default 1000; hfzoo.study.ladder_report)",
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
    bootstrap_replicates: int = 1000,
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
        bootstrap_replicates: a ladder's report: bootstrap replicates of every fit.

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
    plan = ladder_plan(settings) if settings.ladder is not None else study_plan(settings)
    if report_only:
        if _read_json(output_dir / STUDY_FILE) is None:
            raise ValueError(f"--output_dir {output_dir}: no study to report on ({STUDY_FILE} missing)")
        prepare_output_dir(output_dir, given, overwrite=False)
        check_run_folders(output_dir, settings, plan, _known_tokenizer_fields(settings, output_dir, checked))
        return _write_report_locked(output_dir, settings, plan, bootstrap_replicates)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"=== precision: {resolve_mixed_precision(settings.mixed_precision, device_type=device).reason}", flush=True)
    with _lock(output_dir / ".study.lock", blocking=True):
        prepare_output_dir(output_dir, given, overwrite)
        check_run_folders(output_dir, settings, plan, _known_tokenizer_fields(settings, output_dir, checked))
        tokenizer_dir = ensure_tokenizer(settings, output_dir)
        ensure_pretraining_data(settings, output_dir, tokenizer_dir, num_processes)
        subsets = ensure_glue_subsets(settings, output_dir)
    if parallel_runs == "auto":
        left = sum(1 for entry in plan if _read_json(plan_dir(output_dir, entry) / RECORD_FILE) is None)
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
    records = _write_report_locked(output_dir, settings, plan, bootstrap_replicates)
    if any(code in _STOPPED_BY_SIGNAL for code in codes):
        raise StudyInterrupted(
            f"a study process was stopped by a signal (exit statuses {codes}); "
            "run the same command again to continue the study"
        )
    failed += [f"study process {i + 2} exited with status {code}" for i, code in enumerate(codes) if code != 0]
    if failed:
        raise RuntimeError(f"{len(failed)} run(s) failed: " + " | ".join(failed))
    return records


def _run_plan(
    settings: StudySettings,
    output_dir: Path,
    plan: list[tuple],
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
    for index, entry in enumerate(plan):
        variant, seed = entry[:2]
        folder = plan_dir(output_dir, entry)
        name = f"{variant}, seed {seed}" + (f", hidden size {entry[2]}" if len(entry) == 3 else "")
        if _read_json(folder / RECORD_FILE) is not None:
            continue
        with _lock(folder / ".lock", blocking=False) as acquired:
            if not acquired or _read_json(folder / RECORD_FILE) is not None:
                continue  # another study process has it, or finished it meanwhile
            print(
                f"=== run {index + 1}/{len(plan)}: {name} ({folder}, study process {os.getpid()})",
                flush=True,
            )
            start = time.perf_counter()
            try:
                if len(entry) == 3:
                    record = execute_ladder_run(settings, variant, seed, entry[2], folder, tokenizer_dir, launcher,
                                                num_processes)  # fmt: skip
                else:
                    record = execute_run(settings, variant, seed, folder, tokenizer_dir, subsets, launcher,
                                         num_processes)  # fmt: skip
            except StudyInterrupted as err:
                _write_progress_report(output_dir, settings, plan)
                raise StudyInterrupted(
                    f"{err} during {name}; the study stopped there. Run the same command again to continue it"
                ) from None
            except Exception as err:  # noqa: BLE001 - a failed run is reported, the others still run
                failed.append(f"{name}: {err}")
                (folder / "error.txt").write_text(traceback.format_exc())
                print(f"=== run failed: {name}: {err} (traceback in {folder / 'error.txt'})", flush=True)
                continue
            record["timing"]["run_seconds"] = time.perf_counter() - start
            record["timing"].update(time_breakdown(record["timing"]))
            _write_json(folder / RECORD_FILE, record)
            (folder / "error.txt").unlink(missing_ok=True)
        _write_progress_report(output_dir, settings, plan)
    return failed


def _write_progress_report(output_dir: Path, settings: StudySettings, plan: list[tuple]) -> None:
    """Rewrite the report after a run: a study's every time, a ladder's only at the end of the command.

    A ladder's fits and bootstrap take minutes; `--report_only` writes the report of a half-done ladder.
    """
    if settings.ladder is None:
        _write_report_locked(output_dir, settings, plan)


def _write_report_locked(
    output_dir: Path, settings: StudySettings, plan: list[tuple], bootstrap_replicates: int = 1000
) -> list[dict]:
    """Rewrite the report from the finished runs while holding the study lock.

    Several study processes on one folder finish runs at about the same time; the lock keeps them from
    writing the same report files (and their temporary files) at once.
    """
    with _lock(output_dir / ".study.lock", blocking=True):
        records = _records(output_dir, plan)
        if settings.ladder is not None:
            from .ladder_report import write_ladder_report

            write_ladder_report(output_dir, settings, records, bootstrap_replicates=bootstrap_replicates)
            return records
        from .report import write_report

        return write_report(output_dir, settings, records)


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
                bootstrap_replicates=args.bootstrap_replicates,
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
