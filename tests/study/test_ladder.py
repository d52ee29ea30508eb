"""The study's scale ladder (`hfzoo.study.ladder`): its settings, width rule and plan; a branched budget equals
the separate run of that budget; a killed ladder continues to the same losses; the records' FLOPs and sizes.

The tiny ladder: two rows x two widths (16 and 32) x one seed, budgets of 10 and 20 steps (cooldowns of 2 and 4
steps: the 10-step budget branches from the 20-step run's checkpoint at step 8).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers.pretraining import restored_steps, tag_saved_history
from helpers.study import REPO_ROOT, VARIANTS, expect_refusal, tiny_study
from transformers import AutoTokenizer

from hfzoo.models.flops import count_training_flops
from hfzoo.study import ladder_report
from hfzoo.study.configs import (
    _tokenizer_fields,
    build_variant_config,
    ladder_size_settings,
    planned_tokenizer_fields,
    target_length,
)
from hfzoo.study.ladder import ladder_plan, parse_ladder
from hfzoo.study.runner import main
from hfzoo.study.runs import run_dir
from hfzoo.study.settings import load_settings

LADDER = {"hidden_sizes": [16, 32], "token_budgets": [1280, 2560], "cooldown_fraction": 0.2}
FAST_REPORT = ["--bootstrap_replicates", "20"]  # the report's fits and bootstrap are tested in test_ladder_report.py
WSD = {"lr_scheduler_type": "warmup_stable_decay", "lr_scheduler_kwargs": {"decay_type": "1-sqrt"}}


def ladder_study(inputs, path, **changes):
    values = {"ladder": LADDER, "glue_tasks": [], "seeds": [0], "max_train_steps": 20, **WSD, **changes}
    return tiny_study(inputs, path, **values)


@pytest.fixture(scope="module")
def ladder_run(inputs, tmp_path_factory):
    root = tmp_path_factory.mktemp("ladder")
    study = ladder_study(inputs, root / "study.yaml")
    records = main(["--study", str(study), "--output_dir", str(root / "out"), *FAST_REPORT])
    return root, records


def test_the_plan_is_every_size_row_and_seed_largest_first(inputs, tmp_path):
    settings = load_settings(ladder_study(inputs, tmp_path / "s.yaml", seeds=[0, 1]))
    plan = ladder_plan(settings)
    assert plan[0][2] == 32 and plan[-1][2] == 16
    assert sorted(plan) == sorted((v, s, h) for v in VARIANTS for s in (0, 1) for h in (16, 32))
    ladder = parse_ladder(settings)
    assert [(b.train_steps, b.cooldown_steps, b.branch_step) for b in ladder.budgets] == [(10, 2, 8), (20, 4, 16)]


def test_the_width_rule_scales_d_model_d_ff_and_d_kv_and_keeps_depth_and_heads(inputs, tmp_path):
    settings = load_settings(ladder_study(inputs, tmp_path / "s.yaml"))
    fields = planned_tokenizer_fields("encoder-decoder", 512)
    base = build_variant_config(settings, "Vanilla Transformer", fields)
    half = build_variant_config(ladder_size_settings(settings, 16), "Vanilla Transformer", fields)
    assert (half.hidden_size, half.head_dim) == (base.hidden_size // 2, base.head_dim // 2)
    assert half.intermediate_size == base.intermediate_size // 2
    glu = build_variant_config(ladder_size_settings(settings, 16), "SwiGLU", fields)
    assert glu.intermediate_size < half.intermediate_size  # the row's d_ff x 2/3 resolves against each size
    assert (half.num_attention_heads, half.num_hidden_layers, half.num_decoder_layers) == (
        base.num_attention_heads, base.num_hidden_layers, base.num_decoder_layers)  # fmt: skip
    with pytest.raises(ValueError, match=r"ladder.hidden_sizes: 17 gives a per-head width of 8.5.*multiples of 2"):
        ladder_size_settings(settings, 17)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"ladder": {**LADDER, "token_budgets": [1000, 2560]}}, "1000 is not a multiple of train_batch_tokens=128"),
        ({"ladder": {**LADDER, "cooldown_fraction": 1.5}}, "cooldown_fraction=1.5"),
        ({"ladder": {"hidden_sizes": [16]}}, "missing ['token_budgets', 'cooldown_fraction']"),
        ({"ladder": {**LADDER, "hidden_sizes": [16, 17]}}, "17 gives a per-head width"),
        ({"max_train_steps": 16}, "max_train_steps=16: a ladder's longest run trains its largest budget"),
        ({"lr_scheduler_type": "cosine"}, "use 'warmup_stable_decay'"),
        ({"lr_scheduler_kwargs": {"num_decay_steps": 3}}, "['num_decay_steps'] are set per budget"),
        ({"lr_scheduler_kwargs": {"decay_type": "exp"}}, "--lr_scheduler_type warmup_stable_decay"),
        ({"num_warmup_steps": 8}, "num_warmup_steps=8"),
        ({"glue_tasks": ["sst2"]}, "set glue_tasks: []"),
    ],
)
def test_bad_ladders_are_refused_before_any_work(changes, message, inputs, tmp_path, capsys):
    study = ladder_study(inputs, tmp_path / "s.yaml", **changes)
    error = expect_refusal(["--study", str(study), "--output_dir", str(tmp_path / "out")], capsys)
    assert message in error
    assert not (tmp_path / "out").exists()


def test_every_budget_is_recorded_with_its_flops_and_the_checkpoints_are_removed(ladder_run):
    root, records = ladder_run
    assert len(records) == 2 * 2
    settings = load_settings(root / "study.yaml")
    for record in records:
        config = build_variant_config(
            ladder_size_settings(settings, record["hidden_size"]),
            record["variant"],
            _tokenizer_fields(AutoTokenizer.from_pretrained(settings.tokenizer_name)),
        )
        assert config.hidden_size == record["hidden_size"]
        per_sequence = count_training_flops(config, settings.block_size, target_length(settings)).total
        assert [b["train_steps"] for b in record["budgets"]] == [10, 20]
        assert [b["branched_from_step"] for b in record["budgets"]] == [8, None]
        for budget in record["budgets"]:
            assert budget["total_flops"] == pytest.approx(per_sequence * 4 * budget["train_steps"])
            assert budget["train_tokens"] == 128 * budget["train_steps"]
        assert 0 < record["non_embedding_parameters"] < record["parameters"]
        folder = run_dir(root / "out", record["variant"], record["seed"], record["hidden_size"])
        assert not (folder / "pretrain" / "checkpoints").exists()
        assert (folder / "budget_10" / "model.safetensors").is_file()
    report = json.loads((root / "out" / "ladder.json").read_text())
    assert report["runs"] == 2 * len(records) and report["bootstrap_replicates"] == 20  # (run, budget) losses
    assert all((root / "out" / name).is_file() for name in ("ladder.md", "ladder_loss_vs_compute.png"))
    small = {r["variant"]: r for r in records if r["hidden_size"] == 16}
    large = {r["variant"]: r for r in records if r["hidden_size"] == 32}
    assert all(large[v]["parameters"] > small[v]["parameters"] for v in VARIANTS)


def test_a_branched_budget_equals_the_separate_run_of_that_budget(inputs, ladder_run, tmp_path):
    root, records = ladder_run
    # the 10-step budget alone: its own warmup-stable-decay run from step 0 (no branch)
    study = ladder_study(inputs, tmp_path / "s.yaml", ladder={**LADDER, "token_budgets": [1280]}, max_train_steps=10)
    separate = main(["--study", str(study), "--output_dir", str(tmp_path / "out"), *FAST_REPORT])
    branched = {(r["variant"], r["hidden_size"]): r["budgets"][0] for r in records}
    # The branch did start from the longest run's checkpoint at step 8: its history carries that run's records of
    # steps 1-8 as they were saved, wall-clock figures included (a budget trained from step 0 measures its own).
    for record in records:
        folder = run_dir(root / "out", record["variant"], record["seed"], record["hidden_size"])
        longest, branch = (json.loads((folder / name / "train_history.json").read_text())["log_history"]
                           for name in ("pretrain", "budget_10"))  # fmt: skip
        assert [r["step"] for r in branch] == [r["step"] for r in longest][: len(branch)] and len(branch) > 8
        saved = [r for r in longest if r["step"] <= 8]
        assert saved and branch[: len(saved)] == saved, (branch, longest)
    for record in separate:
        alone = record["budgets"][0]
        assert alone["branched_from_step"] is None and alone["train_steps"] == 10
        assert alone["final_loss"] == pytest.approx(branched[record["variant"], record["hidden_size"]]["final_loss"],
                                                     abs=1e-6)  # fmt: skip


@pytest.mark.slow
def test_a_killed_ladder_continues_to_the_same_losses(inputs, ladder_run, tmp_path, monkeypatch):
    root, records = ladder_run
    study = ladder_study(inputs, tmp_path / "s.yaml")
    argv = ["--study", str(study), "--output_dir", str(tmp_path / "out"), *FAST_REPORT]
    # SIGKILL at the 34th optimizer step of the study: the first run (its 20 steps, then the 2 of the 10-step
    # budget's cooldown) is done; the second run's longest budget is at step 12 of 20, past its checkpoint at step 8.
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tests" / "helpers" / "kill_study_during_run.py"), "SIGKILL", "34", *argv],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == -9, proc.stderr[-3000:]
    first, second = (run_dir(tmp_path / "out", v, 0, 32) for v in VARIANTS)
    assert (first / "result.json").is_file() and not (second / "result.json").exists()
    assert (second / "pretrain" / "checkpoints" / "step_8").is_dir()
    tag_saved_history(second / "pretrain" / "checkpoints" / "step_8")
    # the report's fits (most of a tiny ladder's time) are checked with `ladder_run`; here only the losses count
    monkeypatch.setattr(ladder_report, "write_ladder_report", lambda *args, **kwargs: None)
    resumed = main(argv)
    # the second run resumed from its checkpoint at step 8 (restoring those steps' records), not from step 0
    assert restored_steps(second / "pretrain") == (list(range(1, 21)), list(range(1, 9)))
    losses = {(r["variant"], r["hidden_size"]): [b["final_loss"] for b in r["budgets"]] for r in records}
    assert {(r["variant"], r["hidden_size"]): [b["final_loss"] for b in r["budgets"]] for r in resumed} == losses
