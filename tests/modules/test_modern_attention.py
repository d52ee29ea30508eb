"""QK-norm, logit soft-capping and squared ReLU against written-out references, and their refusals.

- QK-norm (`qk_norm`, Dehghani et al. 2023 §3.1; OLMo 2): `HfzooAttention` equals the attention written out
  with each head's queries and keys normalised over `head_dim` before rotary; the KV cache holds normalised keys.
- Attention soft-capping (`attn_logit_softcapping`, Gemma 2 §2): eager equals `softmax(c tanh(QK^T s / c) + bias)`;
  FlexAttention (score_mod) equals eager; SDPA is not offered (fallback to eager, explicit request refused).
- Final soft-capping (`final_logit_softcapping`): the logits are `c tanh(z / c)` of the uncapped model's, and the
  chunked cross-entropy and its gradients equal autograd on the capped logits.
- Squared ReLU (`hidden_act="relu2"`, So et al. 2021 §4): `FeedForward` equals `W2 relu(W1 x)^2` (gated too).
"""

from __future__ import annotations

import pytest
import torch
from helpers.variant_checks import FAMILIES, TINY, make_batch, run
from huggingface_hub.errors import StrictDataclassClassValidationError
from torch import nn
from transformers.cache_utils import DynamicCache

from hfzoo import HfzooDecoderConfig, HfzooEncoderConfig, HfzooEncoderDecoderConfig
from hfzoo.modules.attention import HfzooAttention
from hfzoo.modules.embeddings import chunked_linear_cross_entropy
from hfzoo.modules.feed_forward import ACTIVATIONS, FeedForward
from hfzoo.modules.mixers import TOKEN_MIXERS
from hfzoo.modules.positions import RotaryEmbedding, apply_rotary_pos_emb

HEADS, HEAD_DIM = 4, 8


def attention_config(**overrides) -> HfzooDecoderConfig:
    config = HfzooDecoderConfig(**{**TINY, "num_attention_heads": HEADS, **overrides})
    config._attn_implementation = overrides.get("attn", "eager")
    return config


def build_attention(config, seed: int = 0) -> HfzooAttention:
    torch.manual_seed(seed)
    attention = HfzooAttention(config, layer_idx=0, is_causal=True).eval()
    with torch.no_grad():  # random learned scales, so that a scale applied in the wrong place shows
        for norm in (attention.q_norm, attention.k_norm):
            if norm is not None and norm.weight is not None:
                norm.weight.uniform_(0.5, 1.5)
    return attention


def reference_norm(x: torch.Tensor, kind: str, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """QK-norm written out over the last dimension (head_dim)."""
    if kind == "layer_norm":
        x = x - x.mean(-1, keepdim=True)
    y = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return y if weight is None else y * weight


def reference_attention(attention, hidden, cos_sin=None, kind=None, cap=None, eps=1e-6) -> torch.Tensor:
    """Causal multi-head attention written out: norms, rotary, scaled scores, cap, softmax, output projection."""
    batch, seq, _ = hidden.shape

    def heads(x):
        return x.view(batch, seq, HEADS, HEAD_DIM).transpose(1, 2)

    q, k, v = heads(attention.q_proj(hidden)), heads(attention.k_proj(hidden)), heads(attention.v_proj(hidden))
    if kind is not None:
        q = reference_norm(q, kind, attention.q_norm.weight, eps)
        k = reference_norm(k, kind, attention.k_norm.weight, eps)
    if cos_sin is not None:
        q, k = apply_rotary_pos_emb(q, k, *cos_sin)
    scores = q @ k.transpose(-1, -2) / HEAD_DIM**0.5
    if cap is not None:
        scores = cap * torch.tanh(scores / cap)
    causal = torch.ones(seq, seq, dtype=torch.bool).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, seq, HEADS * HEAD_DIM)
    return attention.o_proj(out)


def causal_mask(seq: int) -> torch.Tensor:
    mask = torch.zeros(seq, seq).masked_fill(~torch.ones(seq, seq, dtype=torch.bool).tril(), torch.finfo().min)
    return mask[None, None]


@pytest.mark.parametrize("kind", ["rms_norm", "layer_norm"])
@pytest.mark.parametrize("learnable", [True, False])
@pytest.mark.parametrize("rotary", [False, True])
def test_qk_norm_matches_the_written_out_attention(kind, learnable, rotary):
    overrides = {"qk_norm": kind, "qk_norm_learnable_scale": learnable}
    if rotary:
        overrides["position_embedding_type"] = "rotary"
    config = attention_config(**overrides)
    attention = build_attention(config)
    assert (attention.q_norm.weight is not None) == learnable
    hidden = torch.randn(2, 6, TINY["hidden_size"])
    cos_sin = None
    if rotary:
        cos_sin = RotaryEmbedding(config)(torch.arange(6)[None])
    eps = config.rms_norm_eps if kind == "rms_norm" else config.layer_norm_eps
    with torch.no_grad():
        got, _ = attention(hidden, attention_mask=causal_mask(6), position_embeddings=cos_sin)
        expected = reference_attention(attention, hidden, cos_sin, kind=kind, eps=eps)
        plain = build_attention(attention_config(**{k: v for k, v in overrides.items() if k.startswith("position")}))
        unnormed, _ = plain(hidden, attention_mask=causal_mask(6), position_embeddings=cos_sin)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got, unnormed, atol=1e-3)  # the norm changed the output


def test_the_kv_cache_stores_normalised_keys():
    config = attention_config(qk_norm="rms_norm", qk_norm_learnable_scale=False)
    attention = build_attention(config)
    hidden = torch.randn(1, 5, TINY["hidden_size"])
    cache = DynamicCache(config=config)
    with torch.no_grad():
        full, _ = attention(hidden, attention_mask=causal_mask(5))
        attention(hidden[:, :3], attention_mask=causal_mask(3), cache=cache)
        step, _ = attention(hidden[:, 3:], attention_mask=causal_mask(5)[..., 3:, :], cache=cache)
    keys = cache.layers[0].keys  # (1, heads, 5, head_dim)
    torch.testing.assert_close(keys.pow(2).mean(-1), torch.ones(1, HEADS, 5), atol=1e-4, rtol=0)
    torch.testing.assert_close(step, full[:, 3:], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("cap", [0.5, 3.0])
def test_attention_softcapping_matches_the_written_out_attention(cap):
    config = attention_config(attn_logit_softcapping=cap)
    attention = build_attention(config)
    hidden = torch.randn(2, 6, TINY["hidden_size"]) * 4  # scores beyond the cap
    with torch.no_grad():
        got, weights = attention(hidden, attention_mask=causal_mask(6))
        expected = reference_attention(attention, hidden, cap=cap)
        uncapped, _ = build_attention(attention_config())(hidden, attention_mask=causal_mask(6))
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got, uncapped, atol=1e-3)
    # every score lies in (-cap, cap): the ratio of two probabilities of one row is at most exp(2 cap)
    visible = weights[..., 1:, :2]  # the rows that see two keys
    assert (visible.max(-1).values / visible.min(-1).values).max() <= torch.exp(torch.tensor(2 * cap)) + 1e-4


def test_attention_softcapping_is_not_offered_on_sdpa():
    config = HfzooDecoderConfig(**TINY, attn_logit_softcapping=20.0)
    model = FAMILIES["decoder"][1](config)  # transformers' default (SDPA) falls back to eager, as for Gemma 2
    assert model.config._attn_implementation == "eager"
    assert not model._supports_sdpa and model._supports_flex_attn
    with pytest.raises(ValueError, match="does not support .*scaled_dot_product_attention"):
        FAMILIES["decoder"][1]._from_config(config, attn_implementation="sdpa")
    model.config._attn_implementation = "sdpa"  # switched by hand past transformers' check
    batch = make_batch("decoder")
    with pytest.raises(ValueError, match="attn_logit_softcapping=20.0 .* the 'sdpa' backend cannot"):
        run(model, batch)


@pytest.mark.slow  # FlexAttention is compiled by inductor on the CPU: about 15-30 s a case on 2 cores
@pytest.mark.parametrize("overrides", [{}, {"position_embedding_type": "alibi"}], ids=["plain", "alibi"])
def test_attention_softcapping_on_flex_attention_equals_eager(overrides):
    """FlexAttention forward (the CPU runs no FlexAttention backward): transformers' path, and the score-bias path."""
    family = "decoder"
    config_class, model_class = FAMILIES[family]
    outputs = {}
    for attn in ("eager", "flex_attention"):
        torch.manual_seed(0)
        model = model_class(config_class(**{**TINY, **overrides, "attn_logit_softcapping": 1.0}))
        model.set_attn_implementation(attn)
        with torch.no_grad():
            outputs[attn] = run(model.eval(), make_batch(family)).logits
    mask = make_batch(family).attention_mask.bool()
    torch.testing.assert_close(outputs["flex_attention"][mask], outputs["eager"][mask], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_final_softcapping_caps_the_uncapped_logits(family):
    config_class, model_class = FAMILIES[family]
    batch = make_batch(family)
    logits = {}
    for cap in (None, 0.05):
        torch.manual_seed(0)
        model = model_class(config_class(**TINY, final_logit_softcapping=cap)).eval()
        with torch.no_grad():
            logits[cap] = run(model, batch).logits
    torch.testing.assert_close(logits[0.05], 0.05 * torch.tanh(logits[None] / 0.05))
    assert logits[0.05].abs().max() <= 0.05


@pytest.mark.parametrize("family", list(FAMILIES))
def test_final_softcapping_chunked_loss_equals_the_loss_of_the_capped_logits(family):
    """The training path (chunked loss, no logits) equals transformers' loss on the capped logits."""
    config_class, model_class = FAMILIES[family]
    torch.manual_seed(0)
    model = model_class(config_class(**TINY, final_logit_softcapping=0.5))
    batch = make_batch(family)
    model.train()
    chunked = run(model, batch, labels=batch.labels, skip_logits=True)
    assert chunked.logits is None
    full = run(model, batch, labels=batch.labels, skip_logits=False)
    torch.testing.assert_close(chunked.loss, full.loss)


@pytest.mark.parametrize("cap", [0.7, 30.0])
def test_chunked_cross_entropy_with_a_cap_matches_autograd(cap):
    torch.manual_seed(0)
    hidden = torch.randn(13, 16, requires_grad=True)
    weight = torch.randn(50, 16, requires_grad=True)
    bias = torch.randn(50, requires_grad=True)
    labels = torch.randint(0, 50, (13,))
    labels[3] = -100
    got = chunked_linear_cross_entropy(hidden, weight, labels, bias, chunk_size=4, softcap=cap)
    got_grads = torch.autograd.grad(got, (hidden, weight, bias))
    logits = nn.functional.linear(hidden, weight, bias)
    expected = nn.functional.cross_entropy(cap * torch.tanh(logits / cap), labels, reduction="sum")
    expected_grads = torch.autograd.grad(expected, (hidden, weight, bias))
    torch.testing.assert_close(got, expected)
    for a, b in zip(got_grads, expected_grads):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("gated", [False, True])
def test_squared_relu_feed_forward(gated):
    config = HfzooDecoderConfig(**{**TINY, "hidden_act": "relu2", "gated_mlp": gated})
    torch.manual_seed(0)
    block = FeedForward(config)
    x = torch.randn(3, TINY["hidden_size"])
    hidden = torch.relu(block.gate_proj(x) if gated else block.up_proj(x)) ** 2
    if gated:
        hidden = hidden * block.up_proj(x)
    torch.testing.assert_close(block(x), block.down_proj(hidden))
    assert "relu2" in ACTIVATIONS


@pytest.mark.parametrize(
    "config_class, overrides, match",
    [
        (HfzooDecoderConfig, {"qk_norm": "l2"}, r"qk_norm='l2' is not supported; choose one of \[None, 'rms_norm'"),
        (HfzooDecoderConfig, {"qk_norm_learnable_scale": False}, "qk_norm_learnable_scale=False only applies"),
        (HfzooDecoderConfig, {"attn_logit_softcapping": 0.0}, "attn_logit_softcapping=0.0 must be None .* positive"),
        (HfzooDecoderConfig, {"attn_logit_softcapping": -1}, "attn_logit_softcapping=-1 must be None"),
        (HfzooEncoderConfig, {"final_logit_softcapping": 0}, "final_logit_softcapping=0 must be None .* positive"),
        (HfzooDecoderConfig, {"final_logit_softcapping": -30.0}, "final_logit_softcapping=-30.0 must be None"),
        (
            HfzooEncoderConfig,
            {"qk_norm": "rms_norm", "token_mixer": "fourier"},
            r"qk_norm='rms_norm' acts on attention queries, keys and scores, which token_mixer='fourier' does not",
        ),
        (
            HfzooDecoderConfig,
            {"attn_logit_softcapping": 50.0, "token_mixer": "lightweight_convolution"},
            "attn_logit_softcapping=50.0 .* token_mixer='lightweight_convolution' does not apply",
        ),
        (
            HfzooEncoderDecoderConfig,
            {"qk_norm": "layer_norm", "token_mixer": "synthesizer"},
            "token_mixer='synthesizer' does not apply",
        ),
        (HfzooDecoderConfig, {"final_logit_softcapping": 30.0, "num_softmaxes": 2}, "num_softmaxes=2"),
        (
            HfzooDecoderConfig,
            {"final_logit_softcapping": 30.0, "adaptive_softmax_cutoffs": [20, 50], "tie_word_embeddings": False},
            "adaptive_softmax_cutoffs",
        ),
    ],
)
def test_bad_configurations_are_refused(config_class, overrides, match):
    with pytest.raises(StrictDataclassClassValidationError, match=match):
        config_class(**{**TINY, **overrides})


@pytest.mark.parametrize("option, value", [("qk_norm", "rms_norm"), ("attn_logit_softcapping", 50.0)])
@pytest.mark.parametrize("mixer", [name for name, entry in TOKEN_MIXERS.items() if not entry.score_options])
def test_mixers_without_queries_and_keys_refuse_the_score_options(mixer, option, value):
    """Each mixer whose entry does not list an option refuses it, naming the option, the mixer and who applies it."""
    with pytest.raises(StrictDataclassClassValidationError, match=f"{option}=.* token_mixer='{mixer}' does not apply"):
        HfzooEncoderConfig(**{**TINY, "token_mixer": mixer, option: value})
