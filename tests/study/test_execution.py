"""`hfzoo.study.execution`: one run's record: the "No pretraining" row, task scores, today's rows end to end."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from helpers.study import VARIANTS, parse_markdown_table, read_results, tiny_study
from scipy import stats

from hfzoo.study.protocol import NO_PRETRAINING
from hfzoo.study.runner import main
from hfzoo.study.runs import run_dir


def test_the_no_pretraining_row(uninterrupted):
    """The vanilla model finetuned from its seeded random initialisation: in the results and the downstream table,
    with every variant's gain over it, and outside the loss comparison with the paper."""
    import torch
    from accelerate.utils import set_seed
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    results = read_results(uninterrupted)
    rows = [r for r in results["runs"] if r["variant"] == NO_PRETRAINING]
    assert [r["seed"] for r in rows] == [0, 1]
    for record in rows:
        folder = run_dir(uninterrupted, NO_PRETRAINING, record["seed"])
        assert record["train_steps"] == 0 and record["total_flops"] == 0 and math.isnan(record["final_loss"])
        assert not (folder / "pretrain").exists() and set(record["glue"]) == {"sst2", "rte"}
        # never trained: its weights are those the seed initialises, not the vanilla run's pretrained ones
        config = AutoConfig.from_pretrained(folder / "init")
        set_seed(record["seed"])
        fresh = AutoModelForSeq2SeqLM.from_config(config, attn_implementation="eager").state_dict()
        saved = load_file(folder / "init" / "model.safetensors")
        assert saved and all(torch.equal(saved[k], fresh[k]) for k in saved)
        pretrained = load_file(run_dir(uninterrupted, VARIANTS[0], record["seed"]) / "pretrain" / "model.safetensors")
        assert any(not torch.equal(saved[k], pretrained[k]) for k in saved)
        argv = json.loads((folder / "glue" / "rte" / "all_results.json").read_text())
        assert argv["train_examples"] == 12
    assert NO_PRETRAINING not in results["summary"]
    downstream = results["downstream"]
    base = statistics_mean([r["glue_average"] for r in rows])
    assert downstream["no_pretraining"]["glue_average"] == pytest.approx(base)
    for variant in VARIANTS:
        gain = downstream["gains"][variant]["glue_average"]
        assert gain == pytest.approx(results["summary"][variant]["glue_average"] - base)
    report = (uninterrupted / "results.md").read_text()
    table = parse_markdown_table(report[report.index("## Downstream: gain over no pretraining") :])
    assert [r["Model"] for r in table] == [NO_PRETRAINING, *VARIANTS]
    assert table[2]["gain"] == f"{downstream['gains']['SwiGLU']['glue_average']:+.1f}"
    main_table = parse_markdown_table(report)
    assert NO_PRETRAINING not in [r["Model"] for r in main_table]


def statistics_mean(values: list[float]) -> float:
    return sum(values) / len(values)


def test_a_constant_prediction_scores_zero_correlation_not_nan():
    """STS-B's Pearson/Spearman of a constant prediction is NaN in scipy; the task score counts it as 0."""
    from hfzoo.metrics import load_glue_metric
    from hfzoo.study.execution import _glue_task_score

    metric = load_glue_metric("stsb")
    with np.errstate(all="ignore"), pytest.warns(stats.ConstantInputWarning):
        constant = metric.compute(predictions=[2.5] * 8, references=[0.0, 1, 2, 3, 4, 5, 1.5, 2.5])
    assert math.isnan(constant["pearson"])
    score, metrics = _glue_task_score("stsb", {f"eval_{k}": v for k, v in constant.items()})
    assert score == 0.0 and metrics == {"pearson": 0.0, "spearmanr": 0.0}
    varied = metric.compute(predictions=[0.1, 1, 2.2, 3, 3.9, 5, 1.4, 2.4], references=[0.0, 1, 2, 3, 4, 5, 1.5, 2.5])
    score, _ = _glue_task_score("stsb", {f"eval_{k}": v for k, v in varied.items()})
    assert score == pytest.approx(50 * (varied["pearson"] + varied["spearmanr"])) and score > 90


#: The tiny modern study: the baseline, one config row, the optimizer row, and every switch with Muon.
MODERN_VARIANTS = ["Vanilla Transformer", "QK-norm", "Muon", "All together"]


@pytest.mark.slow
def test_a_study_of_todays_modifications_runs_end_to_end(inputs, tmp_path, monkeypatch):
    """Config rows get their switches, the Muon rows train with Muon, and the report lists rows without paper figures."""
    import hfzoo.pretraining.loop as loop
    from hfzoo.models.modern import MODERN_ROWS
    from hfzoo.training.optimization import MuonWithAdamW

    built = []  # (the pretrained model's config, its optimizer), one per pretraining run, in study order

    def recording_create_optimizer(model, **kwargs):
        optimizer = loop_create_optimizer(model, **kwargs)
        built.append((model.config, optimizer))
        return optimizer

    loop_create_optimizer = loop.create_optimizer
    monkeypatch.setattr(loop, "create_optimizer", recording_create_optimizer)
    study = tiny_study(inputs, tmp_path / "study.yaml", variants=MODERN_VARIANTS, seeds=[0])
    records = main(["--study", str(study), "--output_dir", str(tmp_path / "out")])
    assert [r["variant"] for r in records] == [*MODERN_VARIANTS, NO_PRETRAINING]

    switches = {"qk_norm", "hidden_act", "attn_logit_softcapping", "final_logit_softcapping", "value_residual",
                "unet_skips"}  # fmt: skip
    assert set(MODERN_ROWS["All together"]) == switches
    assert len(built) == len(MODERN_VARIANTS)
    for record, (config, optimizer) in zip(records, built):
        row = MODERN_ROWS.get(record["variant"], {})
        assert record["config_changes"] == row
        saved = json.loads((run_dir(tmp_path / "out", record["variant"], 0) / "pretrain" / "config.json").read_text())
        for key in switches:  # the row's value where it sets one, the baseline's elsewhere
            expected = row.get(key, getattr(built[0][0], key))
            assert getattr(config, key) == expected and saved[key] == expected, (record["variant"], key)
        uses_muon = record["variant"] in ("Muon", "All together")
        assert record["pretrain_changes"] == ({"optim": "muon"} if uses_muon else {})
        assert isinstance(optimizer, MuonWithAdamW) == uses_muon, record["variant"]
        if uses_muon:  # Muon stepped: every hidden matrix it owns has a momentum buffer
            owned = [p for group in optimizer.muon.param_groups for p in group["params"]]
            assert owned and all("momentum_buffer" in optimizer.muon.state[p] for p in owned)
        assert record["final_loss"] < record["init_loss"]
    assert records[-1]["pretrain_changes"] == {}
    # All together's model has more parameters than vanilla (QK-norm scales, value and skip weights) only
    assert records[3]["parameters"] > records[0]["parameters"] == records[2]["parameters"]

    # The rows missing from the paper's table get our figures only and stay out of the comparison with it.
    table = parse_markdown_table((tmp_path / "out" / "results.md").read_text())
    assert [(r["Model"], r[""]) for r in table] == [
        ("Vanilla Transformer", "hfzoo"),
        ("", "paper"),
        *[(v, "hfzoo") for v in MODERN_VARIANTS[1:]],
    ]
    assert (
        "Not in the paper's table (our row only, left out of the agreement with the paper): QK-norm, Muon, "
        "All together." in (tmp_path / "out" / "results.md").read_text()
    )
    results = read_results(tmp_path / "out")
    assert set(results["summary"]) >= set(MODERN_VARIANTS)
    agreement = results["agreement"].values()
    assert {c["variants"] for c in agreement} == {1} and all(math.isnan(c["rho"]) for c in agreement)  # vanilla only
