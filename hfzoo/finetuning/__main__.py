"""`python -m hfzoo.finetuning ARGS`: the same command as `hfzoo-finetune-glue ARGS`."""

from . import cli

cli()
