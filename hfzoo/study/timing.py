"""Where a study's wall time goes: a run's parts (`time_breakdown`) and the whole study's (`time_accounting`).

The runs record their parts as they finish; the report sums them over the runs.
"""

from __future__ import annotations

import math
from typing import Any

#: Parts of a run's wall time in `timing["seconds"]` (and `timing["fractions"]`), in the order they happen.
TIME_PARTS = ("train_steps", "pretrain_evaluation", "pretrain_other", "finetuning", "other")


def time_breakdown(timing: dict[str, float]) -> dict[str, dict[str, float]]:
    """Split a run's wall time (`run_seconds`) into its parts, as seconds and as fractions of the whole.

    Parts (`TIME_PARTS`): `train_steps` (the pretraining loop's optimizer steps, `train_step_seconds`),
    `pretrain_evaluation` (its validation passes), `pretrain_other` (the rest of the pretraining stage:
    process start under a launcher, data loading, model build, compile, checkpoint and final save),
    `finetuning` (the GLUE stages: their data, training, evaluation and saves) and `other` (the run's own
    work: configs, tokenizer, parameter count, the record). Stages reused from an earlier session count zero
    (their time is not in this session's wall time). The parts sum to `run_seconds` exactly.

    Args:
        timing: a record's `timing` with `run_seconds` and whichever of `pretrain_seconds`,
            `train_step_seconds`, `pretrain_eval_seconds`, `glue_seconds` this session measured.

    Returns:
        `{"seconds": {part: s}, "fractions": {part: s / run_seconds}}`.
    """
    total = timing["run_seconds"]

    def get(key: str) -> float:
        value = timing.get(key, 0.0)
        return 0.0 if value is None or not math.isfinite(value) else float(value)

    pretrain = get("pretrain_seconds")
    steps, evaluation = get("train_step_seconds"), get("pretrain_eval_seconds")
    seconds = {
        "train_steps": steps,
        "pretrain_evaluation": evaluation,
        "pretrain_other": pretrain - steps - evaluation,
        "finetuning": get("glue_seconds"),
        "other": total - pretrain - get("glue_seconds"),
    }
    return {"seconds": seconds, "fractions": {k: v / total if total > 0 else math.nan for k, v in seconds.items()}}


def _timing_value(record: dict[str, Any], *keys: str) -> float:
    value: Any = record.get("timing", {})
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else math.nan


def time_accounting(records: list[dict[str, Any]], preparation: dict[str, Any] | None) -> dict[str, Any]:
    """Where the study's wall time went: per run and over all runs (summed run wall times).

    Args:
        records: the finished runs (each `timing` with `run_seconds` and `seconds` per part; see
            `time_breakdown`).
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
