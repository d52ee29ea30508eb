"""`hfzoo.study.tables`: the numbers and Table 1 of `results.md`."""

from __future__ import annotations

import math
from types import SimpleNamespace

from hfzoo.study.protocol import BASELINE
from hfzoo.study.summary import VariantSummary
from hfzoo.study.tables import _num, _pm, _si, _table


def test_numbers_are_shown_with_si_prefixes_and_missing_values_as_a_dash():
    assert [_si(v) for v in (223e6, 11.1e12, 2.37e6, 950.0, math.nan, None)] == [
        "223M",
        "11.1T",
        "2.37M",
        "950",
        "–",
        "–",
    ]
    assert _num(math.inf, 2) == "–" and _num(3.14159, 2) == "3.14"
    assert _pm(2.5, 0.25, 3) == "2.500 ± 0.250" and _pm(2.5, math.nan, 3) == "2.500" and _pm(math.nan, 0.1, 3) == "–"


def summary(variant: str, final_loss: float) -> VariantSummary:
    return VariantSummary(variant=variant, seeds=[0, 1], parameters=2_370_000, flops_per_token=1e7, total_flops=2e12,
                          steps_per_second=3.0, early_loss=3.0, early_loss_std=0.01, final_loss=final_loss,
                          final_loss_std=0.01, glue_average=70.0, glue_average_std=1.0, glue={"sst2": 80.0},
                          eval_losses=[])  # fmt: skip


def test_table_1_has_a_row_per_variant_with_its_task_columns_and_marks():
    summaries = {BASELINE: summary(BASELINE, 2.5), "SwiGLU": summary("SwiGLU", 2.4)}
    marks = {BASELINE: {"ours": [], "paper": None}, "SwiGLU": {"ours": ["final"], "paper": None}}
    lines = _table(SimpleNamespace(glue_tasks=["sst2"]), summaries, {}, marks)
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[-3:] == ["GLUE avg / SGLUE", "SST-2", "Better than vanilla (>2σ)"]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert [(r[0], r[1], r[2], r[6], r[-2], r[-1]) for r in rows] == [
        (BASELINE, "hfzoo", "2.37M", "2.500 ± 0.010", "80.0", "–"),
        ("SwiGLU", "hfzoo", "2.37M", "2.400 ± 0.010", "80.0", "final"),
    ]
