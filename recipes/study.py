#!/usr/bin/env python
"""Narang et al. 2021's modification study at small scale: `python recipes/study.py --study FILE --output_dir DIR`.

Pretrains every variant of the study file with span corruption, finetunes each on GLUE, and writes
results.json, results.md (Table 1's layout beside the paper's rows) and plots. See `docs/study.md`.
"""

from hfzoo.study.runner import main

if __name__ == "__main__":
    main()
