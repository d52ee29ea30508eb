"""The Markdown of `results.md`: Table 1 beside the paper's rows, the downstream gains and the time table.

Numbers are formatted here (`_si`, `_num`, `_pm`, ...): a value that is missing or not finite shows as "–".
"""

from __future__ import annotations

import math
from typing import Any

from ..models.narang import PaperRow
from .protocol import BASELINE, NO_PRETRAINING
from .summary import VariantSummary

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


#: Column titles of the time table, by part of `hfzoo.study.timing.TIME_PARTS`.
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
