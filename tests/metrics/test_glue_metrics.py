"""GLUE metrics through hfzoo's offline `evaluate` module equal scikit-learn's and scipy's on the same predictions.

The reference implementations are the ones GLUE's official metric (and `evaluate`'s hub `glue` metric) is
defined by: `sklearn.metrics.matthews_corrcoef`, `f1_score` (binary, positive class 1), `accuracy_score`,
and `scipy.stats.pearsonr` / `spearmanr` (average ranks for ties). The inputs cover the cases where a
hand-written formula departs from them: constant predictions and classes absent from both sides (where
scikit-learn defines MCC and F1 as 0 rather than 0/0), imbalanced labels, and heavy ties in STS-B scores.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from hfzoo.data.glue import GLUE_TASKS
from hfzoo.metrics import load_glue_metric

N = 200
CLASSIFICATION_TASKS = [t for t, spec in GLUE_TASKS.items() if not spec.is_regression]
CLASSIFICATION_TASKS += ["mnli_matched", "mnli_mismatched"]


def reference(task: str, pred: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """GLUE's metrics for `task` from scikit-learn and scipy (what the official metric is defined by)."""
    if task == "stsb":
        return {"pearson": pearsonr(pred, ref)[0], "spearmanr": spearmanr(pred, ref)[0]}
    if task == "cola":
        return {"matthews_correlation": matthews_corrcoef(ref, pred)}
    result = {"accuracy": accuracy_score(ref, pred)}
    if task in ("mrpc", "qqp"):
        result["f1"] = f1_score(ref, pred)  # binary, positive class 1
    return result


def compute_in_two_batches(task: str, pred: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """The hfzoo metric for `task`, with predictions added in two uneven batches as the recipe does."""
    metric = load_glue_metric(task)
    metric.add_batch(predictions=pred[:77], references=ref[:77])
    metric.add_batch(predictions=pred[77:], references=ref[77:])
    return metric.compute()


def classification_case(case: str, num_labels: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(predictions, references) of class ids for one named situation."""
    balanced = rng.integers(0, num_labels, N)
    # Class 0 the large majority, the other classes (the positive one for binary tasks) rare.
    rare = np.full(num_labels - 1, 0.12 / (num_labels - 1))
    imbalanced = rng.choice(num_labels, N, p=[0.88, *rare])
    if case == "mostly_right":
        return np.where(rng.random(N) < 0.7, balanced, rng.integers(0, num_labels, N)), balanced
    if case == "imbalanced":
        return np.where(rng.random(N) < 0.85, imbalanced, rng.integers(0, num_labels, N)), imbalanced
    if case == "constant_majority":  # never predicts the positive class
        return np.zeros(N, dtype=np.int64), imbalanced
    if case == "constant_minority":  # always predicts the positive class
        return np.ones(N, dtype=np.int64), imbalanced
    if case == "no_positives_anywhere":  # F1 and MCC are 0/0 here; scikit-learn defines them as 0
        return np.zeros(N, dtype=np.int64), np.zeros(N, dtype=np.int64)
    if case == "always_wrong":
        return (balanced + 1) % num_labels, balanced
    raise ValueError(case)


CLASSIFICATION_CASES = [
    "mostly_right",
    "imbalanced",
    "constant_majority",
    "constant_minority",
    "no_positives_anywhere",
    "always_wrong",
]


# scikit-learn warns where it defines a 0/0 metric as 0 (the cases chosen for that).
@pytest.mark.filterwarnings("ignore::UserWarning:sklearn.*")
@pytest.mark.parametrize("case", CLASSIFICATION_CASES)
@pytest.mark.parametrize("task", CLASSIFICATION_TASKS)
def test_classification_metrics_match_sklearn(task, case):
    spec = GLUE_TASKS.get(task, GLUE_TASKS["mnli"])
    pred, ref = classification_case(case, spec.num_labels, np.random.default_rng(0))
    result = compute_in_two_batches(task, pred, ref)
    assert set(result) == set(spec.metrics)
    expected = reference(task.split("_")[0], pred, ref)
    for name, value in expected.items():
        assert np.isfinite(value), (name, "the reference is defined on this case")
        assert result[name] == pytest.approx(value, abs=1e-9), name
    if case == "mostly_right":
        # Imperfect but informative predictions: every metric strictly between chance and perfect.
        assert all(0.1 < v < 0.99 for v in result.values())


def regression_case(case: str, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(predictions, references) of STS-B scores in [0, 5], as float32 like the metric's features."""
    ref = rng.uniform(0, 5, N).round(2)
    if case == "noisy":
        pred = ref + rng.normal(0, 1.0, N)
    elif case == "coarse_ties":
        # Gold scores in steps of 0.2 (as STS-B's averaged annotations), predictions rounded to halves:
        # many ties on both sides, where Spearman's average ranks and any tie-breaking rank differ.
        ref = rng.integers(0, 26, N) / 5
        pred = np.clip(np.round(2 * (ref + rng.normal(0, 0.8, N))) / 2, 0, 5)
    elif case == "monotone_nonlinear":  # rank correlation 1, linear correlation below 1
        pred = ref**3
    elif case == "anticorrelated":
        pred = 5 - ref + rng.normal(0, 0.5, N)
    else:
        raise ValueError(case)
    return pred.astype(np.float32), ref.astype(np.float32)


@pytest.mark.parametrize("case", ["noisy", "coarse_ties", "monotone_nonlinear", "anticorrelated"])
def test_stsb_correlations_match_scipy(case):
    pred, ref = regression_case(case, np.random.default_rng(0))
    if case == "coarse_ties":
        assert len(np.unique(pred)) <= 11 and len(np.unique(ref)) <= 26  # the ties the case is about
    result = compute_in_two_batches("stsb", pred, ref)
    assert set(result) == set(GLUE_TASKS["stsb"].metrics)
    expected = reference("stsb", pred.astype(np.float64), ref.astype(np.float64))
    for name, value in expected.items():
        assert result[name] == pytest.approx(value, abs=1e-6), name
    if case == "monotone_nonlinear":
        assert result["spearmanr"] == pytest.approx(1.0) and result["pearson"] < 0.99


def test_perfect_predictions_score_one():
    ref = np.array([0, 1, 1, 0, 1])
    assert load_glue_metric("cola").compute(predictions=ref, references=ref)["matthews_correlation"] == 1.0
    assert load_glue_metric("mrpc").compute(predictions=ref, references=ref) == {"accuracy": 1.0, "f1": 1.0}


def test_unknown_metric_config_is_refused():
    with pytest.raises(KeyError, match="unknown GLUE task 'sst3'"):
        load_glue_metric("sst3")
