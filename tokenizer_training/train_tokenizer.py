#!/usr/bin/env python
"""Train a byte-level BPE tokenizer: `python tokenizer_training/train_tokenizer.py ...` (= `hfzoo-train-tokenizer`).

See `hfzoo-train-tokenizer --help` and `hfzoo.pretraining.tokenizer`.
"""

from hfzoo.pretraining.tokenizer import main

if __name__ == "__main__":
    main()
