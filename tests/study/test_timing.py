"""`hfzoo.study.timing`: where each run's and the study's wall time went."""

from __future__ import annotations

import json

import pytest
from helpers.study import PLANNED, parse_markdown_table, read_results

from hfzoo.study.protocol import NO_PRETRAINING
from hfzoo.study.runs import run_dir


def test_time_accounting_of_runs_and_study(uninterrupted):
    """Each run's wall time splits into parts that sum to it; training time is the loop's summed step times."""
    results = read_results(uninterrupted)
    parts = ("train_steps", "pretrain_evaluation", "pretrain_other", "finetuning", "other")
    for record in results["runs"]:
        timing = record["timing"]
        assert set(timing["seconds"]) == set(parts)
        assert sum(timing["seconds"].values()) == pytest.approx(timing["run_seconds"], rel=1e-9)
        assert all(0.0 <= f <= 1.0 for f in timing["fractions"].values()), timing["fractions"]
        assert sum(timing["fractions"].values()) == pytest.approx(1.0)
        assert timing["seconds"]["finetuning"] > 0
        if record["variant"] == NO_PRETRAINING:
            assert timing["seconds"]["train_steps"] == 0 and "train_tflops" not in timing
            continue
        history = json.loads(
            (run_dir(uninterrupted, record["variant"], record["seed"]) / "pretrain" / "train_history.json").read_text()
        )
        measured = sum(r["step_seconds"] for r in history["log_history"])
        assert timing["seconds"]["train_steps"] > 0
        assert timing["seconds"]["train_steps"] == pytest.approx(measured, rel=0.02, abs=0.05)
        assert timing["seconds"]["pretrain_evaluation"] > 0
        assert timing["train_tflops"] == pytest.approx(record["total_flops"] / timing["train_step_seconds"] / 1e12)
    study = results["timing"]["study"]
    assert study["run_seconds"] == pytest.approx(sum(r["timing"]["run_seconds"] for r in results["runs"]))
    for part in parts:
        assert study["seconds"][part] == pytest.approx(sum(r["timing"]["seconds"][part] for r in results["runs"]))
    assert sum(study["fractions"].values()) == pytest.approx(1.0)
    pretrained = [r for r in results["runs"] if r["variant"] != NO_PRETRAINING]
    assert study["train_tflops"] == pytest.approx(
        sum(r["total_flops"] for r in pretrained) / sum(r["timing"]["train_step_seconds"] for r in pretrained) / 1e12
    )
    report = (uninterrupted / "results.md").read_text()
    section = report[report.index("## Where the time went") :]
    rows = parse_markdown_table(section)
    assert [r["Run"] for r in rows] == [v for v, _ in PLANNED] + ["All runs"]
    assert rows[-1]["training steps"] == f"{100 * study['fractions']['train_steps']:.1f}%"
