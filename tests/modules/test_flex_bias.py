"""T5's relative bias and ALiBi on FlexAttention: the score_mod form equals eager, forward and gradients.

`flex_attention` adds a score bias in a FlexAttention `score_mod` (`hfzoo.modules.positions.RelativeScoreBias`,
`hfzoo.modules.attention.flex_score_bias_attention_forward`) instead of a dense `(q_len, kv_len)` bias.

On the CPU, PyTorch 2.13 runs FlexAttention's forward (compiled by inductor, as transformers' flex path does)
but refuses its backward (`torch.nn.attention.flex_attention._validate_device`), and inductor's CPU backend
has no backward kernel. The gradient tests therefore run FlexAttention's reference implementation (the
uncompiled higher-order op, whose autograd is the math the CUDA kernel implements) with that one check
lifted (`flex_reference_backward`); on CUDA they run the compiled kernel unpatched.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from helpers.variant_checks import (
    FAMILIES,
    TINY,
    check_cached_generation,
    generation_prompt,
    make_batch,
    run,
    valid_logits,
)
from torch.nn.attention import flex_attention as torch_flex
from torch.nn.attention.flex_attention import create_block_mask
from transformers.integrations import flex_attention as transformers_flex

from hfzoo import (
    HfzooDecoderConfig,
    HfzooEncoderConfig,
)
from hfzoo.compat import output_cache
from hfzoo.modules.attention import add_bias_to_mask, eager_attention_forward, flex_score_bias_attention_forward
from hfzoo.modules.positions import (
    POSITION_ATTENTION_BACKENDS,
    AlibiBias,
    RelativeAttentionBias,
    RelativeScoreBias,
    repeat_score_bias_heads,
    score_bias,
)

#: Few buckets and a short max distance, so the 11-token batches reach the logarithmic and the last bucket.
T5_SMALL = {
    "position_embedding_type": "relative_attention_bias",
    "relative_attention_num_buckets": 8,
    "relative_attention_max_distance": 6,
}
SCHEMES = {
    "t5": T5_SMALL,
    "t5-per-layer": {**T5_SMALL, "share_relative_attention_bias": False},
    "alibi": {"position_embedding_type": "alibi", "num_attention_heads": 3, "head_dim": 8},  # not a power of 2
}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def build(family: str, overrides: dict, attn: str, seed: int = 0):
    config_class, model_class = FAMILIES[family]
    torch.manual_seed(seed)
    model = model_class(config_class(**{**TINY, **overrides}))
    model.set_attn_implementation(attn)
    return model.eval()


@pytest.fixture
def flex_reference_backward(monkeypatch):
    """On the CPU, run FlexAttention uncompiled (its reference op) with its CPU-backward check lifted."""
    if DEVICE != "cpu":
        return

    def uncompiled(query, key, value, training=False, **kwargs):
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
            return torch_flex.flex_attention(query, key, value, **kwargs)

    monkeypatch.setattr(torch_flex, "_validate_device", lambda *args: None)
    monkeypatch.setattr(transformers_flex, "compile_friendly_flex_attention", uncompiled)


def t5_bias(bidirectional: bool, num_heads: int = 4) -> RelativeAttentionBias:
    config = HfzooEncoderConfig(
        **{**TINY, **T5_SMALL, "num_attention_heads": num_heads, "head_dim": 8, "hidden_size": 8 * num_heads}
    )
    bias = RelativeAttentionBias(config, bidirectional=bidirectional)
    torch.nn.init.normal_(bias.weight)
    return bias


def alibi_bias(num_heads: int = 3) -> AlibiBias:
    return AlibiBias(HfzooEncoderConfig(**{**TINY, "num_attention_heads": num_heads, "head_dim": 8}))


# ------------------------------------------------------------------------------------------ the score_mod form


@pytest.mark.parametrize("scheme", ["t5-bidirectional", "t5-causal", "alibi"])
@pytest.mark.parametrize(
    "q_len, kv_len, query_offset, query_stride, key_stride",
    [(11, 11, 0, 1, 1), (1, 17, 16, 1, 1), (3, 20, 5, 1, 1), (4, 9, 0, 2, 1), (3, 5, 0, 4, 2)],
)
def test_relative_score_bias_equals_the_dense_bias(scheme, q_len, kv_len, query_offset, query_stride, key_stride):
    """Past the max distance (6) too: clipping the relative position keeps T5's last bucket."""
    bias = alibi_bias() if scheme == "alibi" else t5_bias(bidirectional=scheme == "t5-bidirectional")
    query_positions = torch.arange(q_len) * query_stride + query_offset
    dense = bias(query_positions, torch.arange(kv_len) * key_stride)
    relative = bias.relative_score_bias(query_offset, query_stride, key_stride)
    assert torch.equal(relative.dense(q_len, kv_len), dense)
    # the score_mod adds the same bias, score by score
    score_mod = relative.score_mod()
    h, q, kv = torch.meshgrid(torch.arange(dense.shape[1]), torch.arange(q_len), torch.arange(kv_len), indexing="ij")
    added = score_mod(torch.zeros(()), torch.zeros((), dtype=torch.int32), h, q.int(), kv.int())
    assert torch.equal(added, dense[0])


def test_score_bias_picks_the_form_from_the_backend():
    bias = t5_bias(bidirectional=False)
    config = HfzooDecoderConfig(**TINY)
    for attn, form in (("eager", torch.Tensor), ("sdpa", torch.Tensor), ("flex_attention", RelativeScoreBias)):
        config._attn_implementation = attn
        assert isinstance(score_bias(bias, config, 3, 7, query_offset=4), form)


def test_the_table_size_depends_on_the_config_not_the_length():
    short = t5_bias(bidirectional=True).relative_score_bias(query_offset=0)
    assert short.table.shape == (4, 2 * T5_SMALL["relative_attention_max_distance"] + 1)
    assert alibi_bias().relative_score_bias().slopes.shape == (3,)


def test_repeated_heads_equal_the_concatenated_dense_bias():
    for bias in (t5_bias(bidirectional=False), alibi_bias()):
        relative = bias.relative_score_bias(query_offset=2)
        repeated = repeat_score_bias_heads(relative, 2)
        assert repeated.num_heads == 2 * relative.num_heads
        assert torch.equal(repeated.dense(3, 5), repeat_score_bias_heads(relative.dense(3, 5), 2))
    assert repeat_score_bias_heads(None, 2) is None


def test_a_bias_needs_a_table_or_slopes():
    with pytest.raises(ValueError, match="table, slopes or both"):
        RelativeScoreBias()


# ------------------------------------------------------------------------------------------ the attention function


@pytest.mark.parametrize("scheme", ["t5-bidirectional", "t5-causal", "alibi"])
def test_flex_attention_function_matches_eager_forward_and_gradients(scheme, flex_reference_backward):
    """Outputs and the gradients of queries, keys, values and T5's table, with padding (and causality)."""
    causal = scheme != "t5-bidirectional"
    bias = (alibi_bias(4) if scheme == "alibi" else t5_bias(bidirectional=not causal)).to(DEVICE)
    batch, heads, q_len, head_dim, past = 2, 4, 9, 8, 3
    kv_len = past + q_len
    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(batch, heads, n, head_dim, generator=g).to(DEVICE) for n in (q_len, kv_len, kv_len)]
    keep = torch.ones(batch, kv_len, dtype=torch.bool, device=DEVICE)
    keep[1, -4:] = False  # right padding of the second row

    def allowed(b, h, q_idx, kv_idx):
        return keep[b, kv_idx] & ((kv_idx <= q_idx + past) if causal else (kv_idx >= 0))

    rows = torch.arange(batch, device=DEVICE)[:, None, None, None]
    q_idx = torch.arange(q_len, device=DEVICE)[None, None, :, None]
    kv_idx = torch.arange(kv_len, device=DEVICE)[None, None, None, :]
    mask = allowed(rows, None, q_idx, kv_idx)  # (batch, 1, q_len, kv_len) bool
    block_mask = create_block_mask(allowed, batch, None, q_len, kv_len, device=DEVICE)
    module = torch.nn.Module().eval()
    results = []
    for backend in ("eager", "flex"):
        bias.zero_grad()
        query, key, value = (t.clone().requires_grad_() for t in inputs)
        query_positions = torch.arange(q_len, device=DEVICE) + past
        if backend == "eager":
            dense = bias(query_positions, torch.arange(kv_len, device=DEVICE))
            additive = add_bias_to_mask(mask, dense, query.dtype)
            output, _ = eager_attention_forward(module, query, key, value, additive, scaling=head_dim**-0.5)
        else:
            relative = bias.relative_score_bias(query_offset=past, device=DEVICE)
            output, weights = flex_score_bias_attention_forward(
                module, query, key, value, block_mask, head_dim**-0.5, relative
            )
            assert weights is None
        output.square().sum().backward()
        grads = [query.grad, key.grad, value.grad] + ([bias.weight.grad] if scheme != "alibi" else [])
        results.append((output.detach(), grads))
    (eager, eager_grads), (flex, flex_grads) = results
    torch.testing.assert_close(flex, eager, rtol=0, atol=1e-5)
    for ours, reference in zip(flex_grads, eager_grads, strict=True):
        assert ours is not None and reference.abs().max() > 0
        torch.testing.assert_close(ours, reference, rtol=0, atol=1e-5)


def test_flex_attention_function_refuses_dropout_and_a_head_mismatch():
    query = torch.randn(1, 3, 4, 8)
    relative = alibi_bias(3).relative_score_bias()
    with pytest.raises(ValueError, match="attention_probs_dropout_prob=0"):
        flex_score_bias_attention_forward(torch.nn.Module(), query, query, query, None, 1.0, relative, dropout=0.1)
    with pytest.raises(ValueError, match="2 heads for 3 attention heads"):
        flex_score_bias_attention_forward(
            torch.nn.Module(), query, query, query, None, 1.0, alibi_bias(2).relative_score_bias()
        )


# ------------------------------------------------------------------------------------------ models


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_flex_model_matches_eager_forward(family, scheme):
    """Logits on a right-padded batch (encoder-decoder: self-attention of both sides, cross-attention unbiased)."""
    batch = make_batch(family)
    with torch.no_grad():
        eager = valid_logits(family, batch, run(build(family, SCHEMES[scheme], "eager"), batch).logits)
        model = build(family, SCHEMES[scheme], "flex_attention")
        assert model.config._attn_implementation == "flex_attention"
        flex = valid_logits(family, batch, run(model, batch).logits)
    assert (flex - eager).abs().max() < 1e-5


@pytest.mark.parametrize(
    "family, overrides",
    [
        # pooled queries and keys: the score_mod's strides (1, 2, 4)
        ("encoder", {**T5_SMALL, "layer_stack": "funnel", "num_hidden_layers": 3, "funnel_block_sizes": [1, 1, 1]}),
        # the decoder cell's 2H-head attention: the shared bias repeated over heads
        ("decoder", {"layer_type": "evolved_transformer", "position_embedding_type": "alibi"}),
    ],
    ids=["funnel-t5", "evolved-alibi"],
)
def test_flex_matches_eager_in_other_layer_stacks(family, overrides):
    batch = make_batch(family)
    with torch.no_grad():
        eager = valid_logits(family, batch, run(build(family, overrides, "eager"), batch).logits)
        flex = valid_logits(family, batch, run(build(family, overrides, "flex_attention"), batch).logits)
    assert (flex - eager).abs().max() < 1e-5


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("scheme", ["t5", "alibi"])
def test_flex_model_matches_eager_gradients(family, scheme, flex_reference_backward):
    """The loss's gradients of every parameter (T5's table included) and of the input embeddings."""
    batch = make_batch(family)
    grads = {}
    for attn in ("eager", "flex_attention"):
        model = build(family, SCHEMES[scheme], attn).to(DEVICE)  # eval mode: no dropout, gradients on
        embeds = model.get_input_embeddings()(batch.input_ids.to(DEVICE)).detach().requires_grad_()
        kwargs = {"labels": batch.labels.to(DEVICE), "attention_mask": batch.attention_mask.to(DEVICE)}
        if batch.decoder_input_ids is not None:
            kwargs["decoder_input_ids"] = batch.decoder_input_ids.to(DEVICE)
        model(inputs_embeds=embeds, **kwargs).loss.backward()
        grads[attn] = {"inputs_embeds": embeds.grad, **{n: p.grad for n, p in model.named_parameters()}}
    biased = [name for name in grads["eager"] if "relative_attention_bias" in name]
    assert bool(biased) == (scheme == "t5")
    for name, reference in grads["eager"].items():
        if reference is None:
            assert grads["flex_attention"][name] is None, name
            continue
        torch.testing.assert_close(grads["flex_attention"][name], reference, rtol=0, atol=1e-5, msg=name)
    for name in biased:
        assert grads["eager"][name].abs().max() > 0, name


@pytest.mark.parametrize("scheme", ["t5", "alibi"])
def test_flex_incremental_decoding_matches_eager_full_forward(scheme):
    """With a KV cache the queries sit at `past_len + i`: token-by-token flex logits equal eager's full pass."""
    ids = torch.randint(2, TINY["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(0))
    decoder_flex = build("decoder", SCHEMES[scheme], "flex_attention")
    seq2seq_flex = build("encoder-decoder", SCHEMES[scheme], "flex_attention")
    with torch.no_grad():
        full = build("decoder", SCHEMES[scheme], "eager")(ids).logits
        out, steps = decoder_flex(ids[:, :4], use_cache=True), []
        steps.append(out.logits)
        for t in range(4, ids.shape[1]):
            out = decoder_flex(ids[:, t : t + 1], cache=output_cache(out), use_cache=True)
            steps.append(out.logits)
        assert (torch.cat(steps, dim=1) - full).abs().max() < 1e-5

        src, tgt = ids[:, :7], ids[:, 2:]
        full = build("encoder-decoder", SCHEMES[scheme], "eager")(src, decoder_input_ids=tgt).logits
        encoder_outputs = seq2seq_flex.get_encoder()(src)
        out, steps = None, []
        for t in range(tgt.shape[1]):
            cache = None if out is None else output_cache(out)
            out = seq2seq_flex(encoder_outputs=encoder_outputs, decoder_input_ids=tgt[:, t : t + 1], cache=cache)
            steps.append(out.logits)
        assert (torch.cat(steps, dim=1) - full).abs().max() < 1e-5


@pytest.mark.parametrize("family", ["decoder", "encoder-decoder"])
def test_flex_greedy_generation_equals_eager(family):
    """Left-padded decoder prompts / right-padded sources; cached flex generation gives eager's tokens and logits."""
    prompt, mask = generation_prompt(family)
    flex, eager = build(family, T5_SMALL, "flex_attention"), build(family, T5_SMALL, "eager")
    check_cached_generation(flex, prompt, mask, reference=eager)  # the logits of every step, no token twice


def test_flex_is_offered_to_score_biases_and_refused_to_shaw():
    assert "flex_attention" in POSITION_ATTENTION_BACKENDS["relative_attention_bias"]
    assert "flex_attention" in POSITION_ATTENTION_BACKENDS["alibi"]
    shaw = build("decoder", {"position_embedding_type": "shaw"}, "eager")
    with pytest.raises(ValueError, match="flex_attention"):
        shaw.set_attn_implementation("flex_attention")


def test_flex_refuses_attention_dropout_in_training():
    model = build("encoder", {**T5_SMALL, "attention_probs_dropout_prob": 0.1}, "flex_attention").train()
    batch = make_batch("encoder")
    with torch.no_grad(), pytest.raises(ValueError, match="attention_probs_dropout_prob=0"):
        run(model, batch)
