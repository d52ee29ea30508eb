"""Position schemes and attention options: numerics against references, cached decoding, backends, validation."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.variant_checks import TINY
from huggingface_hub.errors import StrictDataclassClassValidationError
from transformers import LlamaConfig, T5Config
from transformers.models.bloom.modeling_bloom import _get_alibi_slopes
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as llama_apply_rotary_pos_emb
from transformers.models.t5.modeling_t5 import T5Attention

from hfzoo import (
    HfzooDecoderConfig,
    HfzooDecoderForCausalLM,
    HfzooEncoderConfig,
    HfzooEncoderDecoderConfig,
    HfzooEncoderDecoderForConditionalGeneration,
    HfzooEncoderForMaskedLM,
)
from hfzoo.compat import output_cache
from hfzoo.modules.attention import shaw_attention_forward
from hfzoo.modules.positions import (
    POSITION_ATTENTION_BACKENDS,
    POSITION_EMBEDDING_TYPES,
    AlibiBias,
    RelativeAttentionBias,
    RotaryEmbedding,
    alibi_slopes,
    apply_rotary_pos_emb,
    relative_position_bucket,
)


def tiny(config_class, model_class, attn="eager", seed=0, **overrides):
    torch.manual_seed(seed)
    model = model_class(config_class(**{**TINY, **overrides}))
    model.set_attn_implementation(attn)
    return model.eval()


# ------------------------------------------------------------------------------------------ T5 relative bias


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (8, 6), (10, 20)])
def test_relative_position_bucket_matches_t5(bidirectional, num_buckets, max_distance):
    relative = torch.arange(-300, 301)[None, :] + torch.zeros(2, 1, dtype=torch.long)
    ours = relative_position_bucket(relative, bidirectional, num_buckets, max_distance)
    theirs = T5Attention._relative_position_bucket(relative, bidirectional, num_buckets, max_distance)
    assert torch.equal(ours, theirs)
    assert ours.min() >= 0 and ours.max() == num_buckets - 1  # every distance class is reached


@pytest.mark.parametrize("is_decoder", [False, True])
@pytest.mark.parametrize("q_len, kv_len", [(9, 9), (1, 12), (3, 10)])  # full, one cached step, a cached chunk
def test_relative_attention_bias_matches_t5_compute_bias(is_decoder, q_len, kv_len):
    t5 = T5Config(num_heads=4, d_model=32, d_kv=8, relative_attention_num_buckets=8, relative_attention_max_distance=6)
    t5.is_decoder = is_decoder
    reference = T5Attention(t5, has_relative_attention_bias=True, layer_idx=0)
    torch.nn.init.normal_(reference.relative_attention_bias.weight)
    config = HfzooDecoderConfig(
        **TINY,
        position_embedding_type="relative_attention_bias",
        relative_attention_num_buckets=8,
        relative_attention_max_distance=6,
    )
    ours = RelativeAttentionBias(config, bidirectional=not is_decoder)
    ours.weight.data.copy_(reference.relative_attention_bias.weight)
    query_positions, key_positions = torch.arange(kv_len - q_len, kv_len), torch.arange(kv_len)
    expected = reference.compute_bias(q_len, kv_len, past_seen_tokens=kv_len - q_len)
    assert torch.equal(ours(query_positions, key_positions), expected)


def test_shared_bias_is_one_table_per_stack_and_unshared_one_per_layer():
    shared = tiny(
        HfzooEncoderDecoderConfig,
        HfzooEncoderDecoderForConditionalGeneration,
        position_embedding_type="relative_attention_bias",
    )
    keys = [k for k in shared.state_dict() if "relative_attention_bias" in k]
    assert keys == ["model.encoder.relative_attention_bias.weight", "model.decoder.relative_attention_bias.weight"]
    assert shared.model.encoder.relative_attention_bias.bidirectional
    assert not shared.model.decoder.relative_attention_bias.bidirectional
    per_layer = tiny(
        HfzooDecoderConfig,
        HfzooDecoderForCausalLM,
        position_embedding_type="relative_attention_bias",
        share_relative_attention_bias=False,
    )
    keys = [k for k in per_layer.state_dict() if "relative_attention_bias" in k]
    assert keys == [f"model.layers.{i}.self_attn.relative_attention_bias.weight" for i in range(2)]


def test_relative_bias_changes_the_scores_and_its_gradient_flows():
    model = tiny(HfzooEncoderConfig, HfzooEncoderForMaskedLM, position_embedding_type="relative_attention_bias")
    ids = torch.randint(2, 97, (1, 10))
    before = model(ids).logits
    with torch.no_grad():
        model.model.relative_attention_bias.weight.normal_(std=3.0)
    assert not torch.allclose(before, model(ids).logits)


# ------------------------------------------------------------------------------------------ rotary


def test_rotary_matches_llama():
    head_dim, theta = 16, 500.0
    config = HfzooDecoderConfig(**TINY, head_dim=head_dim, position_embedding_type="rotary", rope_theta=theta)
    llama = LlamaConfig(
        hidden_size=64,
        num_attention_heads=4,
        head_dim=head_dim,
        rope_parameters={"rope_type": "default", "rope_theta": theta},
    )
    position_ids = torch.tensor([[0, 1, 2, 5, 9, 40], [3, 4, 5, 6, 7, 8]])
    x = torch.randn(2, 4, 6, head_dim)  # (batch, heads, seq, head_dim)
    hidden = torch.zeros(2, 6, 64)
    cos, sin = RotaryEmbedding(config)(position_ids)
    ref_cos, ref_sin = LlamaRotaryEmbedding(llama)(hidden, position_ids)
    torch.testing.assert_close(cos, ref_cos, rtol=0, atol=1e-6)
    torch.testing.assert_close(sin, ref_sin, rtol=0, atol=1e-6)
    q, k = apply_rotary_pos_emb(x, x.flip(0), cos, sin)
    ref_q, ref_k = llama_apply_rotary_pos_emb(x, x.flip(0), ref_cos, ref_sin)
    torch.testing.assert_close(q, ref_q, rtol=0, atol=1e-6)
    torch.testing.assert_close(k, ref_k, rtol=0, atol=1e-6)


def test_rotary_scores_depend_only_on_the_distance():
    config = HfzooDecoderConfig(**TINY, position_embedding_type="rotary")
    rotary = RotaryEmbedding(config)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(m: int, n: int) -> torch.Tensor:
        cos_m, sin_m = rotary(torch.tensor([[m]]))
        cos_n, sin_n = rotary(torch.tensor([[n]]))
        return (apply_rotary_pos_emb(q, q, cos_m, sin_m)[0] * apply_rotary_pos_emb(k, k, cos_n, sin_n)[1]).sum()

    torch.testing.assert_close(score(7, 3), score(20, 16), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(score(0, 0), (q * k).sum())  # position 0 is no rotation
    assert not torch.allclose(score(7, 3), score(3, 7))


# ------------------------------------------------------------------------------------------ ALiBi


@pytest.mark.parametrize("num_heads", [1, 3, 4, 6, 8, 12, 16])
def test_alibi_slopes_match_bloom(num_heads):
    torch.testing.assert_close(alibi_slopes(num_heads), _get_alibi_slopes(num_heads, torch.device("cpu")))


def test_alibi_slopes_are_the_papers_geometric_sequence():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0**-i for i in range(1, 9)]))


def test_alibi_bias_is_minus_slope_times_distance():
    config = HfzooDecoderConfig(**TINY, position_embedding_type="alibi")
    bias = AlibiBias(config)(torch.tensor([3, 4]), torch.arange(5))
    slopes = alibi_slopes(4)
    expected = torch.tensor([[abs(i - j) for j in range(5)] for i in (3, 4)], dtype=torch.float32)
    torch.testing.assert_close(bias, -slopes[None, :, None, None] * expected)


# ------------------------------------------------------------------------------------------ Shaw


def test_shaw_attention_matches_the_papers_equations_written_out():
    torch.manual_seed(0)
    batch, heads, q_len, kv_len, dim, k = 2, 3, 4, 6, 5, 2
    q, key, v = (
        torch.randn(batch, heads, q_len, dim),
        torch.randn(batch, heads, kv_len, dim),
        torch.randn(batch, heads, kv_len, dim),
    )
    table_k, table_v = torch.randn(2 * k + 1, dim), torch.randn(2 * k + 1, dim)
    q_pos = torch.arange(kv_len - q_len, kv_len)
    clip = lambda i, j: min(max(j - int(q_pos[i]), -k), k) + k  # noqa: E731
    a_k = torch.stack([torch.stack([table_k[clip(i, j)] for j in range(kv_len)]) for i in range(q_len)])
    a_v = torch.stack([torch.stack([table_v[clip(i, j)] for j in range(kv_len)]) for i in range(q_len)])
    mask = torch.zeros(batch, 1, q_len, kv_len)
    mask[0, :, :, 0] = torch.finfo(torch.float32).min
    module = torch.nn.Module().eval()
    out, weights = shaw_attention_forward(module, q, key, v, mask, 0.5, a_k, a_v)
    expected = torch.zeros(batch, q_len, heads, dim)
    for b in range(batch):
        for h in range(heads):
            for i in range(q_len):
                e = torch.stack([(q[b, h, i] * (key[b, h, j] + a_k[i, j])).sum() * 0.5 for j in range(kv_len)])
                e = e + mask[b, 0, i]
                p = torch.softmax(e, dim=-1)
                torch.testing.assert_close(weights[b, h, i], p)
                expected[b, i, h] = sum(p[j] * (v[b, h, j] + a_v[i, j]) for j in range(kv_len))
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_shaw_tables_are_per_layer_and_clipped():
    model = tiny(HfzooDecoderConfig, HfzooDecoderForCausalLM, position_embedding_type="shaw", max_relative_positions=3)
    tables = {k: v.shape for k, v in model.state_dict().items() if "relative_positions" in k}
    assert tables == {
        f"model.layers.{i}.self_attn.relative_positions.{kind}_embeddings.weight": (7, 8)
        for i in range(2)
        for kind in ("key", "value")
    }


# ------------------------------------------------------------------------------------------ scaling options


@pytest.mark.parametrize("kind", ["learned", "relative_attention_bias", "rotary"])
def test_unscaled_attention_equals_scaled_attention_with_rescaled_queries(kind):
    scaled = tiny(HfzooDecoderConfig, HfzooDecoderForCausalLM, position_embedding_type=kind)
    unscaled = tiny(
        HfzooDecoderConfig, HfzooDecoderForCausalLM, position_embedding_type=kind, scale_attention_scores=False
    )
    state = scaled.state_dict()
    head_dim = scaled.config.head_dim
    for key in list(state):
        if "q_proj" in key:
            state[key] = state[key] * head_dim**-0.5
    unscaled.load_state_dict(state)
    ids = torch.randint(2, 97, (2, 9))
    torch.testing.assert_close(unscaled(ids).logits, scaled(ids).logits, rtol=1e-5, atol=1e-5)
    unscaled.load_state_dict(scaled.state_dict())  # same weights, scores no longer scaled: different logits
    assert not torch.allclose(unscaled(ids).logits, scaled(ids).logits, rtol=1e-3, atol=1e-3)


def test_unscaled_attention_folds_the_scaling_into_the_query_initialisation():
    fields = {**TINY, "hidden_size": 128, "num_attention_heads": 2, "initializer_range": 0.1}
    model = HfzooDecoderForCausalLM(HfzooDecoderConfig(**fields, scale_attention_scores=False))
    q_std = model.model.layers[0].self_attn.q_proj.weight.std().item()
    k_std = model.model.layers[0].self_attn.k_proj.weight.std().item()
    assert abs(q_std / (0.1 * 64**-0.5) - 1) < 0.05, q_std
    assert abs(k_std / 0.1 - 1) < 0.05, k_std


@pytest.mark.parametrize(
    "config_class, model_class",
    [
        (HfzooDecoderConfig, HfzooDecoderForCausalLM),
        (HfzooEncoderConfig, HfzooEncoderForMaskedLM),
        (HfzooEncoderDecoderConfig, HfzooEncoderDecoderForConditionalGeneration),
    ],
)
def test_scale_lm_head_input_scales_what_enters_the_vocabulary_projection(config_class, model_class):
    plain = tiny(config_class, model_class)
    scaled = tiny(config_class, model_class, scale_lm_head_input=True)
    scaled.load_state_dict(plain.state_dict())
    ids = torch.randint(2, 97, (2, 7))
    kwargs = {"decoder_input_ids": ids[:, :4]} if model_class is HfzooEncoderDecoderForConditionalGeneration else {}
    with torch.no_grad():
        a, b = plain(ids, **kwargs).logits, scaled(ids, **kwargs).logits
    bias = plain.lm_head.decoder.bias if model_class is HfzooEncoderForMaskedLM else 0.0
    torch.testing.assert_close(b - bias, (a - bias) * 32**-0.5, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------------------ cached decoding


@pytest.mark.parametrize("kind", POSITION_EMBEDDING_TYPES)
def test_incremental_decoding_matches_full_forward_decoder(kind):
    attn = "sdpa" if "sdpa" in POSITION_ATTENTION_BACKENDS[kind] else "eager"
    model = tiny(HfzooDecoderConfig, HfzooDecoderForCausalLM, attn, position_embedding_type=kind)
    torch.manual_seed(1)
    ids = torch.randint(2, 97, (2, 10))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding in one row
    with torch.no_grad():
        full = model(ids, attention_mask=mask).logits
        out = model(ids[:, :4], attention_mask=mask[:, :4], use_cache=True)
        steps = [out.logits]
        for t in range(4, 10):
            out = model(ids[:, t : t + 1], attention_mask=mask[:, : t + 1], cache=output_cache(out))
            steps.append(out.logits)
    valid = mask.bool()
    torch.testing.assert_close(torch.cat(steps, dim=1)[valid], full[valid], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", POSITION_EMBEDDING_TYPES)
def test_incremental_decoding_matches_full_forward_encoder_decoder(kind):
    attn = "sdpa" if "sdpa" in POSITION_ATTENTION_BACKENDS[kind] else "eager"
    model = tiny(
        HfzooEncoderDecoderConfig, HfzooEncoderDecoderForConditionalGeneration, attn, position_embedding_type=kind
    )
    torch.manual_seed(2)
    src, tgt = torch.randint(2, 97, (2, 9)), torch.randint(2, 97, (2, 6))
    src_mask = torch.ones_like(src)
    src_mask[1, 6:] = 0
    with torch.no_grad():
        full = model(src, attention_mask=src_mask, decoder_input_ids=tgt).logits
        encoder_outputs = model.get_encoder()(src, attention_mask=src_mask)
        out = model(
            encoder_outputs=encoder_outputs, attention_mask=src_mask, decoder_input_ids=tgt[:, :2], use_cache=True
        )
        steps = [out.logits]
        for t in range(2, 6):
            out = model(
                encoder_outputs=encoder_outputs,
                attention_mask=src_mask,
                decoder_input_ids=tgt[:, t : t + 1],
                cache=output_cache(out),
            )
            steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", ["relative_attention_bias", "shaw", "rotary", "alibi"])
def test_greedy_generation_same_with_and_without_cache(kind):
    attn = "sdpa" if "sdpa" in POSITION_ATTENTION_BACKENDS[kind] else "eager"
    decoder = tiny(HfzooDecoderConfig, HfzooDecoderForCausalLM, attn, position_embedding_type=kind)
    seq2seq = tiny(
        HfzooEncoderDecoderConfig, HfzooEncoderDecoderForConditionalGeneration, attn, position_embedding_type=kind
    )
    ids = torch.randint(2, 97, (2, 5))
    for model in (decoder, seq2seq):
        # At init greedy decoding repeats the last token whatever position the cache gives it: no token twice,
        # and the logits of every step compared.
        kwargs = dict(max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=None, no_repeat_ngram_size=1)
        kwargs.update(output_logits=True, return_dict_in_generate=True)
        cached = model.generate(ids, use_cache=True, **kwargs)
        uncached = model.generate(ids, use_cache=False, **kwargs)
        assert torch.equal(cached.sequences, uncached.sequences)
        torch.testing.assert_close(torch.stack(cached.logits), torch.stack(uncached.logits), rtol=1e-4, atol=1e-5)


# ------------------------------------------------------------------------------------------ backends


def test_backends_follow_the_position_scheme():
    shaw = tiny(HfzooDecoderConfig, HfzooDecoderForCausalLM, attn="eager", position_embedding_type="shaw")
    assert HfzooDecoderForCausalLM(shaw.config).config._attn_implementation == "eager"  # default falls back
    with pytest.raises(ValueError, match="scaled_dot_product_attention"):
        shaw.set_attn_implementation("sdpa")
    with pytest.raises(ValueError, match="flex_attention"):
        shaw.set_attn_implementation("flex_attention")
    alibi = tiny(HfzooDecoderConfig, HfzooDecoderForCausalLM, attn="sdpa", position_embedding_type="alibi")
    with pytest.raises(ValueError, match="Flash Attention 2"):
        alibi.set_attn_implementation("flash_attention_2")
    alibi.set_attn_implementation("flex_attention")  # the score bias as a FlexAttention score_mod
    assert alibi.config._attn_implementation == "flex_attention"
    assert tiny(HfzooDecoderConfig, HfzooDecoderForCausalLM, attn="sdpa", position_embedding_type="rotary")


# ------------------------------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"position_embedding_type": "rotary", "head_dim": 7}, "head_dim"),
        ({"position_embedding_type": "alibi", "rope_theta": 500.0}, "rope_theta"),
        (
            {"position_embedding_type": "rotary", "share_relative_attention_bias": False},
            "share_relative_attention_bias",
        ),
        (
            {"position_embedding_type": "learned", "relative_attention_num_buckets": 64},
            "relative_attention_num_buckets",
        ),
        ({"position_embedding_type": "relative_attention_bias", "max_relative_positions": 4}, "max_relative_positions"),
        ({"position_embedding_type": "shaw", "relative_attention_max_distance": 64}, "relative_attention_max_distance"),
        (
            {"position_embedding_type": "relative_attention_bias", "relative_attention_num_buckets": 2},
            "relative_attention_num_buckets",
        ),
        (
            {
                "position_embedding_type": "relative_attention_bias",
                "relative_attention_num_buckets": 32,
                "relative_attention_max_distance": 16,
            },
            "relative_attention_max_distance",
        ),
        ({"position_embedding_type": "shaw", "max_relative_positions": 0}, "max_relative_positions"),
        ({"position_embedding_type": "rotary", "rope_theta": -1.0}, "rope_theta"),
        ({"position_embedding_type": "t5"}, "position_embedding_type"),
        ({"scale_attention_scores": "yes"}, "scale_attention_scores"),
    ],
)
def test_invalid_position_settings_are_refused_naming_the_field(overrides, field):
    for config_class in (HfzooDecoderConfig, HfzooEncoderConfig, HfzooEncoderDecoderConfig):
        with pytest.raises((ValueError, StrictDataclassClassValidationError, TypeError), match=field):
            config_class(**{**TINY, **overrides})


def test_valid_scheme_fields_are_accepted():
    HfzooDecoderConfig(**TINY, position_embedding_type="rotary", rope_theta=500.0)
    HfzooDecoderConfig(**TINY, position_embedding_type="shaw", max_relative_positions=4)
    HfzooDecoderConfig(
        **TINY,
        position_embedding_type="relative_attention_bias",
        relative_attention_num_buckets=16,
        relative_attention_max_distance=9,
        share_relative_attention_bias=False,
    )
    assert math.isclose(HfzooDecoderConfig(**TINY).rope_theta, 10000.0)
