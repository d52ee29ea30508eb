#!/usr/bin/env python
"""Evaluate a saved causal LM on text files and print a generated sample: `python recipes/evaluate_lm.py ...`.

The same as the console script `hfzoo-evaluate-lm`; see `hfzoo-evaluate-lm --help` and `hfzoo.pretraining.evaluation`.
"""

from hfzoo.pretraining.evaluation import main

if __name__ == "__main__":
    main()
