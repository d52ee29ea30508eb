#!/usr/bin/env python
"""Turn a pretraining checkpoint (DeepSpeed ZeRO-1/2/3 included) into a plain `save_pretrained` folder.

Usage: `python recipes/consolidate_checkpoint.py OUTPUT_DIR/checkpoints/step_N CONSOLIDATED_DIR`
(no DeepSpeed launch and no GPU needed). See `hfzoo.pretraining.consolidate`.
"""

from hfzoo.pretraining.consolidate import main

if __name__ == "__main__":
    main()
