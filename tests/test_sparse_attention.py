"""Sparse attention patterns (`hfzoo.modules.sparse_attention`) against brute-force patterns."""

from __future__ import annotations

import pytest
import torch
from huggingface_hub.errors import StrictDataclassClassValidationError
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from variant_checks import FAMILIES, TINY, build_model, make_batch

from hfzoo.modules.sparse_attention import SlidingWindowAttention, window_overlay

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
        steps, cache = [out.logits], out.past_key_values
        for t in range(3, 12):
            out = model(ids[:, t : t + 1], past_key_values=cache, use_cache=True)
            steps.append(out.logits)
            cache = out.past_key_values
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
