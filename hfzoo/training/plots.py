"""Figures written by the recipes: the training curves of a run and the bar chart of a GLUE sweep.

Figures are drawn on matplotlib `Figure` objects and rendered with the Agg canvas, so no display (and no
pyplot state) is needed. Each PNG carries what it plots as JSON in a text chunk (`hfzoo:curves` /
`hfzoo:bars`; read it with `PIL.Image.open(path).text`), so the figure can be checked without looking
at it. Files are written atomically (a temporary file renamed into place).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from ..outputs import replaced_atomically

#: Panel title -> the record key it plots against `step` (records of the recipes' `train_history.json`).
TRAINING_CURVES = {
    "training loss": "train_loss",
    "validation loss": "eval_loss",
    "learning rate": "learning_rate",
    "tokens/s": "tokens_per_second",
}


def _points(records: list[dict[str, Any]], key: str) -> list[tuple[float, float]]:
    return [
        (float(r["step"]), float(r[key]))
        for r in records
        if isinstance(r.get(key), (int, float)) and math.isfinite(r[key]) and "step" in r
    ]


def _save(figure: Figure, path: Path, metadata: dict[str, str]) -> Path:
    path = Path(path)
    with replaced_atomically(path) as tmp:
        figure.savefig(tmp, format="png", dpi=100, metadata={"Software": "hfzoo", **metadata})
    return path


def plot_training_curves(
    log_history: list[dict[str, Any]],
    eval_history: list[dict[str, Any]],
    path: str | os.PathLike,
    title: str | None = None,
) -> Path:
    """Draw training loss, validation loss, learning rate and tokens/s against optimizer steps, one panel each.

    Args:
        log_history: training records with `step` and any of `train_loss` (nats per predicted token),
            `learning_rate`, `tokens_per_second` (as `train_history.json`'s `log_history`).
        eval_history: validation records with `step` and `eval_loss` (step 0: before training).
        path: the PNG file to write (e.g. `<output_dir>/training_curves.png`).
        title: the figure's title (default: none).

    Returns:
        `path`. Its `hfzoo:curves` text chunk holds `{panel title: [[step, value], ...]}` for the panels of
        `TRAINING_CURVES`; a panel without records says "not recorded".
    """
    # a fixed layout: every run writes this figure, and the constrained layout engine doubled its drawing time
    figure = Figure(figsize=(11, 7))
    figure.subplots_adjust(left=0.07, right=0.98, bottom=0.08, top=0.9 if title else 0.95, wspace=0.22, hspace=0.35)
    if title:
        figure.suptitle(title)
    curves = {}
    for axes, (name, key) in zip(figure.subplots(2, 2).flat, TRAINING_CURVES.items()):
        points = _points(eval_history if key == "eval_loss" else log_history, key)
        curves[name] = [list(p) for p in points]
        axes.set_title(name)
        axes.set_xlabel("step")
        axes.grid(alpha=0.3)
        if points:
            steps, values = zip(*points)
            axes.plot(steps, values, marker="o" if len(points) <= 30 else None, markersize=3)
        else:
            axes.text(0.5, 0.5, "not recorded", ha="center", va="center", transform=axes.transAxes)
    return _save(figure, Path(path), {"Title": title or "training curves", "hfzoo:curves": json.dumps(curves)})


def plot_results_bars(values: dict[str, float], path: str | os.PathLike, title: str | None = None) -> Path:
    """Draw a horizontal bar chart of named results (e.g. one bar per GLUE task and metric).

    Args:
        values: `{label: value}`, drawn top to bottom in this order, each bar annotated with its value.
        path: the PNG file to write.
        title: the chart's title (default: none).

    Returns:
        `path`. Its `hfzoo:bars` text chunk holds `values`.
    """
    labels, numbers = list(values), [float(v) for v in values.values()]
    figure = Figure(figsize=(8, 1.2 + 0.45 * max(1, len(labels))), layout="constrained")
    axes = figure.subplots()
    positions = range(len(labels))
    axes.barh(positions, numbers)
    axes.set_yticks(list(positions), labels)
    axes.invert_yaxis()
    axes.grid(axis="x", alpha=0.3)
    for y, number in zip(positions, numbers):
        axes.annotate(f"{number:.3f}", (number, y), xytext=(3, 0), textcoords="offset points", va="center")
    if title:
        axes.set_title(title)
    return _save(figure, Path(path), {"Title": title or "results", "hfzoo:bars": json.dumps(values)})


def plot_curves_by_name(
    curves: dict[str, list[list[float]]],
    path: str | os.PathLike,
    title: str | None = None,
    xlabel: str = "step",
    ylabel: str = "value",
) -> Path:
    """Draw one line per name on shared axes (e.g. the validation loss of each variant of a study).

    Args:
        curves: `{name: [[x, y], ...]}`; non-finite points are left out.
        path: the PNG file to write.
        title: the figure's title (default: none).
        xlabel: the x axis label.
        ylabel: the y axis label.

    Returns:
        `path`. Its `hfzoo:curves` text chunk holds `{name: [[x, y], ...]}` as drawn.
    """
    figure = Figure(figsize=(10, 6), layout="constrained")
    axes = figure.subplots()
    drawn = {}
    for name, points in curves.items():
        points = [(float(x), float(y)) for x, y in points if math.isfinite(x) and math.isfinite(y)]
        drawn[name] = [list(p) for p in points]
        if points:
            xs, ys = zip(*points)
            axes.plot(xs, ys, marker="o", markersize=3, label=name)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(alpha=0.3)
    if drawn:
        axes.legend(fontsize="small", ncol=2)
    if title:
        axes.set_title(title)
    return _save(figure, Path(path), {"Title": title or "curves", "hfzoo:curves": json.dumps(drawn)})


def plot_labelled_scatter(panels: list[dict[str, Any]], path: str | os.PathLike, columns: int = 1) -> Path:
    """Draw labelled points with vertical error bars, one panel per entry (e.g. our loss against the paper's).

    Args:
        panels: each `{"title", "xlabel", "ylabel", "points": {label: (x, y, y_std)}}`, optionally
            `"log_x": True`; a non-finite `y_std` draws no error bar, non-finite x or y no point.
        path: the PNG file to write.
        columns: panels per row.

    Returns:
        `path`. Its `hfzoo:scatter` text chunk holds `[{title: {label: [x, y, y_std]}}, ...]` as drawn.
    """
    rows = max(1, math.ceil(len(panels) / columns))
    figure = Figure(figsize=(7 * columns, 5.5 * rows), layout="constrained")
    grid = figure.subplots(rows, columns, squeeze=False).flat
    drawn = []
    for axes, panel in zip(grid, panels):
        points = {
            label: (float(x), float(y), float(std))
            for label, (x, y, std) in panel["points"].items()
            if math.isfinite(x) and math.isfinite(y)
        }
        drawn.append({panel["title"]: {label: list(p) for label, p in points.items()}})
        for label, (x, y, std) in points.items():
            axes.errorbar(x, y, yerr=std if math.isfinite(std) else None, fmt="o", capsize=3, markersize=4)
            axes.annotate(label, (x, y), xytext=(4, 3), textcoords="offset points", fontsize=7)
        if panel.get("log_x") and points and min(p[0] for p in points.values()) > 0:
            axes.set_xscale("log")
        if not points:
            axes.text(0.5, 0.5, "no data", ha="center", va="center", transform=axes.transAxes)
        axes.set_title(panel["title"])
        axes.set_xlabel(panel["xlabel"])
        axes.set_ylabel(panel["ylabel"])
        axes.grid(alpha=0.3)
    return _save(figure, Path(path), {"Title": panels[0]["title"] if panels else "scatter",
                                      "hfzoo:scatter": json.dumps(drawn)})  # fmt: skip
