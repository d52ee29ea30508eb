#!/usr/bin/env python
"""Finetune a model on a GLUE task: `accelerate launch recipes/finetune_glue.py ...` or `python ...` alike.

Arguments follow transformers' `run_glue_no_trainer.py`, plus `--data_dir` (GLUE layout) and
`--peft lora|prefix|none` with its options. See `python recipes/finetune_glue.py --help` and docs/glue.md.
"""

from hfzoo.finetuning.glue import cli

if __name__ == "__main__":
    cli()
