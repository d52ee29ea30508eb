"""Parameter counts of the `narang-vanilla` preset and its Table 1 variants against Narang et al. 2021.

Each row instantiates the real `HfzooEncoderDecoderForConditionalGeneration` on the `meta` device (no
memory, no initialisation) and counts unique parameters (tied tensors once). The baseline must be within
1% of the paper's 223M, the variant rows within 2% of their Params column
(`narang2021_table1_relative_attention.tsv` in the shared reference folder). `test_print_table` prints
hfzoo's count, the paper's, and their ratio for every row.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch
from conftest import shared_data_dir

from hfzoo import HfzooEncoderDecoderConfig, HfzooEncoderDecoderForConditionalGeneration
from hfzoo.models.presets import PRESETS

REFERENCE_DIR = Path(os.environ.get("HFZOO_REFERENCE_DIR", shared_data_dir().parent / "reference"))
TABLE_1 = REFERENCE_DIR / "narang2021_table1_relative_attention.tsv"

GLU = {"GLU": "sigmoid", "GeGLU": "gelu", "ReGLU": "relu", "SwiGLU": "silu", "LiGLU": "linear"}
DEPTH = {24: (1536, 6), 18: (2048, 8), 8: (4608, 18), 6: (6144, 24)}

#: Table 1 row name -> config overrides on top of `narang-vanilla`. Ties are (encoder/decoder input,
#: decoder input/output); the block-sharing rows use an untied output matrix, as their counts show
#: (65M = shared layers + two 24.7M vocabulary matrices), and "+ Factorized & shared" ties it again.
ROWS: dict[str, dict] = {
    "Vanilla Transformer": {},
    **{name: {"gated_mlp": True, "hidden_act": act, "intermediate_size": 2048} for name, act in GLU.items()},
    **{
        f"{layers} layers, $d_{{ff}} = {d_ff}, H = {heads}$": {
            "num_hidden_layers": layers,
            "num_decoder_layers": layers,
            "intermediate_size": d_ff,
            "num_attention_heads": heads,
        }
        for layers, (d_ff, heads) in DEPTH.items()
    },
    "Block sharing": {"block_sharing": "all", "tie_word_embeddings": False},
    "+ Factorized embeddings": {"block_sharing": "all", "tie_word_embeddings": False, "embedding_size": 128},
    "+ Factorized & shared embeddings": {"block_sharing": "all", "embedding_size": 128},
    "Encoder only block sharing": {"block_sharing": "encoder", "tie_word_embeddings": False},
    "Decoder only block sharing": {"block_sharing": "decoder", "tie_word_embeddings": False},
    "Factorized Embedding": {"embedding_size": 128, "tie_word_embeddings": False},
    "Factorized & shared embeddings": {"embedding_size": 128},
    "Tied encoder/decoder input embeddings": {"tie_word_embeddings": False},
    "Tied decoder input and output embeddings": {"tie_encoder_decoder_embeddings": False},
    "Untied embeddings": {"tie_encoder_decoder_embeddings": False, "tie_word_embeddings": False},
    "Mixture of softmaxes": {"num_softmaxes": 15},
}

FIELDS = {field.name for field in dataclasses.fields(HfzooEncoderDecoderConfig)}


def paper_params() -> dict[str, float]:
    """Row name -> the paper's parameter count (from the Params column, e.g. "223M")."""
    if not TABLE_1.is_file():
        pytest.skip(f"reference table not found at {TABLE_1} (set HFZOO_REFERENCE_DIR)")
    lines = TABLE_1.read_text().splitlines()
    header = lines[0].split("\t")
    rows = [dict(zip(header, line.split("\t"), strict=True)) for line in lines[1:] if line.strip()]
    return {row["Model"]: float(row["Params"].rstrip("M")) * 1e6 for row in rows}


def row_config(name: str) -> dict:
    """The config fields of a row (the narang-vanilla preset plus the row's changes)."""
    fields = {**PRESETS["narang-vanilla"], **ROWS[name]}
    fields.pop("model_type")
    missing = sorted(key for key in ROWS[name] if key not in FIELDS)
    assert not missing, f"{name}: unknown config fields {missing}"
    return fields


def count_parameters(fields: dict) -> int:
    """Unique parameters of the encoder-decoder LM built on the meta device."""
    with torch.device("meta"):
        model = HfzooEncoderDecoderForConditionalGeneration(HfzooEncoderDecoderConfig(**fields))
    return sum(p.numel() for p in model.parameters())


# The paper's 20M cannot be met: one shared encoder layer (7.08M) + one shared decoder layer (9.44M) + the
# 32,128 x 128 factorized matrix (4.11M) is already 20.6M (see the next test). Its "Block sharing" (65.9M)
# and "+ Factorized & shared" rows match if the paper truncated rather than rounded those three counts.
PAPER_INCONSISTENT = {
    "+ Factorized & shared embeddings": "paper's 20M < 20.6M, the sum of its parts: test_shared_factorized_row_is_the_sum_of_its_parts"
}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=PAPER_INCONSISTENT[name]))
        if name in PAPER_INCONSISTENT
        else name
        for name in ROWS
    ],
)
def test_parameter_count_matches_the_paper(name):
    fields = row_config(name)
    paper = paper_params()[name]
    tolerance = 0.01 if name == "Vanilla Transformer" else 0.02
    count = count_parameters(fields)
    assert abs(count / paper - 1) <= tolerance, f"{name}: hfzoo {count:,} vs paper {paper:,.0f}"


def test_shared_factorized_row_is_the_sum_of_its_parts():
    """Block sharing + factorized tied embeddings = one encoder layer + one decoder layer + V*E + E*H (+ norms)."""
    fields = row_config("+ Factorized & shared embeddings")
    fields = {**fields, "position_embedding_type": "none"}  # the relative bias is a separate, tiny term
    hidden, d_ff, vocab, inner = 768, 3072, 32128, 128
    norm = 2 * hidden  # LayerNorm weight + bias
    encoder_layer = 4 * hidden * hidden + 2 * hidden * d_ff + 2 * norm
    decoder_layer = 8 * hidden * hidden + 2 * hidden * d_ff + 3 * norm
    embeddings = vocab * inner + inner * hidden
    assert count_parameters(fields) == encoder_layer + decoder_layer + embeddings + 2 * norm  # + final norms


def test_narang_vanilla_preset_uses_only_existing_fields():
    """A misspelt preset field would be stored silently and change nothing."""
    unknown = sorted(set(PRESETS["narang-vanilla"]) - FIELDS - {"model_type"})
    assert not unknown


def test_print_table(capsys):
    """Print hfzoo's count, the paper's and the ratio for every row (run with -s, or read the output)."""
    paper = paper_params()
    lines = [f"{'Narang et al. 2021, Table 1 row':45} {'hfzoo':>13} {'paper':>7} {'ratio':>7}"]
    for name in ROWS:
        fields = row_config(name)
        count = count_parameters(fields)
        lines.append(f"{name:45} {count:>13,} {paper[name] / 1e6:>6.0f}M {count / paper[name]:>7.3f}")
    with capsys.disabled():
        print("\n" + "\n".join(lines))
    assert len(lines) == len(ROWS) + 1
