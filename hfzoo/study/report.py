"""The study's report: `results.json`, `results.md` in Table 1's layout beside the paper's rows, and the plots.

`write_report(output_dir, settings, records)` aggregates the runs of `hfzoo.study.runner` by variant
(mean and standard deviation over seeds), marks what is significantly better than the vanilla model by
the paper's criterion (more than two standard deviations of the vanilla runs below its loss, or above its
score), measures the agreement of our columns with the paper's (Spearman rank correlation with a
bootstrap 95% interval, `spearman_with_interval`) and draws the validation-loss curves, our final loss
against the paper's, and quality against parameters and FLOPs (`hfzoo.training.plots`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import statistics
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from ..models.narang import PaperRow, load_paper_table
from ..training.plots import plot_curves_by_name, plot_labelled_scatter
from .protocol import BASELINE, EARLY_FRACTION, FAMILIES, NO_PRETRAINING, SELECTION_KEYS, study_plan

__all__ = ["VariantSummary", "precision_summary", "spearman_with_interval", "summarize", "write_report"]

#: The GLUE variants of Table 1 (for the seed-spread comparison with the vanilla model).
GLU_VARIANTS = ("GLU", "GeGLU", "ReGLU", "SwiGLU", "LiGLU")
#: Short column names of the GLUE tasks, as in the GLUE leaderboard.
TASK_TITLES = {
    "cola": "CoLA",
    "sst2": "SST-2",
    "mrpc": "MRPC",
    "stsb": "STS-B",
    "qqp": "QQP",
    "mnli": "MNLI",
    "qnli": "QNLI",
    "rte": "RTE",
    "wnli": "WNLI",
}


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
        records: run records (`hfzoo.study.runner.execute_run`).

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


def _si(value: float) -> str:
    """223e6 -> "223M", 11.1e12 -> "11.1T", 2.37e6 -> "2.37M" (three significant digits)."""
    if value is None or not math.isfinite(value):
        return "–"
    for factor, suffix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "K"), (1.0, "")):
        if abs(value) >= factor or factor == 1.0:
            scaled = value / factor
            digits = 0 if abs(scaled) >= 100 else 1 if abs(scaled) >= 10 else 2
            return f"{scaled:.{digits}f}{suffix}"
    raise AssertionError("unreachable")


def _num(value: float, digits: int) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:.{digits}f}"


def _pm(mean: float, std: float, digits: int) -> str:
    if not math.isfinite(mean):
        return "–"
    return f"{mean:.{digits}f} ± {std:.{digits}f}" if math.isfinite(std) else f"{mean:.{digits}f}"


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


def _table(
    settings, summaries: dict[str, VariantSummary], paper: dict[str, PaperRow], marks: dict[str, dict]
) -> list[str]:
    tasks = list(settings.glue_tasks)
    header = [
        "Model",
        "",
        "Params",
        "Ops",
        "Step/s",
        "Early loss",
        "Final loss",
        *(["GLUE avg / SGLUE"] if tasks else []),
        *[TASK_TITLES.get(t, t) for t in tasks],
        "Better than vanilla (>2σ)",
    ]
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---", "---"] + ["---:"] * (len(header) - 3) + ["---"]) + "|",
    ]
    for name, s in summaries.items():
        ours_marks = ", ".join(marks[name]["ours"]) or ("–" if name == BASELINE else "no")
        lines.append(
            "| "
            + " | ".join(
                [
                    name,
                    "hfzoo",
                    _si(s.parameters),
                    _si(s.total_flops),
                    _num(s.steps_per_second, 2),
                    _pm(s.early_loss, s.early_loss_std, 3),
                    _pm(s.final_loss, s.final_loss_std, 3),
                    *([_pm(s.glue_average, s.glue_average_std, 1)] if tasks else []),
                    *[_num(s.glue.get(t, math.nan), 1) for t in tasks],
                    ours_marks,
                ]
            )
            + " |"
        )
        row = paper.get(name)
        if row is not None:
            theirs = marks[name]["paper"]
            paper_marks = "–" if theirs is None else ", ".join(theirs) or "no"
            lines.append(
                "| "
                + " | ".join(
                    [
                        "",
                        "paper",
                        _si(row.params),
                        _si(row.ops),
                        _num(row.steps_per_second, 2),
                        _pm(row.early_loss, row.early_loss_std, 3),
                        _num(row.final_loss, 3),
                        *([_num(row.downstream.get("SGLUE", math.nan), 2)] if tasks else []),
                        *([""] * len(tasks)),
                        paper_marks,
                    ]
                )
                + " |"
            )
    return lines


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


def _timing_value(record: dict[str, Any], *keys: str) -> float:
    value: Any = record.get("timing", {})
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else math.nan


def time_accounting(records: list[dict[str, Any]], preparation: dict[str, Any] | None) -> dict[str, Any]:
    """Where the study's wall time went: per run and over all runs (summed run wall times).

    Args:
        records: the finished runs (each `timing` with `run_seconds` and `seconds` per part; see
            `hfzoo.study.runner.time_breakdown`).
        preparation: `preparation.json` (the study's tokenizer and tokenized data), or None.

    Returns:
        `{"runs": [{"variant", "seed", "run_seconds", "fractions", "train_tflops"}],
        "study": {"run_seconds", "seconds": {part: sum}, "fractions": {part: share}, "train_tflops"},
        "preparation": {...}}`; the study's TFLOP/s is the pretrained runs' FLOPs over their summed
        training-step seconds.
    """
    runs, totals, run_seconds = [], {}, 0.0
    flops, step_seconds = 0.0, 0.0
    for r in records:
        if "seconds" not in r.get("timing", {}):
            continue
        seconds = r["timing"]["seconds"]
        runs.append({
            "variant": r["variant"],
            "seed": r["seed"],
            "run_seconds": r["timing"]["run_seconds"],
            "fractions": r["timing"]["fractions"],
            "train_tflops": _timing_value(r, "train_tflops"),
        })  # fmt: skip
        run_seconds += r["timing"]["run_seconds"]
        for part, value in seconds.items():
            totals[part] = totals.get(part, 0.0) + value
        if seconds.get("train_steps", 0.0) > 0:
            flops += r["total_flops"]
            step_seconds += seconds["train_steps"]
    study = {
        "run_seconds": run_seconds,
        "seconds": totals,
        "fractions": {k: v / run_seconds for k, v in totals.items()} if run_seconds > 0 else {},
        "train_tflops": flops / step_seconds / 1e12 if step_seconds > 0 else math.nan,
    }
    return {"runs": runs, "study": study, "preparation": preparation or {}}


#: Column titles of the time table, by part of `hfzoo.study.runner.TIME_PARTS`.
_TIME_TITLES = {
    "train_steps": "training steps",
    "pretrain_evaluation": "validation",
    "pretrain_other": "pretraining set-up & saving",
    "finetuning": "GLUE finetuning",
    "other": "other",
}


def _sig(value: float) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:.3g}"


def _signed(value: float) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:+.1f}"


def _percent(value: float) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{100 * value:.1f}%"


def _downstream_lines(settings, downstream: dict[str, Any]) -> list[str]:
    tasks = list(settings.glue_tasks)
    titles = [TASK_TITLES.get(t, t) for t in tasks]
    base = downstream["no_pretraining"]
    lines = [
        "## Downstream: gain over no pretraining",
        "",
        f'"{NO_PRETRAINING}": the vanilla model finetuned from its random initialisation (same seeds, same '
        "finetuning budget). A variant's gain is its mean score minus that row's, in score points; the row has "
        "no pretraining loss and is not part of the comparison with the paper.",
        "",
        "| Model | GLUE avg | gain | " + " | ".join(titles) + " |",
        "|---|---:|---:|" + "---:|" * len(tasks),
        f"| {NO_PRETRAINING} | {_pm(base['glue_average'], base['glue_average_std'], 1)} | – | "
        + " | ".join(_num(base["glue"][t], 1) for t in tasks)
        + " |",
    ]
    for name, gain in downstream["gains"].items():
        lines.append(
            f"| {name} | {_num(base['glue_average'] + gain['glue_average'], 1)} | {_signed(gain['glue_average'])} | "
            + " | ".join(_signed(gain["glue"][t]) for t in tasks)
            + " |"
        )
    return [*lines, ""]


def _time_lines(accounting: dict[str, Any]) -> list[str]:
    study = accounting["study"]
    if not accounting["runs"]:
        return []
    parts = list(_TIME_TITLES)
    lines = [
        "## Where the time went",
        "",
        "Share of each run's wall time (from its start to its record) spent in each part, and the training "
        "throughput: the run's pretraining FLOPs (Ops) over the wall time of its training steps. "
        '"All runs" sums the runs\' wall times (processes running at once each count their own).',
        "",
        "| Run | seed | wall s | " + " | ".join(_TIME_TITLES[p] for p in parts) + " | TFLOP/s |",
        "|---|---:|---:|" + "---:|" * (len(parts) + 1),
    ]
    for run in accounting["runs"]:
        lines.append(
            f"| {run['variant']} | {run['seed']} | {run['run_seconds']:.1f} | "
            + " | ".join(_percent(run["fractions"].get(p, math.nan)) for p in parts)
            + f" | {_sig(run['train_tflops'])} |"
        )
    lines.append(
        f"| All runs | | {study['run_seconds']:.1f} | "
        + " | ".join(_percent(study["fractions"].get(p, math.nan)) for p in parts)
        + f" | {_sig(study['train_tflops'])} |"
    )
    prep = accounting["preparation"]
    done = [f"tokenizer {prep['tokenizer_seconds']:.1f} s"] if "tokenizer_seconds" in prep else []
    if "data" in prep:
        done.append(
            f"tokenized data {prep['data']['seconds']:.1f} s ({prep['data']['train_blocks']:,} training and "
            f"{prep['data']['validation_blocks']:,} validation blocks)"
        )
    if done:
        lines += ["", "Prepared once for the whole study, before the runs: " + "; ".join(done) + "."]
    return [*lines, ""]


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


def write_report(output_dir: str | os.PathLike, settings, records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Write `results.json`, `results.md`, `loss_curves.png`, `final_loss_vs_paper.png` and `quality_vs_cost.png`.

    Every file is written atomically, so an interrupted study always leaves a complete (if partial) report.

    Args:
        output_dir: the study folder.
        settings: the study's `StudySettings`.
        records: the finished runs' records, in study order.

    Returns:
        `records`.
    """
    output_dir = Path(output_dir)
    paper = load_paper_table(settings.paper_table) if settings.paper_table else {}
    pretrained = [r for r in records if r["variant"] != NO_PRETRAINING]
    summaries = summarize(pretrained)  # the "No pretraining" row has no losses: not in Table 1's comparison
    downstream = downstream_gains(summaries, [r for r in records if r["variant"] == NO_PRETRAINING])
    try:
        preparation = json.loads((output_dir / "preparation.json").read_text())
    except (OSError, ValueError):
        preparation = None
    accounting = time_accounting(records, preparation)
    marks = significance(summaries, paper)
    finetunes = bool(settings.glue_tasks)
    correlations = agreement(summaries, paper, downstream=finetunes) if paper else {}
    spread = seed_spread(summaries)
    planned = study_plan(settings)
    done = {(r["variant"], r["seed"]) for r in records}
    missing = [f"{v} (seed {s})" for v, s in planned if (v, s) not in done]

    selection = {k: getattr(settings, k) for k in SELECTION_KEYS}
    precision = precision_summary(records)
    _write_atomic(
        output_dir / "results.json",
        json.dumps(
            {
                "settings": {**dataclasses.asdict(settings), **selection},
                "runs": records,
                "summary": {n: dataclasses.asdict(s) for n, s in summaries.items()},
                "agreement": correlations,
                "seed_spread": spread,
                "downstream": downstream,
                "timing": accounting,
                "unfinished": missing,
                "precision": precision,
            },
            indent=2,
        )
        + "\n",
    )

    tokens = settings.train_batch_tokens * settings.max_train_steps
    family = FAMILIES[settings.family]
    lines = [
        "# Narang et al. 2021, Table 1, at small scale",
        "",
        f"{len(records)} of {len(planned)} runs finished ({len(summaries)} variants"
        f"{' and the no-pretraining row' if downstream else ''}, seeds {list(settings.seeds)}). "
        f"Every run: {family.loss} pretraining of the {family.name} for {settings.max_train_steps:,} steps of "
        f"{settings.train_batch_tokens:,} input tokens ({tokens:,} in total), early loss at step "
        f"{settings.max_train_steps // EARLY_FRACTION:,} (1/{EARLY_FRACTION} of training), "
        + (
            f"then full finetuning on {', '.join(TASK_TITLES.get(t, t) for t in settings.glue_tasks)} "
            f"({settings.glue_max_train_samples:,} training examples per task, {settings.glue_num_train_epochs} "
            "epoch(s))."
            if finetunes
            else "no finetuning (the study lists no GLUE tasks)."
        ),
        "",
        "Each variant's first row is this study (mean ± standard deviation over seeds), the second the paper's "
        "(Params, Ops: total pretraining FLOPs; Step/s on their TPUs"
        + ("; SGLUE in the GLUE column" if finetunes else "")
        + f"). Losses are held-out {family.loss} losses (nats per predicted token)"
        + ("; GLUE scores are dev-set metrics x 100 (a task with two metrics: their mean)" if finetunes else "")
        + '. "Better than vanilla": more than two standard deviations '
        f"of the vanilla runs below its loss{' or above its score' if finetunes else ''}; for the paper's rows, "
        "the spread its table "
        "reports (the vanilla early loss's) for both losses."
        + (
            f" Not in the paper's table (our row only, left out of the agreement with the paper): {', '.join(absent)}."
            if (absent := [n for n in summaries if n not in paper]) and paper
            else ""
        ),
        "",
        *(
            [
                f"Trained in {', '.join(precision['names'])} (`mixed_precision: {settings.mixed_precision}`) on "
                f"{'; '.join(precision['host_capability'])}.",
                "",
            ]
            if precision["names"]
            else []
        ),
        *_table(settings, summaries, paper, marks),
        "",
    ]
    if correlations:
        lines += [
            "## Agreement with the paper",
            "",
            "Spearman rank correlation between our column and the paper's over the variants run "
            "(percentile bootstrap over variants, 9,999 resamples).",
            "",
            "| column | Spearman ρ | 95% interval | variants |",
            "|---|---:|---|---:|",
            *[
                f"| {c} | {_num(v['rho'], 2)} | [{_num(v['low'], 2)}, {_num(v['high'], 2)}] | {v['variants']} |"
                for c, v in correlations.items()
            ],
            "",
        ]
    if spread is not None:
        lines += [
            "## Seed-to-seed spread",
            "",
            f"Standard deviation of the vanilla final loss over seeds: {_num(spread['vanilla_std'], 4)}; gap between "
            f"the vanilla model and the best GLU variant ({spread['best_glu']}): {_num(spread['gap'], 4)} "
            f"({_num(spread['gap_in_std'], 1)} standard deviations).",
            "",
        ]
    if downstream is not None:
        lines += _downstream_lines(settings, downstream)
    lines += _time_lines(accounting)
    if missing:
        lines += ["## Unfinished runs", "", ", ".join(missing), ""]
    lines += [
        "## Figures",
        "",
        "![validation loss against steps](loss_curves.png)",
        "![our final loss against the paper's](final_loss_vs_paper.png)",
        "![quality against parameters and FLOPs](quality_vs_cost.png)",
        "",
    ]
    _write_atomic(output_dir / "results.md", "\n".join(lines))

    plot_curves_by_name(
        {n: s.eval_losses for n, s in summaries.items()},
        output_dir / "loss_curves.png",
        title=f"held-out {family.loss} loss of the {family.name} (mean over seeds)",
        xlabel="step",
        ylabel="validation loss",
    )
    common = [n for n in summaries if n in paper]
    rho = correlations.get("Final loss", {}).get("rho", math.nan)
    plot_labelled_scatter(
        [
            {
                "title": f"final loss (Spearman ρ = {_num(rho, 2)})",
                "xlabel": "paper (T5-base scale)",
                "ylabel": "this study",
                "points": {
                    n: (paper[n].final_loss, summaries[n].final_loss, summaries[n].final_loss_std) for n in common
                },
            }
        ],
        output_dir / "final_loss_vs_paper.png",
    )
    panels = []
    for quality, key, std in (
        ("final loss", "final_loss", "final_loss_std"),
        *([("GLUE average", "glue_average", "glue_average_std")] if finetunes else []),
    ):
        for cost, attr, log in (("parameters", "parameters", True), ("FLOPs per run", "total_flops", True)):
            panels.append(
                {
                    "title": f"{quality} vs {cost}",
                    "xlabel": cost,
                    "ylabel": quality,
                    "log_x": log,
                    "points": {n: (getattr(s, attr), getattr(s, key), getattr(s, std)) for n, s in summaries.items()},
                }
            )
    plot_labelled_scatter(panels, output_dir / "quality_vs_cost.png", columns=2)
    return records


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
