"""The study folder's shared files: their names, atomic JSON writes, tolerant reads, and `flock` locks.

Several study processes work on one folder at once (`--parallel_runs`, one per GPU): every file they share is
written atomically (a temporary file renamed into place) and read as absent when torn, and the locks here
decide which process takes a run and who writes the report.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..outputs import write_json_atomic

STUDY_FILE = "study.json"


RECORD_FILE = "result.json"


#: What a run folder trains (row, family, seed, resolved config), written before its first stage: a folder is
#: reused only for the same key (`check_run_folders`).
RUN_KEY_FILE = "run.json"


#: Wall times of the study's one-time preparation (tokenizer, tokenized data), beside `study.json`.
PREPARATION_FILE = "preparation.json"


def _write_json(path: Path, value: Any) -> None:
    """Write JSON atomically (`hfzoo.outputs.write_json_atomic`), numpy scalars as floats."""
    write_json_atomic(path, value, default=float)


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
