"""Grouped-query attention (`num_key_value_heads`, Ainslie et al. 2023) against multi-head attention.

A model with G query heads per key/value head computes what the multi-head model computes when each of its key
and value heads is repeated G times (transformers' `repeat_kv`): checked on every attention backend that runs on
the CPU and with every position scheme acting inside attention, in the three families (cross-attention
included). The KV cache holds the key/value heads only and incremental decoding equals the full forward pass;
parameter and FLOP counts drop by the missing key/value projections; bad values and mixers that do not group
heads are refused when the config is built.
"""

from __future__ import annotations

import pytest
import torch
from helpers.variant_checks import FAMILIES, TINY, check_cached_generation, make_batch, run, valid_logits
from huggingface_hub.errors import StrictDataclassClassValidationError
from transformers.cache_utils import DynamicCache

from hfzoo import HfzooDecoderConfig, HfzooDecoderForCausalLM, HfzooEncoderDecoderConfig
from hfzoo.models.flops import count_training_flops, weights_per_token
from hfzoo.models.presets import build_config
from hfzoo.modules.attention import key_value_heads
from hfzoo.modules.mixers import TOKEN_MIXERS

HEADS, KV_HEADS = 4, 2  # TINY: hidden 32, 4 heads of 8


def _repeat_heads(weight: torch.Tensor, kv_heads: int, groups: int) -> torch.Tensor:
    """`(kv_heads * head_dim, ...)` rows -> `(kv_heads * groups * head_dim, ...)`, head j repeated `groups` times."""
    per_head = weight.view(kv_heads, -1, *weight.shape[1:])
    return per_head.repeat_interleave(groups, dim=0).reshape(-1, *weight.shape[1:])


def grouped_and_multi_head(family: str, attn: str, **overrides):
    """A random grouped-query model and the multi-head model with its key/value heads repeated."""
    config_class, model_class = FAMILIES[family]
    fields = {**TINY, "num_attention_heads": HEADS, **overrides}
    torch.manual_seed(0)
    grouped = model_class(config_class(**fields, num_key_value_heads=KV_HEADS)).eval()
    multi = model_class(config_class(**fields)).eval()
    state = {}
    for key, value in grouped.state_dict().items():
        if ".k_proj." in key or ".v_proj." in key:
            value = _repeat_heads(value, KV_HEADS, HEADS // KV_HEADS)
        state[key] = value
    multi.load_state_dict(state, strict=True)
    for model in (grouped, multi):
        model.set_attn_implementation(attn)
    return grouped, multi


@pytest.mark.parametrize(
    "attn, position",
    [
        ("eager", "rotary"),
        ("sdpa", "rotary"),
        ("flex_attention", "rotary"),  # transformers' flex path (its own GQA handling)
        ("eager", "alibi"),
        ("sdpa", "relative_attention_bias"),
        ("flex_attention", "alibi"),  # hfzoo's score_mod path (flex_score_bias_attention_forward)
        ("eager", "shaw"),  # shaw_attention_forward
        ("sdpa", "learned"),
    ],
)
def test_grouped_query_attention_equals_multi_head_with_repeated_key_value_heads(attn, position):
    grouped, multi = grouped_and_multi_head("decoder", attn, position_embedding_type=position, qk_norm="rms_norm")
    assert grouped.model.layers[0].self_attn.k_proj.out_features == KV_HEADS * grouped.config.head_dim
    batch = make_batch("decoder")
    with torch.no_grad():
        expected, actual = run(multi, batch).logits, run(grouped, batch).logits
    keep = valid_logits("decoder", batch, expected)
    torch.testing.assert_close(valid_logits("decoder", batch, actual), keep, atol=1e-5, rtol=1e-5)
    # and not trivially: a grouped model whose other key/value heads were used instead differs
    with torch.no_grad():
        multi.model.layers[0].self_attn.k_proj.weight.copy_(
            _repeat_heads(grouped.model.layers[0].self_attn.k_proj.weight.flip(0), KV_HEADS, HEADS // KV_HEADS)
        )
        shuffled = run(multi, batch).logits
    assert not torch.allclose(valid_logits("decoder", batch, shuffled), keep, atol=1e-3)


@pytest.mark.parametrize("family", ["encoder", "encoder-decoder"])
def test_grouped_query_attention_in_the_other_families(family):
    """Bidirectional self-attention and the encoder-decoder's cross-attention group their key/value heads too."""
    grouped, multi = grouped_and_multi_head(family, "sdpa", position_embedding_type="rotary")
    batch = make_batch(family)
    with torch.no_grad():
        expected, actual = run(multi, batch).logits, run(grouped, batch).logits
    torch.testing.assert_close(
        valid_logits(family, batch, actual), valid_logits(family, batch, expected), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("token_mixer", ["self_attention", "sliding_window"])
def test_the_cache_holds_key_value_heads_and_equals_the_full_forward(attn, token_mixer):
    extra = {"attention_window": 4} if token_mixer == "sliding_window" else {}
    config = HfzooDecoderConfig(
        **TINY, num_key_value_heads=1, position_embedding_type="rotary", token_mixer=token_mixer, **extra
    )
    torch.manual_seed(0)
    model = HfzooDecoderForCausalLM(config).eval()
    model.set_attn_implementation(attn)
    ids = torch.randint(2, TINY["vocab_size"], (2, 10))
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        cache = DynamicCache(config=config)
        steps = [model(ids[:, :6], cache=cache, use_cache=True).logits]
        for position in range(6, 10):
            steps.append(model(ids[:, position : position + 1], cache=cache, use_cache=True).logits)
    assert cache.layers[0].keys.shape == (2, 1, 10, config.head_dim)  # one key/value head, not four
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    check_cached_generation(model, ids[:1], max_new_tokens=6)  # the same tokens and logits of every step


def test_parameter_and_flop_counts_drop_by_the_missing_key_value_projections():
    config = build_config("llama-tiny", vocab_size=97)
    multi = build_config("llama-tiny", vocab_size=97, num_key_value_heads=config.num_attention_heads)
    saved = config.num_hidden_layers * 2 * config.hidden_size * config.head_dim  # k and v, per missing head
    saved *= config.num_attention_heads - config.num_key_value_heads
    with torch.device("meta"):
        params = {c.num_key_value_heads: HfzooDecoderForCausalLM(c).num_parameters() for c in (config, multi)}
    assert params[multi.num_key_value_heads] - params[config.num_key_value_heads] == saved
    assert weights_per_token(multi, "encoder") - weights_per_token(config, "encoder") == saved
    flops, multi_flops = count_training_flops(config, 128), count_training_flops(multi, 128)
    assert multi_flops.weights - flops.weights == 6 * 128 * saved
    assert multi_flops.attention == flops.attention  # the scores are computed per query head either way


def test_cross_attention_flops_count_grouped_key_value_heads():
    fields = {**TINY, "num_attention_heads": HEADS}
    grouped = count_training_flops(HfzooEncoderDecoderConfig(**fields, num_key_value_heads=1), 16, 8)
    multi = count_training_flops(HfzooEncoderDecoderConfig(**fields), 16, 8)
    head_dim, layers, hidden = TINY["hidden_size"] // HEADS, TINY["num_hidden_layers"], TINY["hidden_size"]
    per_layer = 2 * hidden * head_dim * (HEADS - 1)  # k, v of self-attention (per token) and cross-attention
    expected = 6 * per_layer * layers * (16 + 8 + 16)  # encoder self, decoder self, cross k/v over encoder tokens
    assert multi.weights - grouped.weights == expected


def test_default_is_multi_head_and_overrides_keep_it_so(tmp_path):
    config = HfzooDecoderConfig(**TINY)
    assert config.num_key_value_heads == key_value_heads(config) == TINY["num_attention_heads"]
    assert config.to_dict()["num_key_value_heads"] == TINY["num_attention_heads"]  # an int, as peft's prefix reads
    assert build_config("decoder-tiny", "num_attention_heads=8").num_key_value_heads == 8
    config.save_pretrained(tmp_path)  # a saved multi-head checkpoint stays multi-head with other heads
    assert build_config(str(tmp_path), "num_attention_heads=8").num_key_value_heads == 8
    assert build_config("llama-tiny", "num_attention_heads=8").num_key_value_heads == 2  # GQA stays as set


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"num_key_value_heads": 3}, "num_key_value_heads=3 must divide num_attention_heads=4"),
        ({"num_key_value_heads": 0}, "num_key_value_heads must be a positive integer, got 0"),
        ({"num_key_value_heads": -2}, "num_key_value_heads must be a positive integer, got -2"),
        ({"num_key_value_heads": True}, "num_key_value_heads must be an integer or None, got True"),
        ({"num_key_value_heads": 2, "layer_type": "evolved_transformer"}, "layer_type='evolved_transformer' does not"),
    ],
)
def test_bad_values_are_refused(overrides, match):
    with pytest.raises(StrictDataclassClassValidationError, match=match):
        HfzooDecoderConfig(**{**TINY, **overrides})


@pytest.mark.parametrize("mixer", [name for name, entry in TOKEN_MIXERS.items() if not entry.grouped_kv_heads])
def test_token_mixers_without_grouped_heads_refuse_them(mixer):
    config_class = HfzooEncoderDecoderConfig if mixer in ("fourier", "linformer", "bigbird") else HfzooDecoderConfig
    with pytest.raises(
        StrictDataclassClassValidationError, match=rf"num_key_value_heads=2 .* token_mixer={mixer!r} does not group"
    ):
        config_class(**{**TINY, "num_key_value_heads": 2, "token_mixer": mixer, "use_cache": False})
