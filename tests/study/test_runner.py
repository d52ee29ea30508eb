"""`hfzoo-study` (Narang et al.'s modification study at small scale): kill and restart, outputs, bad input, statistics.

A tiny study (2 variants x 2 seeds, 16 pretraining steps of a 2 + 2 layer model on 4 Gutenberg books, two
tiny GLUE tasks) runs uninterrupted in this process; the same study killed (SIGKILL, or stopped by
SIGTERM) in the middle of its second run's pretraining and started again must finish with the same
`results.json` (wall-clock figures aside). The report is rewritten under the study lock; finished stages are reused; the launcher's config is checked first.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.study import REPO_ROOT, VARIANTS, expect_refusal, read_results, tiny_study, without_timing

from hfzoo.study.runner import main
from hfzoo.study.runs import run_dir


@pytest.mark.slow
@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGTERM"])
def test_killed_study_restarts_and_finishes_with_the_same_results(signal_name, inputs, uninterrupted, tmp_path):
    study = tiny_study(inputs, tmp_path / "study.yaml")
    argv = ["--study", str(study), "--output_dir", str(tmp_path / "out")]
    # The signal at the 24th optimizer step of the study: step 8 of 16 of the second run's pretraining.
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tests" / "helpers" / "kill_study_during_run.py"), signal_name, "24", *argv],
        capture_output=True,
        text=True,
        timeout=600,
    )
    first, second = run_dir(tmp_path / "out", VARIANTS[0], 0), run_dir(tmp_path / "out", VARIANTS[0], 1)
    if signal_name == "SIGKILL":
        assert proc.returncode == -9, proc.stderr[-3000:]
        assert not (second / "pretrain" / "all_results.json").exists()
    else:  # the recipe finishes the step, writes a checkpoint and stops; the study stops with it
        assert proc.returncode == 75, proc.stderr[-3000:]
        assert "Vanilla Transformer, seed 1; the study stopped there" in proc.stderr
        assert "Run the same command again" in proc.stderr
        assert not (second / "error.txt").exists()
    assert (first / "result.json").is_file() and not (second / "result.json").exists()
    assert (second / "config.json").is_file()
    assert not run_dir(tmp_path / "out", VARIANTS[1], 0).exists()  # no later run was started
    assert [r["seed"] for r in read_results(tmp_path / "out")["runs"]] == [0]  # the report of the finished run

    main(argv)  # the same command again: finishes the study, the killed run from its start
    assert without_timing(read_results(tmp_path / "out")) == without_timing(read_results(uninterrupted))


def test_the_report_is_written_under_the_study_lock(inputs, uninterrupted, tmp_path, monkeypatch):
    """Study processes sharing a folder never write the report files at the same time."""

    from hfzoo.study import report as study_report

    out = tmp_path / "out"
    shutil.copytree(uninterrupted, out)
    study = tiny_study(inputs, tmp_path / "study.yaml")
    original, lock_held = study_report.write_report, []

    def write_report_checking_the_lock(output_dir, settings, records):
        with open(Path(output_dir) / ".study.lock", "a+") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock_held.append(True)
            else:
                fcntl.flock(handle, fcntl.LOCK_UN)
                lock_held.append(False)
        return original(output_dir, settings, records)

    monkeypatch.setattr(study_report, "write_report", write_report_checking_the_lock)
    main(["--study", str(study), "--output_dir", str(out)])  # every run finished: only the report is rewritten
    main(["--study", str(study), "--output_dir", str(out), "--report_only"])
    assert lock_held == [True, True]
    assert without_timing(read_results(out)) == without_timing(read_results(uninterrupted))


@pytest.mark.slow
def test_finished_stages_are_reused_and_locked_runs_left_to_their_process(inputs, uninterrupted, tmp_path):
    """A run whose record is gone redoes only its unfinished stages; a run locked by another process is skipped."""

    out = tmp_path / "out"
    shutil.copytree(uninterrupted, out)
    reference = without_timing(read_results(uninterrupted))
    study = tiny_study(inputs, out.parent / "study.yaml")
    redo, locked = run_dir(out, "SwiGLU", 0), run_dir(out, "SwiGLU", 1)
    model_time = (redo / "pretrain" / "model.safetensors").stat().st_mtime_ns
    for folder in (redo, locked):
        (folder / "result.json").unlink()
    shutil.rmtree(redo / "glue" / "rte")
    with open(locked / ".lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # as a second study process working on that run would
        main(["--study", str(study), "--output_dir", str(out)])
    assert (redo / "glue" / "rte" / "all_results.json").is_file()
    assert (redo / "pretrain" / "model.safetensors").stat().st_mtime_ns == model_time  # pretraining not repeated
    assert read_results(out)["unfinished"] == ["SwiGLU (seed 1)"] and not (locked / "result.json").exists()
    assert "## Unfinished runs" in (out / "results.md").read_text()
    main(["--study", str(study), "--output_dir", str(out)])  # lock released: the run is finished (stages reused)
    assert without_timing(read_results(out)) == reference


def test_the_launchers_config_is_checked_before_anything_is_trained(inputs, tmp_path, capsys):
    config = yaml.safe_load((REPO_ROOT / "accelerate_configs" / "fsdp2.yaml").read_text())
    config["deepspeed_config"] = {"zero_stage": 2}
    (tmp_path / "launch.yaml").write_text(yaml.safe_dump(config))
    study = tiny_study(inputs, tmp_path / "study.yaml", tokenizer_name=None)
    launcher = f"accelerate launch --config_file {tmp_path / 'launch.yaml'}"
    message = expect_refusal(["--study", str(study), "--output_dir", str(tmp_path / "out"), "--launcher", launcher,
                              "--num_processes", "2"], capsys)  # fmt: skip
    assert message == (f"error: {tmp_path / 'launch.yaml'}: deepspeed_config: settings of DEEPSPEED, but "
                       "distributed_type is FSDP (accelerate would ignore them); remove the section or set "
                       "distributed_type: DEEPSPEED")  # fmt: skip
    assert not (tmp_path / "out").exists()
