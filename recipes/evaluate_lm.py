#!/usr/bin/env python
"""Evaluate a saved causal LM on text files and print a generated sample: `python recipes/evaluate_lm.py ...`.

The same as the console script `hfzoo-evaluate-lm`; see `hfzoo-evaluate-lm --help` and `hfzoo.training.evaluation`.
"""

from hfzoo.training.evaluation import main

if __name__ == "__main__":
    main()
