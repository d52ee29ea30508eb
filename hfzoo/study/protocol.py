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
#: The downstream baseline every study adds once per seed: the vanilla architecture finetuned from its random
#: initialisation (no pretraining), with the same finetuning budget as the variants.
NO_PRETRAINING = "No pretraining"


def study_plan(settings) -> list[tuple[str, int]]:
    """The study's runs in order: every (variant, seed), then the "No pretraining" row once per seed.

    The "No pretraining" runs are planned only when the study finetunes (`glue_tasks` not empty).

    Args:
        settings: a `StudySettings` (its `variants`, `seeds` and `glue_tasks`).

    Returns:
        `[(row name, seed), ...]`.
    """
    plan = [(variant, seed) for variant in settings.variants for seed in settings.seeds]
    if settings.glue_tasks:
        plan += [(NO_PRETRAINING, seed) for seed in settings.seeds]
    return plan
