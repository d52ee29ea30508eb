"""The GLUE finetuning job: `hfzoo-finetune-glue` (`recipes/finetune_glue.py`, `python -m hfzoo.finetuning`).

- `glue.py`: the command line, model loading (full finetuning, LoRA or prefix tuning) and the run's setup.
- `loop.py`: the training and evaluation loop, its resume point and metrics.
- `outputs.py`: results, predictions, the adapter or model folder and its model card.
- `sweep.py`: a learning-rate sweep over tasks (`recipes/glue_sweep.py`).
- `adapters.py`: PEFT configs (LoRA target modules per token mixer, prefix tuning) and adapter loading.

The names below are the job's public API (the study finetunes through them).
"""

from .glue import cli, main, parse_glue_args

__all__ = ["cli", "main", "parse_glue_args"]
