"""Run the pretraining recipe and SIGKILL it in the middle of writing its second checkpoint (test helper).

Usage: python tests/helpers/kill_during_save.py RECIPE_ARGS...  The first checkpoint is saved normally; during the
second, once accelerate has written its files into `step_N.tmp`, the model file is cut to half its size
(a torn write) and the process kills itself with SIGKILL, before the checkpoint is completed and renamed.
"""

import os
import signal
import sys
from pathlib import Path

from accelerate import Accelerator

from hfzoo.pretraining.loop import main

_original_save_state = Accelerator.save_state
_calls = []


def _save_state_then_die(self, output_dir=None, **kwargs):
    _calls.append(output_dir)
    result = _original_save_state(self, output_dir, **kwargs)
    if len(_calls) == 2:
        model_file = Path(output_dir) / "model.safetensors"
        size = model_file.stat().st_size
        with open(model_file, "r+b") as f:
            f.truncate(size // 2)
        os.kill(os.getpid(), signal.SIGKILL)
    return result


Accelerator.save_state = _save_state_then_die
main(sys.argv[1:])
