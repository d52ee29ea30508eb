"""The pretraining job: `hfzoo-pretrain` (`recipes/pretrain.py`, `python -m hfzoo.pretraining`) and its tools.

- `loop.py`: the run (`PretrainingRun`) and the training loop over the core (`hfzoo.training`).
- `arguments.py`: the command line and YAML config of `hfzoo-pretrain`.
- `evaluation.py`: held-out perplexity and a greedy sample (`hfzoo-evaluate-lm`), also run by the loop.
- `harness.py`, `lm_eval_tasks/`: lm-evaluation-harness tasks on local data (`hfzoo-evaluate-lm --lm_eval_tasks`).
- `tokenizer.py`: byte-level BPE tokenizer training (`hfzoo-train-tokenizer`), the job's first step.
- `consolidate.py`: a DeepSpeed ZeRO checkpoint to one `save_pretrained` folder.

The names below are the job's public API (the study runs pretraining through them).
"""

import importlib

#: Public name -> `module` of this package (or `module:attribute`) that defines it.
_EXPORTS = {
    "PretrainingRun": "loop",
    "build_pretrain_parser": "arguments",
    "check_block_size": "loop",
    "cli": "loop",
    "main": "loop",
    "pack_pretraining_data": "loop",
    "parse_pretrain_args": "arguments",
    "train_tokenizer": "tokenizer:main",
}

__all__ = [
    "PretrainingRun",
    "build_pretrain_parser",
    "check_block_size",
    "cli",
    "main",
    "pack_pretraining_data",
    "parse_pretrain_args",
    "train_tokenizer",
]


def __getattr__(name: str):
    """Import a public name on first use (so `python -m hfzoo.pretraining.<module>` runs that module only once)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module, _, attribute = _EXPORTS[name].partition(":")
    return getattr(importlib.import_module(f"{__name__}.{module}"), attribute or name)
