"""The study's fixed measurement protocol, shared by the runner (`runner.py`) and the report (`report.py`).

Narang et al. 2021 (§3) measure every modification the same way: the pretraining loss early in training and
at its end, and the fine-tuned scores, each compared with the vanilla Transformer's.
"""

from __future__ import annotations

import dataclasses

#: The early loss is measured at 1/8 of training: Narang et al.'s 65,536 of 524,288 steps.
EARLY_FRACTION = 8
#: Row the significance test and the seed-spread comparison refer to.
BASELINE = "Vanilla Transformer"
#: Settings that select runs rather than change them: an output folder may be filled a subset at a time.
SELECTION_KEYS = ("variants", "seeds")


@dataclasses.dataclass(frozen=True)
class StudyFamily:
    """How a study pretrains one model family (the study-file key `family`, `--family`).

    Attributes:
        name: the family (`encoder-decoder`, `decoder`, `encoder`): also the tokenizer's special-token set
            (`hfzoo.tokenization.FAMILY_SPECIAL_TOKENS`).
        model_type: the hfzoo config's `model_type`.
        objective: the pretraining recipe's `--objective` (`hfzoo.training.objectives.OBJECTIVES`).
        loss: what the held-out loss is, in words, for the report.
    """

    name: str
    model_type: str
    objective: str
    loss: str


#: The families a study can pretrain its rows in. Narang et al. 2021 study the encoder-decoder with T5 span
#: corruption; the same rows as a decoder-only causal LM or an encoder-only masked LM (BERT's 80/10/10, the
#: study's `noise_density` of tokens selected) ask whether a modification's effect transfers across families.
FAMILIES = {
    "encoder-decoder": StudyFamily("encoder-decoder", "hfzoo_encoder_decoder", "span", "span-corruption"),
    "decoder": StudyFamily("decoder", "hfzoo_decoder", "clm", "next-token (causal LM)"),
    "encoder": StudyFamily("encoder", "hfzoo_encoder", "mlm", "masked-LM"),
}
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
