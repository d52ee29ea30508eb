"""The study's child processes: recipe stages (`run_stage`) and helper study processes, and how signals stop them.

A child ends with its parent (Linux's `PR_SET_PDEATHSIG`); a stage stopped by SIGTERM/SIGINT stops the whole
study (`StudyInterrupted`), which the same command continues.
"""

from __future__ import annotations

import contextlib
import ctypes
import shlex
import signal
import subprocess
import sys

from ..training.arguments import secret_free_command
from ..training.faults import EXIT_PREEMPTED


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
    print(f"=== {module} {shlex.join(secret_free_command(argv))}", flush=True)
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
        raise StudyInterrupted(
            f"{shlex.join(secret_free_command(command))} was stopped by a signal (status {completed.returncode})"
        )
    if completed.returncode != 0:
        raise RuntimeError(f"{shlex.join(secret_free_command(command))} exited with status {completed.returncode}")


def _start_study_process(argv: list[str]) -> subprocess.Popen:
    """Start `python -m hfzoo.study argv` (stopped by SIGTERM if this process dies)."""
    return subprocess.Popen(
        [sys.executable, "-m", "hfzoo.study.runner", *argv],
        preexec_fn=_pdeathsig if sys.platform.startswith("linux") else None,
    )
