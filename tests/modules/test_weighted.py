"""The Weighted Transformer's branched attention (`hfzoo.modules.weighted`, `token_mixer="branched_attention"`)."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.variant_checks import FAMILIES, TINY, build_model
from huggingface_hub.errors import StrictDataclassClassValidationError

from hfzoo import HfzooDecoderConfig
from hfzoo.modules.feed_forward import FeedForward
from hfzoo.modules.weighted import BRANCH_WEIGHT_EPSILON, BranchedAttention, simplex_weights

BRANCHED = {"token_mixer": "branched_attention"}


def test_branch_weights_are_non_negative_and_sum_to_one():
    weights = simplex_weights(torch.tensor([0.5, -1.0, 1.5, 0.0]))
    total = 2.0 / (2.0 + 4 * BRANCH_WEIGHT_EPSILON)
    torch.testing.assert_close(weights, torch.tensor([0.25, 0.0, 0.75, 0.0]) * total)
    assert (weights >= 0).all() and abs(weights.sum().item() - 1) < 1e-3


@pytest.mark.parametrize("bias", [False, True])
def test_branched_attention_matches_the_written_out_formula(bias):
    """Ahmed et al. 2017, eq. 3-4: `sum_i alpha_i FFN(kappa_i * head_i W^O_i)`, one head at a time."""
    config = HfzooDecoderConfig(**{**TINY, **BRANCHED, "attention_bias": bias})
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    module = BranchedAttention(config, 0, is_causal=False).eval()
    for param in (module.branch_kappa, module.branch_alpha):
        torch.nn.init.uniform_(param, -0.2, 1.0)  # some branches switched off by the ReLU
    if bias:
        torch.nn.init.normal_(module.o_proj.bias)
    x = torch.randn(2, 5, config.hidden_size)
    with torch.no_grad():
        out, _ = module(x)
        heads, head_dim = config.num_attention_heads, config.head_dim
        q, k, v = (proj(x).view(2, 5, heads, head_dim) for proj in (module.q_proj, module.k_proj, module.v_proj))
        kappa = torch.relu(module.branch_kappa) / (torch.relu(module.branch_kappa) + BRANCH_WEIGHT_EPSILON).sum()
        alpha = torch.relu(module.branch_alpha) / (torch.relu(module.branch_alpha) + BRANCH_WEIGHT_EPSILON).sum()
        expected = torch.zeros_like(x)
        for i in range(heads):
            scores = q[:, :, i] @ k[:, :, i].transpose(1, 2) / math.sqrt(head_dim)
            head = torch.softmax(scores, dim=-1) @ v[:, :, i]  # (batch, q_len, head_dim)
            w_o = module.o_proj.weight[:, i * head_dim : (i + 1) * head_dim]  # head i's columns of o_proj
            branch = head @ w_o.T + (module.o_proj.bias if bias else 0)
            expected += alpha[i] * module.mlp(kappa[i] * branch)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


def test_layers_have_no_feed_forward_and_cross_attention_is_branched():
    """Narang et al.'s setup: branched self- and cross-attention, each with its feed-forward, no FFN sublayer."""
    model = build_model("encoder-decoder", BRANCHED)
    for stack in (model.model.encoder, model.model.decoder):
        for layer in stack.layers:
            assert layer.mlp is None and isinstance(layer.self_attn, BranchedAttention)
            assert isinstance(layer.self_attn.mlp, FeedForward)
    assert all(isinstance(layer.cross_attn, BranchedAttention) for layer in model.model.decoder.layers)
    # Parameters: the baseline's, plus one feed-forward per decoder layer (its branched cross-attention) and the
    # kappa / alpha of every branched module, less the feed-forward sublayers' norms (LayerNorm: 2 * hidden).
    baseline = build_model("encoder-decoder", {})
    ffn = sum(p.numel() for p in baseline.model.decoder.layers[0].mlp.parameters())
    heads, layers, hidden = TINY["num_attention_heads"], TINY["num_hidden_layers"], TINY["hidden_size"]
    extra = layers * ffn + 2 * heads * (layers + 2 * layers) - 2 * layers * 2 * hidden
    assert model.num_parameters() == baseline.num_parameters() + extra


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_sublayer_pattern_is_refused(family):
    with pytest.raises(StrictDataclassClassValidationError, match="contains its layer's feed-forward"):
        FAMILIES[family][0](**{**TINY, **BRANCHED, "sublayer_pattern": "ssff"})
