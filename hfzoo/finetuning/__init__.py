"""The GLUE finetuning job: `hfzoo-finetune-glue` (`recipes/finetune_glue.py`, `python -m hfzoo.finetuning`).

- `glue.py`: the command line, model loading (full finetuning, LoRA or prefix tuning) and the run's setup.
- `loop.py`: the training and evaluation loop, its resume point and metrics.
- `outputs.py`: results, predictions, the adapter or model folder and its model card.
- `sweep.py`: a learning-rate sweep over tasks (`recipes/glue_sweep.py`).
- `adapters.py`: PEFT configs (LoRA target modules per token mixer, prefix tuning) and adapter loading.

The names below are the job's public API (the study finetunes through them).
"""

import importlib

#: Public name -> `module` of this package (or `module:attribute`) that defines it.
_EXPORTS = {
    "cli": "glue",
    "main": "glue",
    "parse_glue_args": "glue",
    "resolve_max_length": "glue",
}

__all__ = ["cli", "main", "parse_glue_args", "resolve_max_length"]


def __getattr__(name: str):
    """Import a public name on first use (so `python -m hfzoo.finetuning.<module>` runs that module only once)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, _, attribute = _EXPORTS[name].partition(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), attribute or name)
