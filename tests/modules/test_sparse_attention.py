"""Sparse attention patterns (`hfzoo.modules.sparse_attention`) against brute-force patterns."""

from __future__ import annotations

import pytest
import torch
from helpers.variant_checks import FAMILIES, TINY, build_model, make_batch
from huggingface_hub.errors import StrictDataclassClassValidationError
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from hfzoo.compat import output_cache
from hfzoo.finetuning.adapters import build_peft_config, wrap_with_peft
from hfzoo.modules.sparse_attention import (
    BigBirdAttention,
    SlidingWindowAttention,
    bigbird_block_pattern,
    window_overlay,
)

WINDOW = 4  # two tokens on each side
SLIDING = {"token_mixer": "sliding_window", "attention_window": WINDOW, "num_hidden_layers": 1}


def allowed_by_window(seq_len: int, reach: int, causal: bool, real: torch.Tensor) -> torch.Tensor:
    """`(seq_len, seq_len)` bool: query i may attend key j (brute force over every pair)."""
    allowed = torch.zeros(seq_len, seq_len, dtype=torch.bool)
    for i in range(seq_len):
        for j in range(seq_len):
            allowed[i, j] = bool(real[j]) and abs(i - j) <= reach and (j <= i or not causal)
    return allowed


@pytest.mark.parametrize("family", ["decoder", "encoder"])
def test_each_query_attends_exactly_its_window(family):
    """The eager attention probabilities are nonzero exactly on the window's keys (and the past, when causal)."""
    model = build_model(family, SLIDING, "eager")
    batch = make_batch(family)
    with torch.no_grad():
        weights = model(batch.input_ids, attention_mask=batch.attention_mask, output_attentions=True).attentions[0]
    seq_len = batch.input_ids.shape[1]
    for row in range(len(batch.input_ids)):
        real = batch.attention_mask[row].bool()
        expected = allowed_by_window(seq_len, WINDOW // 2, family == "decoder", real)
        attends = weights[row] > 0  # (heads, q_len, kv_len)
        assert torch.equal(attends[:, real], expected[real].expand_as(attends[:, real]))


@pytest.mark.parametrize("family", ["decoder", "encoder"])
def test_the_receptive_field_grows_by_the_window_per_layer(family):
    """With 2 layers, position 0 reaches at most 2 * w/2 positions on each side: farther tokens change nothing."""
    overrides = {**SLIDING, "num_hidden_layers": 2}
    model = build_model(family, overrides)
    ids = torch.randint(2, TINY["vocab_size"], (1, 11))
    changed = ids.clone()
    changed[0, 6] += 1  # position 6: beyond 0 + 2 * 2, within reach of positions 2..10
    with torch.no_grad():
        before, after = model(ids).logits[0], model(changed).logits[0]
    torch.testing.assert_close(before[:2], after[:2])
    assert not torch.allclose(before[2:], after[2:])


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_decoding_with_the_cache_keeps_the_window(attn):
    """Token-by-token decoding with the KV cache gives the logits of one forward pass over the whole sequence."""
    model = build_model("decoder", {**SLIDING, "num_hidden_layers": 2}, attn)
    ids = torch.randint(2, TINY["vocab_size"], (2, 12))
    with torch.no_grad():
        full = model(ids).logits
        out = model(ids[:, :3], use_cache=True)
        steps, cache = [out.logits], output_cache(out)
        for t in range(3, 12):
            out = model(ids[:, t : t + 1], cache=cache, use_cache=True)
            steps.append(out.logits)
            cache = output_cache(out)
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-5, atol=1e-5)


def test_the_backend_receives_the_native_window(monkeypatch):
    """`sliding_window = w/2 + 1` reaches the attention function: flash attention's `window_size = (w/2, w/2)`."""
    received = []

    def recording_attention(module, *args, **kwargs):
        received.append((module.is_cross_attention, kwargs.get("sliding_window")))
        return sdpa_attention_forward(module, *args, **kwargs)

    monkeypatch.setitem(AttentionInterface._global_mapping, "recording", recording_attention)
    monkeypatch.setitem(AttentionMaskInterface._global_mapping, "recording", sdpa_mask)
    model = build_model("encoder-decoder", SLIDING, "sdpa")
    model.config._attn_implementation = "recording"
    batch = make_batch("encoder-decoder")
    with torch.no_grad():
        model(batch.input_ids, attention_mask=batch.attention_mask, decoder_input_ids=batch.decoder_input_ids)
    assert sorted(set(received)) == [(False, WINDOW // 2 + 1), (True, None)]  # self-attention only
    # transformers' flash path: window_size = (sliding_window - 1, sliding_window - 1), keys i - left .. i + right
    left = right = WINDOW // 2 + 1 - 1
    overlay = window_overlay(FAMILIES["encoder"][0](**{**TINY, **SLIDING}))
    for i in range(12):
        for j in range(12):
            assert bool(overlay(0, 0, i, j)) == (i - left <= j <= i + right)


def test_flops_count_the_pairs_inside_the_window():
    config = FAMILIES["encoder"][0](**{**TINY, **SLIDING})
    for seq_len in (1, 2, 3, 5, 11, 40):
        real = torch.ones(seq_len, dtype=torch.bool)
        expected = int(allowed_by_window(seq_len, WINDOW // 2, False, real).sum())
        assert SlidingWindowAttention.attention_pairs(config, seq_len) == expected


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"attention_window": 0}, r"attention_window must be a positive even integer .* got 0"),
        ({"attention_window": 3}, r"attention_window must be a positive even integer .* got 3"),
        ({"token_mixer": "self_attention"}, r"attention_window=4 only applies to token_mixer='sliding_window'"),
    ],
)
def test_bad_windows_are_refused(overrides, message):
    for config_class, _ in FAMILIES.values():
        with pytest.raises(StrictDataclassClassValidationError, match=message):
            config_class(**{**TINY, **SLIDING, **overrides})


# ---- BigBird (Zaheer et al. 2020)

BIGBIRD = {"token_mixer": "bigbird", "bigbird_block_size": 2, "bigbird_num_random_blocks": 2, "num_hidden_layers": 2}


@pytest.mark.parametrize("num_blocks", [1, 2, 4, 7, 12])
@pytest.mark.parametrize("num_global", [0, 1, 2, 3])
@pytest.mark.parametrize("num_random", [0, 1, 3])
def test_block_pattern_is_window_global_and_random_blocks(num_blocks, num_global, num_random):
    pattern = bigbird_block_pattern(num_blocks, 4, num_random, num_global, seed=7)
    first, last = (num_global + 1) // 2, num_global // 2
    is_global = [i < first or i >= num_blocks - last for i in range(num_blocks)]
    for head in range(4):
        for i in range(num_blocks):
            fixed = [abs(i - j) <= 1 or is_global[i] or is_global[j] for j in range(num_blocks)]
            row = pattern[head, i].tolist()
            assert all(row[j] for j in range(num_blocks) if fixed[j])  # window and global blocks always
            random = [j for j in range(num_blocks) if row[j] and not fixed[j]]
            assert len(random) == min(num_random, num_blocks - sum(fixed))  # r others, or all that remain
    assert torch.equal(pattern, bigbird_block_pattern.__wrapped__(num_blocks, 4, num_random, num_global, seed=7))


def test_random_blocks_differ_between_heads_and_layers_but_not_between_calls():
    model = build_model("encoder", {**BIGBIRD, "bigbird_num_random_blocks": 3})
    first, second = (layer.self_attn.block_pattern(16) for layer in model.model.layers)
    assert not torch.equal(first, second)  # seeded by the layer index
    assert any(not torch.equal(first[0], first[h]) for h in range(1, first.shape[0]))  # per head
    again = build_model("encoder", {**BIGBIRD, "bigbird_num_random_blocks": 3}, seed=1)
    assert torch.equal(again.model.layers[0].self_attn.block_pattern(16), first)  # not the weights' seed


def brute_force_token_pattern(mixer, real: torch.Tensor) -> torch.Tensor:
    """`(heads, seq_len, seq_len)`: real query i attends real key j iff their blocks (by rank) do."""
    ranks = (real.long().cumsum(0) - 1).tolist()
    length = int(real.sum())
    blocks = mixer.block_pattern(-(-length // mixer.block_size))
    seq_len = len(real)
    allowed = torch.zeros(blocks.shape[0], seq_len, seq_len, dtype=torch.bool)
    for i in range(seq_len):
        for j in range(seq_len):
            if real[i] and real[j]:
                allowed[:, i, j] = blocks[:, ranks[i] // mixer.block_size, ranks[j] // mixer.block_size]
    return allowed


def test_each_query_attends_exactly_its_blocks_whatever_the_padding():
    """Eager attention probabilities are nonzero exactly where the brute-force pattern allows, for every layer."""
    model = build_model("encoder", BIGBIRD, "eager")
    ids = torch.randint(2, TINY["vocab_size"], (3, 13))
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0  # right padding
    mask[2, :4] = 0  # left padding
    with torch.no_grad():
        attentions = model(ids, attention_mask=mask, output_attentions=True).attentions
    for layer, weights in zip(model.model.layers, attentions, strict=True):
        for row in range(3):
            real = mask[row].bool()
            expected = brute_force_token_pattern(layer.self_attn, real)
            assert torch.equal((weights[row] > 0)[:, real], expected[:, real])
    # the pattern follows each row's own tokens: rows 1 and 2 see the same blocks as their tokens alone
    torch.testing.assert_close(
        brute_force_token_pattern(model.model.layers[0].self_attn, mask[2].bool())[:, 4:, 4:],
        brute_force_token_pattern(model.model.layers[0].self_attn, torch.ones(9, dtype=torch.bool)),
    )


def test_flops_count_the_pairs_of_the_pattern():
    config = FAMILIES["encoder"][0](**{**TINY, **BIGBIRD})
    mixer = build_model("encoder", BIGBIRD).model.layers[0].self_attn
    for seq_len in (1, 5, 13, 30):
        allowed = brute_force_token_pattern(mixer, torch.ones(seq_len, dtype=torch.bool))
        assert BigBirdAttention.attention_pairs(config, seq_len) == allowed.sum().item() / allowed.shape[0]


def test_keys_beyond_the_sequence_are_refused():
    mixer = build_model("encoder", BIGBIRD).model.layers[0].self_attn
    query, key = torch.randn(1, TINY["num_attention_heads"], 5, 8), torch.randn(1, TINY["num_attention_heads"], 7, 8)
    with pytest.raises(ValueError, match=r"token_mixer='bigbird' attends within the sequence \(5 tokens\), but got 7"):
        mixer.restrict_attention_mask(None, query, key, None)


@pytest.mark.parametrize(
    "family, overrides, message",
    [
        ("encoder", {"bigbird_block_size": 0}, r"bigbird_block_size must be a positive integer, got 0"),
        ("encoder", {"bigbird_num_random_blocks": -1}, r"bigbird_num_random_blocks must be a non-negative integer"),
        ("encoder", {"bigbird_num_global_blocks": 1.5}, r"bigbird_num_global_blocks must be an integer, got 1.5"),
        (
            "decoder",
            {"use_cache": False},
            r"token_mixer='bigbird' is not defined for the causal decoder of hfzoo_decoder \(its global and random",
        ),
        (
            "encoder-decoder",
            {},
            r"token_mixer='bigbird' is not defined for the causal decoder of hfzoo_encoder_decoder",
        ),
        ("encoder", {"token_mixer": "self_attention"}, r"bigbird_block_size=2 only applies to token_mixer='bigbird'"),
    ],
)
def test_bad_bigbird_configs_are_refused(family, overrides, message):
    with pytest.raises(StrictDataclassClassValidationError, match=message):
        FAMILIES[family][0](**{**TINY, **BIGBIRD, **overrides})


def test_bigbird_offers_eager_and_sdpa_only():
    model = build_model("encoder", BIGBIRD)
    assert model._supports_sdpa and not model._supports_flash_attn and not model._supports_flex_attn


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"token_mixer": "fourier"}, r"token_mixer='fourier' has no keys or values, so a cache or a prefix"),
        ({"token_mixer": "linformer", "linformer_k": 4}, r"token_mixer='linformer' projects the sequence's own keys"),
        (BIGBIRD, r"token_mixer='bigbird' attends within the sequence \(6 tokens\), but got 9 keys"),
    ],
)
def test_mixers_without_a_cache_refuse_a_prefix(overrides, message):
    """PEFT prefix tuning set up directly hands an encoder a cache of prefix keys: a mixer that cannot use it says so.

    (`build_peft_config` refuses these mixers first; the prefix config here is built for the same sizes with
    self-attention, as a user calling peft by hand could.)
    """
    model = FAMILIES["encoder"][1](FAMILIES["encoder"][0](**{**TINY, **overrides}))
    prefix = build_peft_config("prefix", FAMILIES["encoder"][0](**TINY), num_virtual_tokens=3)
    peft_model = wrap_with_peft(model, prefix).eval()
    ids = torch.randint(2, TINY["vocab_size"], (2, 6))
    with pytest.raises(ValueError, match=message), torch.no_grad():
        peft_model(input_ids=ids, attention_mask=torch.ones_like(ids))


@pytest.mark.parametrize(
    "family, overrides, field",
    [
        ("encoder", {"token_mixer": "fourier"}, "token_mixer='fourier'"),
        ("encoder", {"token_mixer": "linformer", "linformer_k": 4}, "token_mixer='linformer'"),
        ("encoder", BIGBIRD, "token_mixer='bigbird'"),
        (
            "encoder-decoder",
            {"token_mixer": "fourier", "decoder_token_mixer": "self_attention"},
            "token_mixer='fourier'",
        ),
    ],
)
def test_prefix_tuning_is_refused_when_its_config_is_built(family, overrides, field):
    """The GLUE recipe builds the PEFT config before the model runs: a mixer without keys and values is refused there."""
    config = FAMILIES[family][0](**{**TINY, **overrides})
    with pytest.raises(ValueError, match=rf"--peft prefix prepends learned keys and values .* but {field} has no"):
        build_peft_config("prefix", config, num_virtual_tokens=3)
    assert build_peft_config("lora", config) is not None


def test_prefix_tuning_config_is_built_for_sliding_window_attention():
    """Sliding-window attention keeps a KV cache, so prefix tuning's config is built as for self-attention."""
    config = FAMILIES["encoder"][0](**{**TINY, **SLIDING})
    assert build_peft_config("prefix", config, num_virtual_tokens=3).num_layers == 1
