"""`hfzoo.study.settings`: the shipped study files load and validate, with the protocol and rows they promise."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from helpers.study import DEFAULT_STUDY, REPO_ROOT

from hfzoo.models.narang import TABLE_1_ROWS
from hfzoo.study.settings import load_settings
from hfzoo.study.summary import GLU_VARIANTS


def test_the_default_study_file_validates(data_dir, monkeypatch):
    """The shipped study: >= 15 Table 1 rows incl. vanilla, 3 GLU variants, RMSNorm, depth, sharing, embeddings, experts."""
    from hfzoo.study.checks import check_settings

    monkeypatch.chdir(REPO_ROOT)  # its paths are relative to the repository root
    settings = load_settings(DEFAULT_STUDY)
    assert len(settings.variants) >= 15 and len(settings.seeds) >= 3
    assert set(settings.variants) <= set(TABLE_1_ROWS) and "Vanilla Transformer" in settings.variants
    assert len(set(GLU_VARIANTS) & set(settings.variants)) >= 3 and "RMS Norm" in settings.variants
    assert any("layers" in v for v in settings.variants) and "Block sharing" in settings.variants
    assert any("mbedding" in v for v in settings.variants)
    assert {"Mixture of experts", "Switch Transformer"} & set(settings.variants)
    if not Path(settings.paper_table).is_file():
        pytest.skip(f"reference table not found at {settings.paper_table}")
    check_settings(settings)  # every variant builds on the base; the data, GLUE and paper files exist


MODERN_STUDY = REPO_ROOT / "recipes" / "studies" / "modern.yaml"


def test_the_gpu_study_file_has_the_default_protocol_and_rows(data_dir, monkeypatch):
    """`narang_gpu.yaml`: the default study's rows, seeds, data, objective and finetuning; only the scale differs."""
    from hfzoo.study.checks import check_settings

    monkeypatch.chdir(REPO_ROOT)
    small, gpu = load_settings(DEFAULT_STUDY), load_settings(REPO_ROOT / "recipes" / "studies" / "narang_gpu.yaml")
    scale = {"config_overrides", "train_batch_tokens", "max_train_steps", "learning_rate", "num_warmup_steps"}
    differ = {k for k in vars(small) if getattr(small, k) != getattr(gpu, k)}
    assert {"config_overrides", "max_train_steps"} <= differ <= scale, differ  # a larger model trained longer
    assert gpu.max_train_steps % 8 == 0 and gpu.num_warmup_steps < gpu.max_train_steps
    if not Path(gpu.paper_table).is_file():
        pytest.skip(f"reference table not found at {gpu.paper_table}")
    check_settings(gpu)  # every row scales to the wider base; the data, GLUE and paper files exist


def test_the_modern_study_file_has_the_gpu_protocol_and_todays_rows(data_dir, monkeypatch):
    """`modern.yaml`: narang_gpu.yaml's scale and protocol; the vanilla row, every modern switch alone, all together."""
    from hfzoo.models.modern import MODERN_ROWS
    from hfzoo.study.checks import check_settings

    monkeypatch.chdir(REPO_ROOT)
    gpu, modern = load_settings(REPO_ROOT / "recipes" / "studies" / "narang_gpu.yaml"), load_settings(MODERN_STUDY)
    differ = {k for k in vars(gpu) if getattr(gpu, k) != getattr(modern, k)}
    assert differ == {"variants"}, differ
    assert modern.variants == ["Vanilla Transformer", *MODERN_ROWS]
    if not Path(modern.paper_table).is_file():
        pytest.skip(f"reference table not found at {modern.paper_table}")
    check_settings(modern)  # every row builds on the base and its pretraining arguments pass the recipe's checks


def test_the_small_modern_study_file_has_the_cpu_scale_and_todays_rows(data_dir, monkeypatch):
    """`modern_small.yaml`: narang_small.yaml's scale and protocol with modern.yaml's rows, pretraining only."""
    from hfzoo.study.checks import check_settings

    monkeypatch.chdir(REPO_ROOT)
    small = load_settings(DEFAULT_STUDY)
    modern = load_settings(MODERN_STUDY)
    modern_small = load_settings(REPO_ROOT / "recipes" / "studies" / "modern_small.yaml")
    differ = {k for k in vars(small) if getattr(small, k) != getattr(modern_small, k)}
    assert differ == {"variants", "glue_tasks"}, differ
    assert modern_small.variants == modern.variants and modern_small.glue_tasks == []
    if not Path(modern_small.paper_table).is_file():
        pytest.skip(f"reference table not found at {modern_small.paper_table}")
    for family in ("encoder-decoder", "decoder", "encoder"):
        check_settings(dataclasses.replace(modern_small, family=family))


@pytest.mark.parametrize("name", ["ladder_small.yaml", "ladder_gpu.yaml"])
def test_the_ladder_study_files_span_ten_times_the_compute_with_agreeing_and_disagreeing_rows(name, data_dir,
                                                                                             monkeypatch):  # fmt: skip
    """The ladders: >= 6 rows (vanilla, GLU, RMS Norm, sharing, experts, convolution), >= 4 scales, 3 seeds,
    a >= 10x compute range, pretraining only; otherwise the protocol of the study file at their scale."""
    from hfzoo.models.flops import count_training_flops
    from hfzoo.study.checks import check_settings
    from hfzoo.study.configs import build_variant_config, ladder_size_settings, planned_tokenizer_fields, target_length
    from hfzoo.study.ladder import parse_ladder

    monkeypatch.chdir(REPO_ROOT)
    ladder = load_settings(REPO_ROOT / "recipes" / "studies" / name)
    base = load_settings(
        DEFAULT_STUDY if name == "ladder_small.yaml" else REPO_ROOT / "recipes/studies/narang_gpu.yaml"
    )
    schedule = {"lr_scheduler_type", "lr_scheduler_kwargs", "num_warmup_steps", "max_train_steps"}
    differ = {k for k in vars(base) if getattr(base, k) != getattr(ladder, k)}
    assert differ <= {"variants", "glue_tasks", "ladder", *schedule}, differ
    assert len(ladder.variants) >= 6 and len(ladder.seeds) >= 3 and ladder.glue_tasks == []
    assert {"Vanilla Transformer", "SwiGLU", "RMS Norm", "Block sharing", "Switch Transformer",
            "Lightweight convolution"} <= set(ladder.variants)  # fmt: skip
    parsed = parse_ladder(ladder)
    assert len(parsed.hidden_sizes) * len(parsed.budgets) >= 4
    fields = planned_tokenizer_fields(ladder.family, ladder.tokenizer_vocab_size)
    compute = [
        count_training_flops(
            build_variant_config(ladder_size_settings(ladder, h), "Vanilla Transformer", fields),
            ladder.block_size,
            target_length(ladder),
        ).total
        * budget.train_steps
        for h in parsed.hidden_sizes
        for budget in parsed.budgets
    ]
    assert max(compute) >= 10 * min(compute)
    if not Path(ladder.paper_table).is_file():
        pytest.skip(f"reference table not found at {ladder.paper_table}")
    check_settings(ladder)  # every row at every size, every budget's schedule
