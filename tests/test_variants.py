"""Every value of every architecture field, in every family it applies to (see `variant_checks.py`).

Each row of `VARIANTS` is `(overrides, families, backends)`; a test runs `check_variant` for each
row x family. A new modification adds its rows here (one per value); the checks come for free.
"""

from __future__ import annotations

import pytest
from transformers.activations import ACT2FN
from variant_checks import FAMILIES, check_variant

from hfzoo.modules.experts import ROUTERS
from hfzoo.modules.feed_forward import ACTIVATIONS
from hfzoo.modules.layer import NORM_POSITIONS
from hfzoo.modules.norms import NORM_CLASSES
from hfzoo.modules.positions import POSITION_ATTENTION_BACKENDS, POSITION_EMBEDDING_TYPES
from hfzoo.modules.stack import BLOCK_SHARING

ALL = tuple(FAMILIES)
BOTH = ("eager", "sdpa")


def backends_of(kind: str) -> tuple[str, ...]:
    """The CPU-testable backends (eager, SDPA) a position scheme supports."""
    return tuple(b for b in BOTH if b in POSITION_ATTENTION_BACKENDS[kind])


VARIANTS: list[tuple[dict, tuple[str, ...], tuple[str, ...]]] = [
    ({}, ALL, BOTH),
    # ---- feed-forward
    *[
        ({"hidden_act": act}, ALL, BOTH)
        for act in ("relu", "gelu", "silu", "swish", "gelu_new", "elu", "selu", "sigmoid", "softplus")
    ],
    ({"mlp_bias": False}, ALL, BOTH),
    # GLU, ReGLU, GeGLU, SwiGLU, LiGLU (Shazeer 2020)
    *[({"gated_mlp": True, "hidden_act": act}, ALL, BOTH) for act in ("sigmoid", "relu", "gelu", "silu", "linear")],
    # mixture of experts: top-k (Shazeer et al. 2017 / GShard), Switch (Fedus et al. 2021) with token dropping
    ({"num_experts": 4, "num_experts_per_tok": 2, "router_type": "top_k"}, ALL, BOTH),
    ({"num_experts": 3, "num_experts_per_tok": 1, "gated_mlp": True}, ALL, BOTH),
    ({"num_experts": 4, "router_type": "switch", "expert_capacity_factor": 0.5, "moe_layer_interval": 2}, ALL, BOTH),
    # ---- normalization
    *[({"norm_type": norm}, ALL, BOTH) for norm in NORM_CLASSES],
    *[({"norm_position": position}, ALL, BOTH) for position in NORM_POSITIONS],
    ({"norm_position": "sandwich", "norm_type": "rms_norm"}, ALL, BOTH),
    # ReZero alone, + LayerNorm, + RMSNorm (Narang et al. 2021's three rows)
    *[({"rezero": True, "norm_type": norm}, ALL, BOTH) for norm in NORM_CLASSES],
    ({"fixup_init": True, "norm_type": "none"}, ALL, BOTH),
    ({"embedding_norm": True}, ALL, BOTH),
    # ---- positions
    *[({"position_embedding_type": kind}, ALL, backends_of(kind)) for kind in POSITION_EMBEDDING_TYPES],
    ({"position_embedding_type": "relative_attention_bias", "share_relative_attention_bias": False}, ALL, BOTH),
    # few buckets and a short max distance, so 11 tokens reach the logarithmic and the last bucket
    (
        {
            "position_embedding_type": "relative_attention_bias",
            "relative_attention_num_buckets": 8,
            "relative_attention_max_distance": 6,
        },
        ALL,
        BOTH,
    ),
    ({"position_embedding_type": "shaw", "max_relative_positions": 2}, ALL, ("eager",)),  # clipping in reach
    ({"position_embedding_type": "rotary", "rope_theta": 100.0}, ALL, BOTH),
    ({"position_embedding_type": "alibi", "num_attention_heads": 8, "head_dim": 4}, ALL, BOTH),  # 8 slopes
    ({"position_embedding_type": "alibi", "num_attention_heads": 3, "head_dim": 8}, ALL, BOTH),  # not a power of 2
    ({"scale_attention_scores": False}, ALL, BOTH),
    ({"scale_lm_head_input": True}, ALL, BOTH),
    # ---- attention shape
    ({"head_dim": 12}, ALL, BOTH),
    ({"attention_bias": False}, ALL, BOTH),
    # ---- embeddings
    ({"tie_word_embeddings": False}, ALL, BOTH),
    ({"embedding_size": 16}, ALL, BOTH),
    ({"embedding_size": 16, "tie_word_embeddings": False}, ALL, BOTH),
    ({"scale_embeddings": True}, ALL, BOTH),
    *[
        ({"tie_encoder_decoder_embeddings": False, "tie_word_embeddings": tied}, ("encoder-decoder",), BOTH)
        for tied in (True, False)
    ],
    ({"tie_encoder_decoder_embeddings": False, "embedding_size": 16}, ("encoder-decoder",), BOTH),
    # ---- parameter sharing
    *[
        ({"block_sharing": choice}, ALL if choice in ("none", "all") else ("encoder-decoder",), BOTH)
        for choice in BLOCK_SHARING
    ],
    # ---- output
    ({"num_softmaxes": 3}, ALL, BOTH),
    ({"num_softmaxes": 3, "embedding_size": 16}, ALL, BOTH),
]


def _cases():
    for overrides, families, backends in VARIANTS:
        for family in families:
            label = ",".join(f"{k}={v}" for k, v in overrides.items()) or "defaults"
            yield pytest.param(family, overrides, backends, id=f"{family}:{label}")


@pytest.mark.parametrize("family, overrides, backends", list(_cases()))
def test_variant(family, overrides, backends, tmp_path):
    check_variant(family, overrides, tmp_path, backends)


def test_every_registered_choice_has_a_row():
    """A registry entry without a row in `VARIANTS` would be an untested option."""
    covered = {(k, v) for overrides, _, _ in VARIANTS for k, v in overrides.items()}
    for field, choices in (
        ("norm_type", NORM_CLASSES),
        ("norm_position", NORM_POSITIONS),
        ("hidden_act", [name for name in ACTIVATIONS if name not in ACT2FN]),  # hfzoo's own activations
        ("router_type", ROUTERS),
        ("position_embedding_type", POSITION_EMBEDDING_TYPES),
        ("block_sharing", BLOCK_SHARING),
    ):
        missing = [c for c in choices if (field, c) not in covered]
        assert not missing, f"{field} values without a VARIANTS row: {missing}"
