#!/usr/bin/env python
"""Pretrain an hfzoo model on text: `accelerate launch recipes/pretrain.py ...` or `python recipes/pretrain.py ...`.

Arguments follow transformers' `run_clm_no_trainer.py`; `--config recipes/configs/X.yaml` supplies
defaults that flags override. See `python recipes/pretrain.py --help` and the README.
"""

from hfzoo.pretraining.loop import cli

if __name__ == "__main__":
    cli()
