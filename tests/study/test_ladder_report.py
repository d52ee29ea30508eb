"""The scale ladder's report (`hfzoo.study.ladder_report`, `hfzoo.study.ladder_fits`) on synthetic laws."""

from __future__ import annotations

import inspect
import json
import math

import pytest
from ladder_data import E_TRUE, LAWS, ladder_records, ladder_settings, loss_at
from PIL import Image

from hfzoo.study.ladder_fits import fit_ladder
from hfzoo.study.ladder_report import ADVANTAGE_PLOT, LOSS_PLOT, write_ladder_report

PAPER_ROWS = (
    "Model\tParams\tOps\tStep/s\tEarly loss\tFinal loss\n"
    "Vanilla Transformer\t223M\t11.1T\t3.50\t2.182 ± 0.005\t1.838\n"
    "SwiGLU\t223M\t11.1T\t3.53\t2.127 ± 0.003\t1.789\n"
    "Block sharing\t65M\t11.1T\t3.91\t2.497 ± 0.037\t2.164\n"
    "Funnel Transformer\t223M\t1.9T\t4.30\t2.288 ± 0.008\t1.918\n"
)
#: Three seeds per cell see two thirds of their variance in a within-cell bootstrap: the recovery checks use 99 %.
LEVEL = 0.99


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    path = tmp_path_factory.mktemp("ladder") / "table1.tsv"
    path.write_text(PAPER_ROWS, encoding="utf-8")
    return path


def inside(entry, value):
    low, high = entry["interval"]
    return low <= value <= high


def test_shared_law_recovered_within_its_intervals(table):
    settings = ladder_settings(table)
    out = fit_ladder(settings, ladder_records(), bootstrap_replicates=100, confidence=LEVEL)
    shared = out["compute_laws"]["shared"]["parameters"]
    assert inside(shared["E"], E_TRUE), shared["E"]
    assert inside(shared["alpha"], 0.3), shared["alpha"]
    for row, (_, a, _) in LAWS.items():
        assert inside(shared[f"A[{row}]"], a), (row, shared[f"A[{row}]"])
    # every row's held-out largest cell is predicted, beside that cell's seed spread
    check = {h["variant"]: h for h in out["compute_laws"]["holdout_check"]}
    assert set(check) == set(LAWS)
    for h in check.values():
        assert (h["hidden_size"], h["train_tokens"]) == (128, 819_200)
        assert math.isfinite(h["error"]) and h["seed_std"] > 0
        assert h["predicted"] == pytest.approx(h["measured"] + h["error"])
        assert abs(h["error"]) < 0.02  # the known law extrapolates a fraction of a decade within the noise scale
    # the extrapolated losses approach the known law at the paper's compute
    for row, e in out["extrapolation"]["rows"].items():
        truth = float(loss_at(LAWS[row], e["final"]["compute"]))
        assert e["final"]["predicted"] == pytest.approx(truth, abs=0.05)
        assert e["decades"] > 5


def test_sign_flip_found_where_constructed(table):
    crossing, alpha_v, alpha_r, a_v = 1e15, 0.3, 0.26, 16_000.0
    a_r = a_v * crossing ** (alpha_r - alpha_v)  # A_r C^-alpha_r = A_v C^-alpha_v at C = crossing
    laws = {
        "Vanilla Transformer": (1.0, a_v, alpha_v),
        "SwiGLU": (1.0, a_r, alpha_r),
        "Block sharing": (1.0, 18_000.0, 0.3),
    }
    out = fit_ladder(
        ladder_settings(table, laws), ladder_records(laws, noise=0.002), bootstrap_replicates=100, confidence=LEVEL
    )
    swiglu = out["advantages"]["rows"]["SwiGLU"]
    assert swiglu["crossing"]["compute"] is not None
    low, high = swiglu["crossing"]["interval"]
    assert low <= crossing <= high and high / low < 1e3
    assert swiglu["exponent_difference"]["differs"] and swiglu["exponent_difference"]["value"] < 0
    # better than vanilla where measured (positive), worse at the paper's compute (negative)
    assert all(c["measured"] > 0 for c in swiglu["cells"])
    assert out["advantages"]["rows"]["SwiGLU"]["fitted_at_paper"]["value"] < 0
    assert out["compute_laws"]["choice"] == "per_row"  # the shared exponent cannot fit crossing curves
    block = out["advantages"]["rows"]["Block sharing"]
    assert block["crossing"]["compute"] is None  # equal exponents: no crossing
    assert all(c["measured"] < 0 for c in block["cells"])


def test_report_files_and_half_done_ladder(table, tmp_path):
    skip = {("SwiGLU", 128, 819_200), ("SwiGLU", 128, 409_600), ("Funnel Transformer", 96, 204_800)}
    records = ladder_records(skip=skip)
    records = [
        r for r in records if not (r["variant"] == "Block sharing" and r["seed"] == 2 and r["hidden_size"] == 64)
    ]
    out = write_ladder_report(tmp_path, ladder_settings(table), records, bootstrap_replicates=20)
    assert json.loads((tmp_path / "ladder.json").read_text()) == out
    missing = {(m["variant"], m["hidden_size"], m["train_tokens"]): m["missing_seeds"] for m in out["missing"]}
    assert missing[("SwiGLU", 128, 819_200)] == [0, 1, 2]
    assert missing[("Funnel Transformer", 96, 204_800)] == [0, 1, 2]
    assert missing[("Block sharing", 64, 204_800)] == [2]
    assert len(missing) == 3 + 3  # Block sharing's seed 2 misses all three budgets at width 64
    text = (tmp_path / "ladder.md").read_text()
    assert "## Missing cells" in text
    assert "- SwiGLU, hidden 128, 819,200 tokens: seeds [0, 1, 2]" in text
    for row in LAWS:
        assert f"| {row} |" in text
    # SwiGLU's largest remaining cell (by compute) is held out
    check = {h["variant"]: h for h in out["compute_laws"]["holdout_check"]}
    own = [
        (b["total_flops"], r["hidden_size"], b["train_tokens"])
        for r in records
        if r["variant"] == "SwiGLU"
        for b in r["budgets"]
    ]
    assert (check["SwiGLU"]["hidden_size"], check["SwiGLU"]["train_tokens"]) == max(own)[1:]
    assert max(own)[1:] != (128, 819_200)
    for name in (LOSS_PLOT, ADVANTAGE_PLOT):
        with Image.open(tmp_path / name) as image:
            assert image.format == "PNG" and image.size[0] > 100
            image.verify()
    assert not list(tmp_path.glob("*.tmp"))


def test_rows_with_too_few_cells_are_named_not_fitted(table):
    laws = dict(LAWS)
    records = [r for r in ladder_records(laws) if not (r["variant"] == "Funnel Transformer" and r["hidden_size"] > 64)]
    for r in records:
        if r["variant"] == "Funnel Transformer":
            r["budgets"] = r["budgets"][:2]
    out = fit_ladder(ladder_settings(table), records, bootstrap_replicates=5)
    assert out["unfitted"] == {"Funnel Transformer": 2}
    assert "Funnel Transformer" not in out["compute_laws"]["rows"]


def test_bad_input_is_refused(table):
    settings = ladder_settings(table)
    with pytest.raises(ValueError, match="bootstrap_replicates=0"):
        fit_ladder(settings, ladder_records(), bootstrap_replicates=0)
    record = ladder_records()[0]
    del record["budgets"]
    with pytest.raises(ValueError, match=r"missing keys \['budgets'\]"):
        fit_ladder(settings, [record])


def test_default_replicates_are_at_least_1000():
    assert inspect.signature(write_ladder_report).parameters["bootstrap_replicates"].default >= 1000
