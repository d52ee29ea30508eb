"""The study's fixed measurement protocol, shared by the runner (`runner.py`) and the report (`report.py`).

Narang et al. 2021 (§3) measure every modification the same way: the pretraining loss early in training and
at its end, and the fine-tuned scores, each compared with the vanilla Transformer's.
"""

from __future__ import annotations

#: The early loss is measured at 1/8 of training: Narang et al.'s 65,536 of 524,288 steps.
EARLY_FRACTION = 8
#: Row the significance test and the seed-spread comparison refer to.
BASELINE = "Vanilla Transformer"
#: Settings that select runs rather than change them: an output folder may be filled a subset at a time.
SELECTION_KEYS = ("variants", "seeds")
