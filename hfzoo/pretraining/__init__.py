"""The pretraining job: `hfzoo-pretrain` (`recipes/pretrain.py`, `python -m hfzoo.pretraining`) and its tools.

- `loop.py`: the run (`PretrainingRun`) and the training loop over the core (`hfzoo.training`).
- `arguments.py`: the command line and YAML config of `hfzoo-pretrain`.
- `evaluation.py`: held-out perplexity and a greedy sample (`hfzoo-evaluate-lm`), also run by the loop.
- `tokenizer.py`: byte-level BPE tokenizer training (`hfzoo-train-tokenizer`), the job's first step.
- `consolidate.py`: a DeepSpeed ZeRO checkpoint to one `save_pretrained` folder.

The names below are the job's public API (the study runs pretraining through them).
"""

from .arguments import build_pretrain_parser, parse_pretrain_args
from .loop import PretrainingRun, cli, main
from .tokenizer import main as train_tokenizer

__all__ = ["PretrainingRun", "build_pretrain_parser", "cli", "main", "parse_pretrain_args", "train_tokenizer"]
