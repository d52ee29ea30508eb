"""`python -m hfzoo.study ARGS`: the same command as `hfzoo-study ARGS`."""

from . import main

main()
