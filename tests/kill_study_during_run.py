"""Run `hfzoo-study` and SIGKILL it in the middle of a pretraining run (test helper).

Usage: python tests/kill_study_during_run.py N STUDY_ARGS...  The process kills itself with SIGKILL at the
N-th optimizer step counted over the whole study (across runs), i.e. in the middle of some run's
pretraining, leaving whatever that run had written so far.
"""

import os
import signal
import sys

from hfzoo.training import pretraining
from hfzoo.training.study import main

_kill_at = int(sys.argv[1])
_original_step = pretraining.accumulation_step
_steps = []


def _step_then_die(*args, **kwargs):
    _steps.append(1)
    if len(_steps) == _kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    return _original_step(*args, **kwargs)


pretraining.accumulation_step = _step_then_die
main(sys.argv[2:])
