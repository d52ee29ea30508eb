"""The Evolved Transformer's cells (`hfzoo.modules.evolved`, So et al. 2019) against written-out references.

The convolution branches of both cells are compared with the same formulas written with `torch.nn.functional.
conv1d` (depthwise: one group per channel) from the cell's own weights: "same" padding in the encoder cell,
left padding in the decoder cell, whose branches fed one token at a time through the KV cache must reproduce
the full-sequence outputs. The config refuses what the fixed cells do not take, naming the field. The variant
matrix (`tests/models/test_variants.py`) runs the cells through every family (cache, causality, padding, export).
"""

from __future__ import annotations

import pytest
import torch
from helpers.variant_checks import FAMILIES, TINY
from huggingface_hub.errors import StrictDataclassClassValidationError
from torch.nn import functional as F
from transformers.cache_utils import DynamicCache

from hfzoo import HfzooDecoderConfig
from hfzoo.models.narang import resolve_row
from hfzoo.models.presets import PRESETS
from hfzoo.modules.evolved import EvolvedTransformerLayer

HIDDEN = 8


def make_cell(is_causal: bool, seed: int = 0) -> EvolvedTransformerLayer:
    config = HfzooDecoderConfig(
        vocab_size=11,
        hidden_size=HIDDEN,
        num_attention_heads=2,
        num_hidden_layers=1,
        intermediate_size=16,
        layer_type="evolved_transformer",
    )
    torch.manual_seed(seed)
    cell = EvolvedTransformerLayer(config, 0, is_causal=is_causal).eval()
    for param in cell.parameters():  # far from the initialisation: norms' gains and biases matter too
        torch.nn.init.normal_(param, std=0.5)
    return cell


def depthwise(x: torch.Tensor, kernel: torch.Tensor, left: int, right: int) -> torch.Tensor:
    """`(batch, len, channels)` convolved per channel with `kernel` `(channels, k)` after zero padding."""
    out = F.conv1d(F.pad(x.transpose(1, 2), (left, right)), kernel[:, None, :], groups=kernel.shape[0])
    return out.transpose(1, 2)


def separable(conv, x: torch.Tensor, left: int, right: int) -> torch.Tensor:
    return F.linear(depthwise(x, conv.kernel, left, right), conv.pointwise.weight, conv.pointwise.bias)


def widen(x: torch.Tensor, width: int) -> torch.Tensor:
    return torch.cat([x, x.new_zeros(*x.shape[:-1], width - x.shape[-1])], dim=-1)


def test_encoder_convolutions_match_the_written_out_branches():
    """ReLU(d -> 4d) + ReLU(conv 3x1 -> d/2), norm, separable 9x1 -> d/2, padded to d (So et al. Fig. 3)."""
    cell = make_cell(is_causal=False)
    x = torch.randn(2, 9, HIDDEN)
    mask = torch.ones(2, 9, 1)
    mask[1, 6:] = 0
    with torch.no_grad():
        got = cell._encoder_convolutions(x, mask)
        h = x * mask
        left = F.relu(cell.conv_left(h))
        right = F.conv1d(h.transpose(1, 2), cell.conv_right.weight, cell.conv_right.bias, padding=1)
        summed = left + widen(F.relu(right.transpose(1, 2)), 4 * HIDDEN)
        expected = widen(separable(cell.conv_out, cell.conv_mid_norm(summed) * mask, 4, 4), HIDDEN)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert torch.all(got[..., HIDDEN // 2 :] == 0)  # the d/2 output is zero-padded to d
    # the padding positions' inputs do not reach the tokens
    x2 = x.clone()
    x2[1, 6:] = 100.0
    with torch.no_grad():
        torch.testing.assert_close(cell._encoder_convolutions(x2, mask)[1, :6], got[1, :6])


def test_decoder_convolutions_match_the_written_out_branches_and_the_cache():
    """ReLU(sep 11x1 -> 2d) + sep 7x1 -> d/2, norm, sep 7x1 -> d, all left-padded; one token at a time = all."""
    cell = make_cell(is_causal=True)
    x = torch.randn(2, 20, HIDDEN)  # longer than the 17-token receptive field
    with torch.no_grad():
        got = cell._decoder_convolutions(x, None, None)
        left = F.relu(separable(cell.conv_left, x, 10, 0))
        right = separable(cell.conv_right, x, 6, 0)
        expected = separable(cell.conv_out, cell.conv_mid_norm(left + widen(right, 2 * HIDDEN)), 6, 0)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        cache = DynamicCache()
        steps = [cell._decoder_convolutions(x[:, :5], None, cache)]
        steps += [cell._decoder_convolutions(x[:, i : i + 1], None, cache) for i in range(5, 20)]
    torch.testing.assert_close(torch.cat(steps, dim=1), got, rtol=1e-5, atol=1e-5)
    # causal: a change at position 12 leaves the outputs before it unchanged
    x2 = x.clone()
    x2[:, 12] += 3.0
    with torch.no_grad():
        changed = cell._decoder_convolutions(x2, None, None)
    torch.testing.assert_close(changed[:, :12], got[:, :12])
    assert not torch.allclose(changed[:, 12], got[:, 12])


def test_a_decoder_cell_takes_three_cache_layers():
    for family in ("decoder", "encoder-decoder"):
        config = FAMILIES[family][0](**TINY, layer_type="evolved_transformer")
        assert config.get_text_config(decoder=True).num_hidden_layers == 3 * TINY["num_hidden_layers"]


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"layer_type": "evolved"}, r"layer_type='evolved' is not supported; choose one of \['transformer', "),
        ({"sublayer_pattern": "sfsf"}, r"sublayer_pattern='sfsf' is not supported with layer_type="),
        ({"token_mixer": "synthesizer"}, r"token_mixer='synthesizer' is not supported with layer_type="),
        ({"norm_position": "post"}, r"norm_position='post' is not supported with .*: its cells are pre-norm"),
        ({"norm_type": "none"}, r"norm_type='none' is not supported"),
        ({"rezero": True}, r"rezero=True is not supported"),
        ({"fixup_init": True, "norm_type": "none"}, r"(norm_type='none'|fixup_init=True) is not supported"),
        ({"num_experts": 2}, r"num_experts=2 is not supported .*: its feed-forward blocks are dense"),
        ({"gated_mlp": True}, r"gated_mlp=True is not supported"),
        ({"block_sharing": "all"}, r"block_sharing='all' is not supported .*: each cell has its own parameters"),
        ({"hidden_size": 33, "num_attention_heads": 3, "head_dim": 11}, r"hidden_size=33 is not supported"),
    ],
)
def test_what_the_cells_do_not_take_is_refused(overrides, message):
    fields = {**TINY, "layer_type": "evolved_transformer", **overrides}
    with pytest.raises((StrictDataclassClassValidationError, ValueError), match=message):
        FAMILIES["decoder"][0](**fields)


def test_narang_row_halves_the_layers():
    """One cell holds the blocks of two Transformer layers: 6 + 6 cells for the baseline's 12 + 12 layers."""
    assert resolve_row("Evolved Transformer", PRESETS["narang-vanilla"]) == {
        "layer_type": "evolved_transformer",
        "num_hidden_layers": 6,
        "num_decoder_layers": 6,
    }
