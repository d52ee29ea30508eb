"""`hfzoo.study.processes`: how a stage's end (in this process or a child) stops or fails the study."""

from __future__ import annotations

import sys

import pytest

from hfzoo.study.processes import StudyInterrupted, run_stage
from hfzoo.training.faults import EXIT_PREEMPTED

STAGE = """import sys


def main(argv):
    code = int(argv[0])
    if code:
        raise SystemExit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
"""


@pytest.fixture
def stage_module(tmp_path, monkeypatch) -> str:
    """A recipe-like module whose `main([code])` exits with `code` (0: returns), importable here and in children."""
    (tmp_path / "study_stage_stub.py").write_text(STAGE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return "study_stage_stub"


@pytest.mark.parametrize("launcher", [None, sys.executable], ids=["in-process", "child"])
def test_a_stage_stopped_by_a_signal_interrupts_the_study_and_a_failure_is_an_error(stage_module, launcher):
    run_stage(stage_module, ["0"], launcher)  # a stage that finishes
    with pytest.raises(StudyInterrupted):
        run_stage(stage_module, [str(EXIT_PREEMPTED)], launcher)
    with pytest.raises(RuntimeError, match="stopped: 3" if launcher is None else "exited with status 3"):
        run_stage(stage_module, ["3"], launcher)
