#!/usr/bin/env python
"""Finetune one checkpoint on several GLUE tasks with one method and write a results table.

    python recipes/glue_sweep.py --model_name_or_path CKPT --data_dir ../shared/data/glue \
        --tasks stsb mrpc sst2 --peft lora --output_dir runs/minilm-lora -- --learning_rate 1e-3

See `hfzoo.finetuning.sweep`.
"""

from hfzoo.finetuning.sweep import cli

if __name__ == "__main__":
    cli()
