"""Run `hfzoo-study` and send it a signal in the middle of a pretraining run (test helper).

Usage: python tests/helpers/kill_study_during_run.py SIGNAL N STUDY_ARGS...  The process sends itself SIGNAL
(e.g. SIGKILL, SIGTERM) at the N-th optimizer step counted over the whole study (across runs), i.e. in the
middle of some run's pretraining: SIGKILL leaves whatever that run had written so far, SIGTERM lets the
pretraining recipe finish the step and write its checkpoint.
"""

import os
import signal
import sys

from hfzoo.pretraining import loop as pretraining
from hfzoo.study.runner import main

_signal = signal.Signals[sys.argv[1]]
_kill_at = int(sys.argv[2])
_original_step = pretraining.accumulation_step
_steps = []


def _step_then_die(*args, **kwargs):
    _steps.append(1)
    if len(_steps) == _kill_at:
        os.kill(os.getpid(), _signal)
    return _original_step(*args, **kwargs)


pretraining.accumulation_step = _step_then_die
main(sys.argv[3:])
