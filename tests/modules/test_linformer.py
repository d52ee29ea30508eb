"""Linformer attention (`hfzoo.modules.linformer`) against a written-out einsum, and its config checks."""

from __future__ import annotations

import pytest
import torch
from helpers.flop_counting import flop_counter
from helpers.variant_checks import FAMILIES, TINY
from huggingface_hub.errors import StrictDataclassClassValidationError

from hfzoo.models.flops import count_training_flops
from hfzoo.models.presets import build_config
from hfzoo.modules.linformer import LinformerAttention

HEADS, HEAD_DIM, K = TINY["num_attention_heads"], TINY["hidden_size"] // TINY["num_attention_heads"], 5


def mixer(sharing: str = "headwise", attn: str = "eager") -> LinformerAttention:
    config = FAMILIES["encoder"][0](
        **{**TINY, "token_mixer": "linformer", "linformer_k": K, "linformer_sharing": sharing}
    )
    config._attn_implementation = attn
    torch.manual_seed(0)
    module = LinformerAttention(config, layer_idx=0, is_causal=False).eval()
    for param in module.parameters():  # random weights and biases, not the (zero-bias) initialisation
        torch.nn.init.normal_(param, std=0.3)
    return module


def reference(module: LinformerAttention, x: torch.Tensor) -> torch.Tensor:
    """Wang et al. 2020 eq. 7 written out: `softmax(Q (E K)^T / sqrt(d)) (F V)` per head, then `o_proj`."""
    n = x.shape[1]
    e = module.key_projection.weight[:, :n]  # (k, n)
    f = e if module.value_projection is None else module.value_projection.weight[:, :n]
    q = module.q_proj(x).unflatten(-1, (HEADS, HEAD_DIM))  # (batch, n, heads, head_dim)
    k = module.k_proj(x).unflatten(-1, (HEADS, HEAD_DIM))
    v = module.v_proj(x).unflatten(-1, (HEADS, HEAD_DIM))
    projected_keys = torch.einsum("kn,bnhd->bkhd", e, k)
    projected_values = torch.einsum("kn,bnhd->bkhd", f, v)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, projected_keys) / HEAD_DIM**0.5
    heads = torch.einsum("bhqk,bkhd->bqhd", scores.softmax(-1), projected_values)
    return module.o_proj(heads.flatten(-2))


@pytest.mark.parametrize("sharing", ["headwise", "key_value"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_matches_the_written_out_formula(sharing, attn):
    module = mixer(sharing, attn)
    assert (module.value_projection is None) == (sharing == "key_value")
    x = torch.randn(2, 9, TINY["hidden_size"])
    with torch.no_grad():
        out, weights = module(x)
        torch.testing.assert_close(out, reference(module, x), rtol=1e-5, atol=1e-5)
    if attn == "eager":
        assert weights.shape == (2, HEADS, 9, K)


def test_padding_is_left_out_of_the_projections_on_either_side():
    module = mixer()
    x = torch.randn(1, 6, TINY["hidden_size"])
    with torch.no_grad():
        alone = module(x)[0][0]
        right = module(torch.cat([x, torch.randn(1, 3, TINY["hidden_size"])], 1), padding_mask=mask([1] * 6 + [0] * 3))
        left = module(torch.cat([torch.randn(1, 2, TINY["hidden_size"]), x], 1), padding_mask=mask([0] * 2 + [1] * 6))
    torch.testing.assert_close(right[0][0, :6], alone, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(left[0][0, 2:], alone, rtol=1e-5, atol=1e-6)


def mask(values: list[int]) -> torch.Tensor:
    return torch.tensor([values], dtype=torch.bool)


def test_a_sequence_longer_than_the_projections_is_refused():
    with pytest.raises(ValueError, match=r"sequence of 65 tokens is longer than max_position_embeddings=64"):
        mixer()(torch.randn(1, 65, TINY["hidden_size"]))


@pytest.mark.parametrize(
    "family, overrides, message",
    [
        ("encoder", {"linformer_k": 0}, r"linformer_k must be a positive integer \(the projected length k\), got 0"),
        ("encoder", {"linformer_k": 65}, r"linformer_k=65 exceeds max_position_embeddings=64"),
        (
            "encoder",
            {"linformer_k": 8, "linformer_sharing": "layerwise"},
            r"linformer_sharing='layerwise' is not supported; choose one of",
        ),
        (
            "decoder",
            {"use_cache": False},
            r"token_mixer='linformer' is not defined for the causal decoder of hfzoo_decoder \(the projections",
        ),
        ("encoder-decoder", {}, r"token_mixer='linformer' is not defined for the causal decoder of hfzoo_encoder_dec"),
        ("encoder", {"position_embedding_type": "alibi"}, r"position_embedding_type='alibi' acts inside attention"),
    ],
)
def test_bad_linformer_configs_are_refused(family, overrides, message):
    with pytest.raises(StrictDataclassClassValidationError, match=message):
        FAMILIES[family][0](**{**TINY, "token_mixer": "linformer", **overrides})


def test_linformer_fields_without_linformer_are_refused():
    with pytest.raises(StrictDataclassClassValidationError, match=r"linformer_k=8 only applies to token_mixer='lin"):
        FAMILIES["encoder"][0](**{**TINY, "linformer_k": 8})


def test_flops_count_the_projections_and_the_projected_scores():
    """E and F cost like a `k x d_attn` weight per token each; scores cover n x k pairs: FlopCounterMode agrees."""
    config = build_config("encoder-tiny", {"token_mixer": "linformer", "linformer_k": 4, "vocab_size": 64})
    count = count_training_flops(config, 10)
    assert count.attention == 12 * 2 * 10 * 4 * 64  # 2 layers, 10 queries x 4 projected keys, d_attn = 64
    torch.manual_seed(0)
    model = FAMILIES["encoder"][1](config)
    ids = torch.randint(3, 64, (1, 10))
    with flop_counter() as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    assert counter.get_total_flops() == count.total
