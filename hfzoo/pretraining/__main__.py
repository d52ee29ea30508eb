"""`python -m hfzoo.pretraining ARGS`: the same command as `hfzoo-pretrain ARGS`."""

from . import cli

cli()
