"""The study's report: `results.json`, `results.md` in Table 1's layout beside the paper's rows, and the plots.

`write_report(output_dir, settings, records)` aggregates the runs of `hfzoo.study.runner` by variant
(`hfzoo.study.summary`: means and spreads over seeds, significance against the vanilla model, the Spearman
rank correlation of our columns with the paper's), writes them as JSON and as Markdown tables
(`hfzoo.study.tables`) and draws the validation-loss curves, our final loss against the paper's, and quality
against parameters and FLOPs (`hfzoo.training.plots`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any

from ..models.narang import load_paper_table
from ..outputs import write_text_atomic
from ..training.plots import plot_curves_by_name, plot_labelled_scatter
from .protocol import EARLY_FRACTION, FAMILIES, NO_PRETRAINING, SELECTION_KEYS, study_plan
from .summary import agreement, downstream_gains, precision_summary, seed_spread, significance, summarize
from .tables import TASK_TITLES, _downstream_lines, _num, _table, _time_lines
from .timing import time_accounting

__all__ = ["write_report"]


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
    write_text_atomic(
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
    write_text_atomic(output_dir / "results.md", "\n".join(lines))

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
