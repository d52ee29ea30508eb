"""Evaluation metrics shipped with hfzoo as local `evaluate` modules (no hub access needed).

`load_glue_metric(task)` returns an `evaluate.Metric` computing GLUE's official metric(s) for a task,
loaded from the module file in `hfzoo/metrics/glue/` (the hub's `evaluate.load("glue", task)` fetches
its code from the network, which may be unreachable).
"""

from __future__ import annotations

from pathlib import Path

GLUE_METRIC_PATH = Path(__file__).parent / "glue" / "glue.py"

__all__ = ["GLUE_METRIC_PATH", "load_glue_metric"]


def load_glue_metric(task: str):
    """Load the GLUE metric for `task` through `evaluate.load` from hfzoo's local module.

    Args:
        task: a GLUE task name (`cola`, `sst2`, `mrpc`, `stsb`, `qqp`, `mnli`, `mnli_matched`,
            `mnli_mismatched`, `qnli`, `rte`, `wnli`, `hans`).

    Returns:
        An `evaluate.Metric`; `compute(predictions=..., references=...)` returns a dict of floats
        (`matthews_correlation`, `accuracy`, `f1`, `pearson`, `spearmanr` as the task has).

    Raises:
        KeyError: (from the module) an unknown task name; the message lists the valid ones.
    """
    import evaluate

    return evaluate.load(str(GLUE_METRIC_PATH), task)
