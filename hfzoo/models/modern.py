"""Today's modifications as study rows, in the format of Narang et al. 2021's Table 1 (`hfzoo.models.narang`).

Narang et al. 2021 asked whether the Transformer modifications of their time transfer (arXiv:2102.11972); these
rows ask the same of modifications in use in today's models (OLMo 2, Gemma 2, the modded-nanogpt GPT-2 speedrun),
each a switch of hfzoo's configs (docs/modifications.md, "Today's modifications") or of its pretraining recipe
(the Muon optimizer, docs/modifications.md, "Optimizer").

- `MODERN_ROWS`: row name -> the config fields that differ from the `narang-vanilla` baseline, as
  `TABLE_1_ROWS` (so `resolve_row(name, base, rows=STUDY_ROWS)` resolves either table's rows).
- `ROW_PRETRAIN_ARGS`: row name -> the pretraining-recipe arguments the row changes (`hfzoo-pretrain` flag
  names without `--`; True is a bare flag). A row that is not listed trains with the study's arguments.
- `STUDY_ROWS`: every row a study may name (Table 1's, then these), `row_pretrain_args(name)`.

None of these rows is in the paper's table: a study reports our figures for them and leaves them out of the
rank correlation with the paper (`hfzoo.study.report`).
"""

from __future__ import annotations

from typing import Any

from ..choices import choice_hint
from .narang import TABLE_1_ROWS

__all__ = ["MODERN_ROWS", "ROW_PRETRAIN_ARGS", "STUDY_ROWS", "row_pretrain_args"]

#: Gemma 2's caps (Gemma 2 Team 2024, §2): attention scores `50 tanh(s / 50)`, output logits `30 tanh(z / 30)`.
#: The published values, not caps tuned to bind at a small scale: the row asks whether the modification as
#: used in today's models transfers, and a cap is a guard against logit growth that binds only where logits
#: grow that large (a scaled dot-product score of 50, an output logit of 30).
_SOFTCAPPING = {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0}

#: Row name -> config changes to the `narang-vanilla` baseline (pre-LN, ReLU, T5 relative bias, AdamW).
MODERN_ROWS: dict[str, dict[str, Any]] = {
    # RMSNorm of each head's queries and keys, with a learned scale (Dehghani et al. 2023 §3.1; OLMo 2)
    "QK-norm": {"qk_norm": "rms_norm"},
    # relu(x)^2 in place of the baseline's ReLU, dense feed-forward of the same width (So et al. 2021, Primer §4)
    "Squared ReLU": {"hidden_act": "relu2"},
    "Logit soft-capping": dict(_SOFTCAPPING),
    # every self-attention after the first mixes in the first layer's values (Zhou et al. 2024, ResFormer §3)
    "Value residual": {"value_residual": True},
    # layer i < L // 2 feeds layer L - 1 - i through a learned scalar (modded-nanogpt; U-Net, Ronneberger 2015)
    "U-Net skips": {"unet_skips": True},
    # an optimizer row: the model is the baseline's, the pretraining arguments change (ROW_PRETRAIN_ARGS)
    "Muon": {},
    "All together": {
        "qk_norm": "rms_norm",
        "hidden_act": "relu2",
        **_SOFTCAPPING,
        "value_residual": True,
        "unet_skips": True,
    },
}

#: Muon (Jordan et al. 2024) for the hidden layers' matrices with its speedrun settings (`MuonSettings`'
#: defaults: learning rate 0.02, Nesterov momentum 0.95, 5 Newton-Schulz steps); embeddings, norms and the
#: rest keep AdamW with the study's learning rate. A study's `pretrain_args` may set `muon_learning_rate` etc.
#: only when every row uses Muon (the recipe refuses `--muon_*` without `--optim muon`).
_MUON = {"optim": "muon"}

#: Row name -> pretraining-recipe arguments it changes (flag names without `--`), on top of the study's.
ROW_PRETRAIN_ARGS: dict[str, dict[str, Any]] = {
    "Muon": dict(_MUON),
    "All together": dict(_MUON),
}

#: Every row a study may name: Narang et al.'s Table 1, then today's modifications.
STUDY_ROWS: dict[str, dict[str, Any]] = {**TABLE_1_ROWS, **MODERN_ROWS}
assert len(STUDY_ROWS) == len(TABLE_1_ROWS) + len(MODERN_ROWS), "a modern row reuses a Table 1 name"
assert set(ROW_PRETRAIN_ARGS) <= set(STUDY_ROWS), "ROW_PRETRAIN_ARGS names an unknown row"


def row_pretrain_args(name: str) -> dict[str, Any]:
    """The pretraining-recipe arguments row `name` changes (`{}` for a row that only changes the config).

    Args:
        name: a row of `STUDY_ROWS`.

    Returns:
        `{flag name without "--": value}` (a copy).

    Raises:
        ValueError: an unknown row (the message lists the known ones).
    """
    if name not in STUDY_ROWS:
        raise ValueError(f"unknown row {name!r}; {choice_hint(name, STUDY_ROWS, 'hfzoo.models.modern.STUDY_ROWS')}")
    return dict(ROW_PRETRAIN_ARGS.get(name, {}))
