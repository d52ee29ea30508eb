"""Narang et al. 2021's Table 1 as data: each row as config changes, and the paper's figures for each row.

Narang et al. 2021, "Do Transformer Modifications Transfer Across Implementations and Applications?"
(arXiv:2102.11972), Table 1: every modification trained like the "Vanilla Transformer" baseline (the
`narang-vanilla` preset, `hfzoo.models.presets`), with relative attention and a shared bias.

- `TABLE_1_ROWS`: the paper's row name -> the config fields that differ from the baseline. A value is
  a plain value, `Scaled(field, factor)`, a multiple of the baseline's own field, or `ClusterCutoffs`,
  vocabulary clusters in proportion to the baseline's `vocab_size`, so one table
  serves the full-size preset (`resolve_row(name, PRESETS["narang-vanilla"])` gives the paper's sizes:
  GLU rows d_ff 2048, "18 layers" d_ff 2048 and 8 heads, ...) and any scaled-down baseline (the study,
  `hfzoo.study.runner`), where the parameter-matched rows shrink or grow with the base as the paper
  sized them. Adding a row is one line (its name exactly as in the paper's table).
- `load_paper_table(path)`: the paper's table (`narang2021_table1_relative_attention.tsv` of the shared
  reference folder, or any TSV with its columns) as `PaperRow`s.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import os
import re
from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any

from ..choices import choice_hint

__all__ = ["TABLE_1_ROWS", "ClusterCutoffs", "PaperRow", "Scaled", "load_paper_table", "resolve_row"]


@dataclasses.dataclass(frozen=True)
class Scaled:
    """A config value that is `factor` times the baseline's value of `field`.

    Args:
        field: the baseline config field it scales (e.g. `"intermediate_size"`).
        factor: the exact ratio, e.g. `Fraction(2, 3)`.
        multiple_of: round the result to the nearest multiple of this (d_ff: any width works, so a base
            whose d_ff is not divisible still gets the nearest matrix width); None: the result must be a
            whole number (layers, heads), else `resolve` raises.
    """

    field: str
    factor: Fraction
    multiple_of: int | None = None

    def resolve(self, base: Mapping[str, Any]) -> int:
        """The value for `base` (a mapping of the baseline's config fields).

        Raises:
            KeyError: `base` has no `field`.
            ValueError: the exact product is not a whole number (and no `multiple_of`), or it is below 1.
        """
        exact = Fraction(base[self.field]) * self.factor
        if self.multiple_of is not None:
            value = max(self.multiple_of, round(exact / self.multiple_of) * self.multiple_of)
        elif exact.denominator != 1:
            raise ValueError(
                f"{self.field}={base[self.field]} x {self.factor} = {float(exact):.3f} is not a whole number; "
                f"choose a base {self.field} divisible by {self.factor.denominator}"
            )
        else:
            value = int(exact)
        if value < 1:
            raise ValueError(f"{self.field}={base[self.field]} x {self.factor} is below 1")
        return value


@dataclasses.dataclass(frozen=True)
class ClusterCutoffs:
    """Vocabulary cluster boundaries given as the paper's cluster sizes in T5's 32,128-token vocabulary.

    Resolved against a baseline's `vocab_size`: each boundary keeps its fraction of the vocabulary (the
    paper's own sizes on a 32,128-token vocabulary), rounded to the nearest id, and every cluster keeps at
    least one token, so the adaptive rows also build on a scaled-down baseline with a small vocabulary.

    Args:
        token_counts: the clusters' sizes in the paper, e.g. `(2500, 6000, 23628)`; they sum to
            `paper_vocab_size`.
        paper_vocab_size: the vocabulary they partition (T5's 32,128 ids).
    """

    token_counts: tuple[int, ...]
    paper_vocab_size: int = 32128

    def resolve(self, base: Mapping[str, Any]) -> list[int]:
        """The cutoffs (first id of every cluster but the first) for `base["vocab_size"]`.

        Raises:
            KeyError: `base` has no `vocab_size`.
            ValueError: the vocabulary has fewer ids than there are clusters.
        """
        vocab_size, clusters = base["vocab_size"], len(self.token_counts)
        if vocab_size < clusters:
            raise ValueError(f"vocab_size={vocab_size} cannot hold {clusters} clusters")
        cutoffs, total = [], 0
        for i, count in enumerate(self.token_counts[:-1]):
            total += count
            cutoff = round(Fraction(vocab_size * total, self.paper_vocab_size))
            low = cutoffs[-1] + 1 if cutoffs else 1
            cutoffs.append(min(max(cutoff, low), vocab_size - (clusters - 1 - i)))
        return cutoffs


def _glu(activation: str) -> dict[str, Any]:
    """A GLU-family row: gated feed-forward with d_ff shrunk to 2/3 so parameters stay equal (2048 for 3072)."""
    return {
        "gated_mlp": True,
        "hidden_act": activation,
        "intermediate_size": Scaled("intermediate_size", Fraction(2, 3), 8),
    }


def _depth(ratio: Fraction) -> dict[str, Any]:
    """A depth row: layers x ratio, d_ff and heads / ratio (d_kv fixed), parameters and FLOPs about equal."""
    return {
        "num_hidden_layers": Scaled("num_hidden_layers", ratio),
        "num_decoder_layers": Scaled("num_decoder_layers", ratio),
        "intermediate_size": Scaled("intermediate_size", 1 / ratio, 8),
        "num_attention_heads": Scaled("num_attention_heads", 1 / ratio),
    }


#: Factorized embeddings: inner dimension 128 for d_model 768 (Narang et al. 2021, §3), i.e. d_model / 6.
_FACTORIZED = Scaled("hidden_size", Fraction(1, 6), 8)
#: Sparse experts on every 4th layer of each stack (6 of the 24 layers): with 16 experts (top-2, GShard) and
#: 32 experts (Switch, top-1) this gives the paper's 648M and 1100M parameters (647.7M and 1100.6M).
_EXPERTS = {"moe_layer_interval": 4}
#: Adaptive input embeddings: clusters of 2,500 / 6,000 / 23,628 tokens (cutoffs 2500, 8500 on T5's 32,128 ids);
#: the adaptive softmax splits the third into 23,500 + 128 (the last 128 ids: T5's 100 sentinels and 28 unused
#: ids). Both tie input and output through the clusters (Mesh TensorFlow's adaptive vocabulary embeddings), with
#: widths 768 / 192 / 48 (/ 12): Baevski & Auli's factor 4 (`adaptive_*_factor`'s default). "Without projection"
#: keeps every cluster at d_model (factor 1), so its clusters need no projection.
_ADAPTIVE_INPUT = ClusterCutoffs((2500, 6000, 23628))
_ADAPTIVE_SOFTMAX = ClusterCutoffs((2500, 6000, 23500, 128))

#: Lightweight and dynamic convolution rows (Wu et al. 2019) in place of self-attention in both stacks, sized
#: as the Mesh TensorFlow block Narang et al. used (`LocalConvAttnBlock`): GLU input projection, depthwise
#: convolution, pointwise and output projections (4 d^2, self-attention's weights), kernel width 31 in every
#: layer, and hidden_size / num_attention_heads = head_dim = 64 kernels (each shared by 12 channels). The
#: dynamic kernels (768 x 64 x 31 per layer) give 259.5M for the paper's 257M, the lightweight row 223.0M for
#: 224M. No position scheme: the relative bias lives in self-attention, which these models do not have.
_CONVOLUTION = {
    "position_embedding_type": "none",
    "conv_pointwise_projection": True,
    "conv_kernel_size": 31,
    "conv_num_heads": Scaled("head_dim", Fraction(1)),
}


#: The Evolved Transformer row (So et al. 2019): each layer one of its searched cells (`layer_type`), half as many
#: as the baseline's layers, since one cell stacks the blocks of two Transformer layers (So et al. §4: the
#: Transformer's encoder is 3 cells of 6 blocks, its decoder 3 cells of 8). Cells as Mesh TensorFlow's
#: evolved-transformer layers (the decoder's wide attention has 2 x 12 heads of d_kv = 64): 6 + 6 cells give
#: 216.3M for the paper's 217M, with the baseline's shared relative bias.
_EVOLVED = {
    "layer_type": "evolved_transformer",
    "num_hidden_layers": Scaled("num_hidden_layers", Fraction(1, 2)),
    "num_decoder_layers": Scaled("num_decoder_layers", Fraction(1, 2)),
}


def _synthesizer(kind: str, mixing: str = "none") -> dict[str, Any]:
    """A Synthesizer row (Tay et al. 2020) in place of self-attention in both stacks, as Mesh TensorFlow's layer.

    Its defaults, 8 heads of 128 (2/3 of the baseline's heads, twice its d_kv) over 512 x 512 synthesized
    matrices (`max_position_embeddings`), reproduce all seven of the paper's counts (dense 224.5M, dense plus
    243.4M, factorized 207.2M, random 254.4M, random plus 292.2M; alpha adds one weight per layer), and the
    relative bias is not applied there, so the rows use no position scheme.
    """
    return {
        "token_mixer": "synthesizer",
        "synthesizer_type": kind,
        "synthesizer_mixing": mixing,
        "synthesizer_num_heads": Scaled("num_attention_heads", Fraction(2, 3)),
        "synthesizer_head_dim": Scaled("head_dim", Fraction(2)),
        "position_embedding_type": "none",
    }


#: Universal Transformer as Narang et al.'s released `universal_transformer.gin` builds it: one shared layer per
#: stack applied 24 times (twice the baseline's depth) with the "basic" recurrence (no ACT halting, although the
#: file sets ACT's parameters), Mesh TensorFlow's GRU gate on every sublayer, and an untied output matrix:
#: 65.9M for the two layers and two vocabulary matrices + 17.7M of gates = 83.7M (the paper's 84M).
_UNIVERSAL = {
    "layer_stack": "universal",
    "num_hidden_layers": 1,
    "num_decoder_layers": 1,
    "num_recurrent_steps": Scaled("num_hidden_layers", Fraction(2)),
    "adaptive_computation_time": False,
    "residual_gating": "gru",
    "tie_word_embeddings": False,
}

#: Table 1 row name (as in the paper) -> config changes to the `narang-vanilla` baseline. Ties are
#: (encoder/decoder input, decoder input/output); the block-sharing rows use an untied output matrix, as
#: their counts show (65M = shared layers + two 24.7M vocabulary matrices), and "+ Factorized & shared"
#: ties it again. ReZero and Fixup rows differ from the baseline only in their residual wiring here: the
#: paper trained them with Adam because Adafactor failed, and hfzoo trains every row with AdamW anyway.
TABLE_1_ROWS: dict[str, dict[str, Any]] = {
    "Vanilla Transformer": {},
    "GeLU": {"hidden_act": "gelu"},
    "Swish": {"hidden_act": "silu"},
    "ELU": {"hidden_act": "elu"},
    "GLU": _glu("sigmoid"),
    "GeGLU": _glu("gelu"),
    "ReGLU": _glu("relu"),
    "SeLU": {"hidden_act": "selu"},
    "SwiGLU": _glu("silu"),
    "LiGLU": _glu("linear"),
    "Sigmoid": {"hidden_act": "sigmoid"},
    "Softplus": {"hidden_act": "softplus"},
    "RMS Norm": {"norm_type": "rms_norm"},
    "Rezero": {"rezero": True, "norm_type": "none"},
    "Rezero + LayerNorm": {"rezero": True},
    "Rezero + RMS Norm": {"rezero": True, "norm_type": "rms_norm"},
    "Fixup": {"fixup_init": True, "norm_type": "none"},
    "24 layers, $d_{ff} = 1536, H = 6$": _depth(Fraction(2)),
    "18 layers, $d_{ff} = 2048, H = 8$": _depth(Fraction(3, 2)),
    "8 layers, $d_{ff} = 4608, H = 18$": _depth(Fraction(2, 3)),
    "6 layers, $d_{ff} = 6144, H = 24$": _depth(Fraction(1, 2)),
    "Block sharing": {"block_sharing": "all", "tie_word_embeddings": False},
    "+ Factorized embeddings": {"block_sharing": "all", "tie_word_embeddings": False, "embedding_size": _FACTORIZED},
    "+ Factorized & shared embeddings": {"block_sharing": "all", "embedding_size": _FACTORIZED},
    "Encoder only block sharing": {"block_sharing": "encoder", "tie_word_embeddings": False},
    "Decoder only block sharing": {"block_sharing": "decoder", "tie_word_embeddings": False},
    "Factorized Embedding": {"embedding_size": _FACTORIZED, "tie_word_embeddings": False},
    "Factorized & shared embeddings": {"embedding_size": _FACTORIZED},
    "Tied encoder/decoder input embeddings": {"tie_word_embeddings": False},
    "Tied decoder input and output embeddings": {"tie_encoder_decoder_embeddings": False},
    "Untied embeddings": {"tie_encoder_decoder_embeddings": False, "tie_word_embeddings": False},
    "Adaptive input embeddings": {"adaptive_input_cutoffs": _ADAPTIVE_INPUT},
    "Adaptive softmax": {"adaptive_input_cutoffs": _ADAPTIVE_SOFTMAX, "adaptive_softmax_cutoffs": _ADAPTIVE_SOFTMAX},
    "Adaptive softmax without projection": {
        "adaptive_input_cutoffs": _ADAPTIVE_SOFTMAX,
        "adaptive_softmax_cutoffs": _ADAPTIVE_SOFTMAX,
        "adaptive_input_factor": 1,
        "adaptive_softmax_factor": 1,
    },
    "Mixture of softmaxes": {"num_softmaxes": 15},
    "Transparent attention": {"transparent_attention": True},
    "Dynamic convolution": {"token_mixer": "dynamic_convolution", **_CONVOLUTION},
    "Lightweight convolution": {"token_mixer": "lightweight_convolution", **_CONVOLUTION},
    "Evolved Transformer": _EVOLVED,
    "Synthesizer (dense)": _synthesizer("dense"),
    "Synthesizer (dense plus)": _synthesizer("dense", "plus"),
    "Synthesizer (dense plus alpha)": _synthesizer("dense", "plus_alpha"),
    "Synthesizer (factorized)": _synthesizer("factorized_random"),
    "Synthesizer (random)": _synthesizer("random"),
    "Synthesizer (random plus)": _synthesizer("random", "plus"),
    "Synthesizer (random plus alpha)": _synthesizer("random", "plus_alpha"),
    "Mixture of experts": {"num_experts": 16, "num_experts_per_tok": 2, "router_type": "top_k", **_EXPERTS},
    "Switch Transformer": {"num_experts": 32, "num_experts_per_tok": 1, "router_type": "switch", **_EXPERTS},
    "Universal Transformer": _UNIVERSAL,
    "Funnel Transformer": {"layer_stack": "funnel", "decoder_layer_stack": "standard"},
    "Weighted Transformer": {"token_mixer": "branched_attention"},
    "Product key memory": {"decoder_memory_layers": [-2], "memory_query_norm": "layer_norm"},
}


def resolve_row(
    name: str, base: Mapping[str, Any], rows: Mapping[str, Mapping[str, Any]] | None = None
) -> dict[str, Any]:
    """The concrete config changes of a Table 1 row for a given baseline (its `Scaled` values computed).

    Args:
        name: a row name of `rows`.
        base: the baseline's config fields (e.g. `PRESETS["narang-vanilla"]`, or a scaled-down
            baseline's `config.to_dict()`); every field a `Scaled` value refers to must be present.
        rows: the row table (default: `TABLE_1_ROWS`).

    Returns:
        `{field: value}` with plain JSON values only.

    Raises:
        ValueError: an unknown row (the message lists the known ones), or a `Scaled` value that does not
            come out whole for this baseline (the message names the row and the field).
    """
    rows = TABLE_1_ROWS if rows is None else rows
    if name not in rows:
        raise ValueError(f"unknown Table 1 row {name!r}; {choice_hint(name, rows, 'hfzoo.models.narang.TABLE_1_ROWS')}")
    resolved = {}
    for key, value in rows[name].items():
        if isinstance(value, (Scaled, ClusterCutoffs)):
            try:
                value = value.resolve(base)
            except (KeyError, ValueError) as err:
                raise ValueError(f"row {name!r}, {key}: {err}") from None
        resolved[key] = value
    return resolved


@dataclasses.dataclass(frozen=True)
class PaperRow:
    """One row of Narang et al. 2021's Table 1 (or Table 2), in SI units.

    Attributes:
        name: the row name (`Model` column).
        params: total parameters ("223M" -> 223e6).
        ops: total FLOPs of pretraining ("11.1T" -> 11.1e12).
        steps_per_second: training steps per second on the paper's TPU setup.
        early_loss: held-out span-corruption loss after 65,536 steps, mean over 5 runs.
        early_loss_std: its standard deviation over the runs.
        final_loss: held-out loss after 524,288 steps.
        downstream: the downstream columns (`SGLUE`, `XSum`, `WebQ`, `WMT EnDe`, ...) as floats (NaN if blank).
    """

    name: str
    params: float
    ops: float
    steps_per_second: float
    early_loss: float
    early_loss_std: float
    final_loss: float
    downstream: dict[str, float]


_SI = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12, "P": 1e15}


def _si_number(text: str, column: str, row: str) -> float:
    match = re.fullmatch(r"\s*([0-9.]+)\s*([KMBGTP]?)\s*", text)
    if match is None:
        raise ValueError(f"paper table, row {row!r}, column {column}: {text!r} is not a number such as 223M or 11.1T")
    return float(match.group(1)) * _SI.get(match.group(2), 1.0)


def load_paper_table(path: str | os.PathLike) -> dict[str, PaperRow]:
    """Read the paper's table from a TSV with the columns of `narang2021_table1_relative_attention.tsv`.

    Columns: `Model`, `Params` ("223M"), `Ops` ("11.1T"), `Step/s`, `Early loss` ("2.182 ± 0.005"),
    `Final loss`, then any downstream columns (numbers).

    Args:
        path: the TSV file.

    Returns:
        `{row name: PaperRow}` in the file's order.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a missing column or a cell that is not a number (the message names row and column).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"paper table {path}: no such file")
    with path.open(encoding="utf-8", newline="") as f:
        records = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    required = ["Model", "Params", "Ops", "Step/s", "Early loss", "Final loss"]
    header = list(records[0]) if records else []
    missing = [c for c in required if c not in header]
    if missing:
        raise ValueError(f"paper table {path}: missing columns {missing} (has {header})")
    table = {}
    for record in records:
        name = record["Model"]
        mean, _, std = record["Early loss"].partition("±")
        downstream = {}
        for column in header[len(required) :]:
            cell = (record[column] or "").strip()
            downstream[column] = _si_number(cell, column, name) if cell else math.nan
        table[name] = PaperRow(
            name=name,
            params=_si_number(record["Params"], "Params", name),
            ops=_si_number(record["Ops"], "Ops", name),
            steps_per_second=_si_number(record["Step/s"], "Step/s", name),
            early_loss=_si_number(mean, "Early loss", name),
            early_loss_std=_si_number(std, "Early loss", name) if std.strip() else math.nan,
            final_loss=_si_number(record["Final loss"], "Final loss", name),
            downstream=downstream,
        )
    return table
