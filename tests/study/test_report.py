"""`hfzoo.study.report`: `results.json`, `results.md` and the plots of a finished study, with and without GLUE tasks."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers.study import VARIANTS, parse_markdown_table, read_results, tiny_study
from PIL import Image

from hfzoo.study.runner import main
from hfzoo.study.runs import run_dir
from hfzoo.training.precision import resolve_mixed_precision


def test_outputs_of_a_study(uninterrupted):
    results = read_results(uninterrupted)
    assert results["unfinished"] == [] and len(results["runs"]) == 6
    for record in results["runs"][:4]:
        folder = run_dir(uninterrupted, record["variant"], record["seed"])
        for name in (
            "config.json",
            "result.json",
            "pretrain/model.safetensors",
            "pretrain/train_history.json",
            "glue/sst2/all_results.json",
            "glue/rte/all_results.json",
        ):
            assert (folder / name).is_file(), name
        assert record["early_step"] == 2 and [s for s, _ in record["eval_losses"]] == list(range(0, 17, 2))
        assert (
            record["eval_losses"][1][1] == record["early_loss"] and record["eval_losses"][-1][1] == record["final_loss"]
        )
        assert record["final_loss"] < record["init_loss"]
        assert record["total_flops"] == record["flops_per_step"] * 16 > record["flops_per_token"] > 0
        assert record["glue_average"] == pytest.approx(
            (record["glue"]["sst2"]["score"] + record["glue"]["rte"]["score"]) / 2
        )
        assert record["glue"]["sst2"]["train_examples"] == 12  # the fixed subset of the 20 rows
        assert record["timing"]["steps_per_second"] > 0
    # Every run finetunes on the same subset, a seeded sample of the training file with its header.
    subset = (uninterrupted / "glue_train_subsets" / "sst2.tsv").read_text().splitlines()
    assert subset[0] == "sentence\tlabel" and len(subset) == 13
    # The variants differ only in the Table 1 row: SwiGLU's d_ff is 2/3 of the base's 64, rounded to 8s.
    swiglu = next(r for r in results["runs"] if r["variant"] == "SwiGLU")
    assert swiglu["config_changes"] == {"gated_mlp": True, "hidden_act": "silu", "intermediate_size": 40}
    # Pretraining saw the same data for both variants of a seed, evaluated on identically corrupted blocks.
    vanilla = next(r for r in results["runs"] if r["variant"] == VARIANTS[0] and r["seed"] == 0)
    assert vanilla["train_tokens"] == swiglu["train_tokens"]

    table = parse_markdown_table((uninterrupted / "results.md").read_text())
    assert [r["Model"] for r in table] == ["Vanilla Transformer", "", "SwiGLU", ""]
    assert [r[""] for r in table] == ["hfzoo", "paper", "hfzoo", "paper"]
    summary = results["summary"]["SwiGLU"]
    assert table[2]["Final loss"] == f"{summary['final_loss']:.3f} ± {summary['final_loss_std']:.3f}"
    assert table[3]["Final loss"] == "1.789" and table[3]["GLUE avg / SGLUE"] == "74.21"
    assert table[3]["Better than vanilla (>2σ)"] == "early, final"  # 2.127 < 2.182 - 2 x 0.005
    assert {"SST-2", "RTE", "Params", "Ops", "Step/s", "Early loss"} <= set(table[0])
    assert "Seed-to-seed spread" in (uninterrupted / "results.md").read_text()
    # The precision every run trained in (the study file's `auto`, resolved on this CPU) and the CPU's class.
    choice = resolve_mixed_precision(results["settings"]["mixed_precision"], device_type="cpu")
    assert results["precision"]["mixed_precision"] == [choice.mixed_precision]
    assert results["precision"]["host_capability"] == [choice.record()["host_capability"]]
    assert all(r["mixed_precision"] == choice.mixed_precision for r in results["runs"])  # the no-pretraining rows too
    assert f"on {choice.record()['host_capability']}." in (uninterrupted / "results.md").read_text()

    for name in ("loss_curves.png", "final_loss_vs_paper.png", "quality_vs_cost.png"):
        with Image.open(uninterrupted / name) as image:
            image.verify()
            assert image.format == "PNG"
        with Image.open(uninterrupted / name) as image:
            assert image.size[0] > 300 and any(k.startswith("hfzoo:") for k in image.text)
    with Image.open(uninterrupted / "loss_curves.png") as image:
        curves = json.loads(image.text["hfzoo:curves"])
    assert set(curves) == set(VARIANTS) and len(curves["SwiGLU"]) == 9


def test_a_study_without_glue_tasks_pretrains_only(inputs, tmp_path):
    """`glue_tasks: []`: no finetuning and no "No pretraining" runs; the report has no downstream column or row."""
    study = tiny_study(inputs, tmp_path / "study.yaml", variants=VARIANTS, seeds=[0, 1], glue_tasks=[])
    out = tmp_path / "out"
    records = main(["--study", str(study), "--output_dir", str(out)])
    assert [(r["variant"], r["seed"]) for r in records] == [(v, s) for v in VARIANTS for s in (0, 1)]
    assert all(r["glue"] == {} and r["final_loss"] < r["init_loss"] for r in records)
    assert not any((run_dir(out, v, s) / "glue").exists() for v in VARIANTS for s in (0, 1))
    results = read_results(out)
    assert results["downstream"] is None and set(results["agreement"]) == {"Early loss", "Final loss"}
    report = (out / "results.md").read_text()
    assert "no finetuning (the study lists no GLUE tasks)." in report and "## Downstream" not in report
    table = parse_markdown_table(report)
    assert list(table[0]) == ["Model", "", "Params", "Ops", "Step/s", "Early loss", "Final loss",
                              "Better than vanilla (>2σ)"]  # fmt: skip
    vanilla = [r["final_loss"] for r in records[:2]]
    assert table[0]["Final loss"] == f"{np.mean(vanilla):.3f} ± {np.std(vanilla, ddof=1):.3f}"
