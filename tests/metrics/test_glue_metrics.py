"""GLUE metrics through hfzoo's offline `evaluate` module equal independent computations on the same predictions."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import rankdata

from hfzoo.data.glue import GLUE_TASKS
from hfzoo.metrics import load_glue_metric


def binary_counts(pred: np.ndarray, ref: np.ndarray) -> tuple[int, int, int, int]:
    tp = int(((pred == 1) & (ref == 1)).sum())
    tn = int(((pred == 0) & (ref == 0)).sum())
    fp = int(((pred == 1) & (ref == 0)).sum())
    fn = int(((pred == 0) & (ref == 1)).sum())
    return tp, tn, fp, fn


def closed_form(task: str, pred: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """The metric definitions written out (Matthews 1975; F1 of the positive class; Pearson on ranks = Spearman)."""
    if task == "stsb":
        pearson = np.corrcoef(pred, ref)[0, 1]
        spearman = np.corrcoef(rankdata(pred), rankdata(ref))[0, 1]
        return {"pearson": pearson, "spearmanr": spearman}
    accuracy = float((pred == ref).mean())
    tp, tn, fp, fn = binary_counts(pred, ref)
    if task == "cola":
        mcc = (tp * tn - fp * fn) / np.sqrt(float((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn)))
        return {"matthews_correlation": mcc}
    if task in ("mrpc", "qqp"):
        return {"accuracy": accuracy, "f1": 2 * tp / (2 * tp + fp + fn)}
    return {"accuracy": accuracy}


@pytest.mark.parametrize("task", [*GLUE_TASKS, "mnli_matched", "mnli_mismatched"])
def test_metric_equals_closed_form(task):
    rng = np.random.default_rng(0)
    n = 200
    spec = GLUE_TASKS.get(task, GLUE_TASKS["mnli"])
    if spec.is_regression:
        ref = rng.uniform(0, 5, n).round(2)
        pred = (ref + rng.normal(0, 1.0, n)).astype(np.float32)
        pred[:20] = pred[20:40]  # ties, where Spearman and Pearson-on-values differ
    else:
        ref = rng.integers(0, spec.num_labels, n)
        pred = np.where(rng.random(n) < 0.7, ref, rng.integers(0, spec.num_labels, n))
    metric = load_glue_metric(task)
    # Added in two batches, as the recipe does.
    metric.add_batch(predictions=pred[:77], references=ref[:77])
    metric.add_batch(predictions=pred[77:], references=ref[77:])
    result = metric.compute()
    expected = closed_form(task.split("_")[0], pred.astype(np.float64) if spec.is_regression else pred, ref)
    assert set(result) == set(spec.metrics)
    for name, value in expected.items():
        assert result[name] == pytest.approx(value, abs=1e-6), name
    # Imperfect but informative predictions: every metric strictly between chance and perfect.
    assert all(0.1 < v < 0.99 for v in result.values())


def test_perfect_predictions_score_one():
    ref = np.array([0, 1, 1, 0, 1])
    assert load_glue_metric("cola").compute(predictions=ref, references=ref)["matthews_correlation"] == 1.0
    assert load_glue_metric("mrpc").compute(predictions=ref, references=ref) == {"accuracy": 1.0, "f1": 1.0}


def test_unknown_metric_config_is_refused():
    with pytest.raises(KeyError, match="unknown GLUE task 'sst3'"):
        load_glue_metric("sst3")
