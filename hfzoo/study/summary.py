"""The study's statistics over its runs: per-variant means and spreads, significance, agreement with the paper.

`summarize` aggregates the run records by variant (mean and standard deviation over seeds); `significance`
marks what is better than the vanilla model by the paper's criterion (more than two standard deviations of
the vanilla runs below its loss, or above its score); `agreement` is the Spearman rank correlation of our
columns with the paper's, with a bootstrap 95% interval (`spearman_with_interval`).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import warnings
from typing import Any

import numpy as np
from scipy import stats

from ..models.narang import PaperRow
from .protocol import BASELINE

#: The GLUE variants of Table 1 (for the seed-spread comparison with the vanilla model).
GLU_VARIANTS = ("GLU", "GeGLU", "ReGLU", "SwiGLU", "LiGLU")


@dataclasses.dataclass
class VariantSummary:
    """One variant's runs aggregated over seeds (means, and sample standard deviations with ddof 1).

    Attributes:
        variant: the Table 1 row name.
        seeds: the seeds of its finished runs.
        parameters: parameters of the model.
        flops_per_token: training FLOPs per processed token.
        total_flops: training FLOPs of one run ("Ops").
        steps_per_second: mean over seeds (this hardware).
        early_loss, early_loss_std, final_loss, final_loss_std: held-out losses (nats per target token).
        glue_average, glue_average_std: mean of the task scores (x 100).
        glue: task -> mean score over seeds.
        eval_losses: `[step, mean loss over seeds]`.
    """

    variant: str
    seeds: list[int]
    parameters: int
    flops_per_token: float
    total_flops: float
    steps_per_second: float
    early_loss: float
    early_loss_std: float
    final_loss: float
    final_loss_std: float
    glue_average: float
    glue_average_std: float
    glue: dict[str, float]
    eval_losses: list[list[float]]


def _mean_std(values: list[float]) -> tuple[float, float]:
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else math.nan


def summarize(records: list[dict[str, Any]]) -> dict[str, VariantSummary]:
    """Aggregate run records by variant, in the order the variants first appear.

    Args:
        records: run records (`hfzoo.study.execution.execute_run`).

    Returns:
        `{variant: VariantSummary}`.
    """
    by_variant: dict[str, list[dict]] = {}
    for record in records:
        by_variant.setdefault(record["variant"], []).append(record)
    summaries = {}
    for variant, runs in by_variant.items():
        early, early_std = _mean_std([r["early_loss"] for r in runs])
        final, final_std = _mean_std([r["final_loss"] for r in runs])
        glue, glue_std = _mean_std([r["glue_average"] for r in runs])
        tasks = list(runs[0]["glue"])
        steps = {}
        for run in runs:
            for step, loss in run["eval_losses"]:
                steps.setdefault(step, []).append(loss)
        summaries[variant] = VariantSummary(
            variant=variant,
            seeds=[r["seed"] for r in runs],
            parameters=runs[0]["parameters"],
            flops_per_token=runs[0]["flops_per_token"],
            total_flops=runs[0]["total_flops"],
            steps_per_second=_mean_std([r["timing"].get("steps_per_second", math.nan) for r in runs])[0],
            early_loss=early,
            early_loss_std=early_std,
            final_loss=final,
            final_loss_std=final_std,
            glue_average=glue,
            glue_average_std=glue_std,
            glue={t: _mean_std([r["glue"][t]["score"] for r in runs])[0] for t in tasks},
            eval_losses=[[step, statistics.fmean(v)] for step, v in sorted(steps.items())],
        )
    return summaries


def _rank_correlation(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    """Spearman's rho along `axis` as Pearson's r of the ranks (average ranks for ties), vectorized for the bootstrap.

    This is what `scipy.stats.spearmanr` computes for one pair of samples; scipy's `pearsonr` and `rankdata`
    take an `axis`, so thousands of resamples are evaluated at once. A resample whose values are all equal
    has no rank order and counts as rho = 0.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", (stats.ConstantInputWarning, RuntimeWarning))
        rho = stats.pearsonr(stats.rankdata(a, axis=axis), stats.rankdata(b, axis=axis), axis=axis).statistic
    return np.nan_to_num(rho, nan=0.0)


def spearman_with_interval(
    x: list[float], y: list[float], confidence: float = 0.95, n_resamples: int = 9999, seed: int = 0
) -> tuple[float, float, float]:
    """Spearman's rank correlation of paired values with a percentile bootstrap interval (scipy).

    rho is `scipy.stats.spearmanr`; its interval is `scipy.stats.bootstrap` over the pairs (resampled
    together; percentile method) of the same statistic in vectorized form (`_rank_correlation`).

    Args:
        x: values of one column (e.g. our final loss of each variant); pairs with a non-finite value
            are left out.
        y: the paired values of the other (e.g. the paper's final loss of the same variants).
        confidence: the interval's confidence level.
        n_resamples: bootstrap resamples.
        seed: the resampling seed (the interval is reproducible).

    Returns:
        `(rho, low, high)`; all NaN with fewer than 3 pairs (no meaningful rank correlation).
    """
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    if len(x) < 3:
        return math.nan, math.nan, math.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", stats.ConstantInputWarning)
        rho = stats.spearmanr(x, y).statistic
    result = stats.bootstrap(
        (x, y),
        _rank_correlation,
        paired=True,
        vectorized=True,
        confidence_level=confidence,
        n_resamples=n_resamples,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    low, high = result.confidence_interval
    return (0.0 if np.isnan(rho) else float(rho)), float(low), float(high)


def significance(summaries: dict[str, VariantSummary], paper: dict[str, PaperRow]) -> dict[str, dict[str, Any]]:
    """Which columns are significantly better than the vanilla model's, by the paper's criterion.

    Ours: more than two standard deviations (of the vanilla runs over seeds) below the vanilla mean loss
    (early, final) or above its mean GLUE average. The paper's: the same with the standard deviation its
    table reports, the vanilla early loss's over 5 runs, used for both loss columns (the table gives no
    spread for the final loss or the downstream scores, so the downstream column is not tested).

    Returns:
        `{variant: {"ours": [column names], "paper": [column names] or None}}`; empty lists when the vanilla
        model was not run (or has one seed: no spread).
    """
    base = summaries.get(BASELINE)
    marks = {}
    for name, s in summaries.items():
        ours = []
        if base is not None and name != BASELINE:
            for column, better in (("early", -1), ("final", -1), ("GLUE", 1)):
                mean, base_mean, base_std = {
                    "early": (s.early_loss, base.early_loss, base.early_loss_std),
                    "final": (s.final_loss, base.final_loss, base.final_loss_std),
                    "GLUE": (s.glue_average, base.glue_average, base.glue_average_std),
                }[column]
                if math.isfinite(base_std) and better * (mean - base_mean) > 2 * base_std:
                    ours.append(column)
        theirs = None
        if name in paper and BASELINE in paper and name != BASELINE:
            row, vanilla = paper[name], paper[BASELINE]
            theirs = [
                c
                for c, v, b in (
                    ("early", row.early_loss, vanilla.early_loss),
                    ("final", row.final_loss, vanilla.final_loss),
                )
                if b - v > 2 * vanilla.early_loss_std
            ]
        marks[name] = {"ours": ours, "paper": theirs}
    return marks


def agreement(
    summaries: dict[str, VariantSummary], paper: dict[str, PaperRow], downstream: bool = True
) -> dict[str, dict[str, Any]]:
    """Spearman rank correlation (and bootstrap 95% interval) of our columns with the paper's, over variants.

    Columns: early loss, final loss, and downstream (our GLUE average vs the paper's SuperGLUE average; left out
    when `downstream` is False, for a study that finetunes on no task).

    Returns:
        `{column: {"rho", "low", "high", "variants"}}`.
    """
    common = [name for name in summaries if name in paper]
    columns = {
        "Early loss": ([summaries[n].early_loss for n in common], [paper[n].early_loss for n in common]),
        "Final loss": ([summaries[n].final_loss for n in common], [paper[n].final_loss for n in common]),
        "Downstream (GLUE average vs SGLUE)": (
            [summaries[n].glue_average for n in common],
            [paper[n].downstream.get("SGLUE", math.nan) for n in common],
        ),
    }
    if not downstream:
        del columns["Downstream (GLUE average vs SGLUE)"]
    result = {}
    for column, (ours, theirs) in columns.items():
        rho, low, high = spearman_with_interval(ours, theirs)
        result[column] = {"rho": rho, "low": low, "high": high, "variants": len(common)}
    return result


def seed_spread(summaries: dict[str, VariantSummary]) -> dict[str, Any] | None:
    """The vanilla final loss's standard deviation over seeds against its gap to the best GLU variant.

    Returns:
        `{"vanilla_std", "best_glu", "gap", "gap_in_std"}` or None without a vanilla model and a GLU variant.
    """
    base = summaries.get(BASELINE)
    glus = [summaries[n] for n in GLU_VARIANTS if n in summaries]
    if base is None or not glus:
        return None
    best = min(glus, key=lambda s: s.final_loss)
    gap = base.final_loss - best.final_loss
    std = base.final_loss_std
    return {
        "vanilla_std": std,
        "best_glu": best.variant,
        "gap": gap,
        "gap_in_std": gap / std if math.isfinite(std) and std > 0 else math.nan,
    }


def downstream_gains(
    summaries: dict[str, VariantSummary], baseline_records: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """The "No pretraining" row and every variant's downstream gain over it.

    Args:
        summaries: the pretrained variants (`summarize`).
        baseline_records: the "No pretraining" runs' records.

    Returns:
        `{"no_pretraining": {"seeds", "glue_average", "glue_average_std", "glue": {task: mean}},
        "gains": {variant: {"glue_average": gain, "glue": {task: gain}}}}` (score points, variant mean minus
        the no-pretraining mean), or None without "No pretraining" runs.
    """
    if not baseline_records:
        return None
    average, std = _mean_std([r["glue_average"] for r in baseline_records])
    tasks = list(baseline_records[0]["glue"])
    base = {t: _mean_std([r["glue"][t]["score"] for r in baseline_records])[0] for t in tasks}
    gains = {
        name: {
            "glue_average": s.glue_average - average,
            "glue": {t: s.glue.get(t, math.nan) - base[t] for t in tasks},
        }
        for name, s in summaries.items()
    }
    return {
        "no_pretraining": {
            "seeds": [r["seed"] for r in baseline_records],
            "glue_average": average,
            "glue_average_std": std,
            "glue": base,
        },
        "gains": gains,
    }


def precision_summary(records: list[dict[str, Any]]) -> dict[str, list[str]]:
    """The precisions the runs trained in and the devices' capability classes, for `results.json`.

    Args:
        records: the finished runs' records (`mixed_precision`, `host_capability`: from the runs' `all_results.json`;
            absent in records of older studies).

    Returns:
        `{"mixed_precision": [...], "names": [...], "host_capability": [...]}`: the distinct values, sorted
        (`names`: `fp32` for accelerate's `no`); more than one value means the runs were not all trained alike.
    """
    keys = ("mixed_precision", "host_capability")
    values = {key: sorted({str(r[key]) for r in records if r.get(key)}) for key in keys}
    return {**values, "names": [{"no": "fp32"}.get(v, v) for v in values["mixed_precision"]]}
