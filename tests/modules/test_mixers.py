"""The token-mixer registry (`hfzoo.modules.mixers.TOKEN_MIXERS`): a new mixer plugs in with one class and one entry.

The tests register a throwaway mixer (a masked running mean of value projections) in `TOKEN_MIXERS`
for their duration and run it through every family with the variant checks, so that the plug-in path,
and the validation driven by the entry's metadata, are tested without a real second mixer.
"""

from __future__ import annotations

import pytest
import torch
from helpers.variant_checks import FAMILIES, TINY, build_model, check_cached_generation, check_variant, make_batch, run
from huggingface_hub.errors import StrictDataclassClassValidationError
from torch import nn

from hfzoo.modules.attention import HfzooAttention
from hfzoo.modules.mixers import TOKEN_MIXERS, TokenMixer


class MeanMixer(nn.Module):
    """`o_proj(mean of v_proj(x_j) over the real tokens j <= i)` (all real tokens when bidirectional)."""

    def __init__(self, config, layer_idx: int, is_causal: bool) -> None:
        super().__init__()
        self.is_causal = is_causal
        self.v_proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size)

    def residual_branch_projections(self):
        return [self.v_proj], [self.o_proj]

    def forward(self, hidden_states, attention_mask=None, cache=None, padding_mask=None, **kwargs):
        values = self.v_proj(hidden_states)
        weight = hidden_states.new_ones(hidden_states.shape[:2]) if padding_mask is None else padding_mask.to(values)
        values = values * weight[..., None]
        if self.is_causal:
            total, count = values.cumsum(1), weight.cumsum(1)
        else:
            total, count = values.sum(1, keepdim=True), weight.sum(1, keepdim=True)
        return self.o_proj(total / count.clamp(min=1)[..., None]), None


MEAN = TokenMixer(MeanMixer, kv_cache=False, attention_positions=False)
NO_ATTENTION = {"token_mixer": "mean", "use_cache": False}


@pytest.fixture
def mean_mixer(monkeypatch):
    """`TOKEN_MIXERS["mean"]` (and a bidirectional-only `"mean_bidirectional"`) for one test."""
    monkeypatch.setitem(TOKEN_MIXERS, "mean", MEAN)
    monkeypatch.setitem(
        TOKEN_MIXERS,
        "mean_bidirectional",
        TokenMixer(MeanMixer, causal=False, kv_cache=False, reason="the mean runs over later tokens too"),
    )


def test_self_attention_is_the_default_mixer():
    for family, (config_class, _) in FAMILIES.items():
        model = build_model(family, {})
        mixers = [m for m in model.modules() if isinstance(m, HfzooAttention) and not m.is_cross_attention]
        assert config_class(**TINY).token_mixer == "self_attention" and mixers, family
        assert TOKEN_MIXERS["self_attention"].module is HfzooAttention


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_registered_mixer_runs_through_every_family(family, mean_mixer, tmp_path):
    """One class + one registry entry: the mixer is built in every layer and passes the variant checks."""
    check_variant(family, NO_ATTENTION, tmp_path)
    model = build_model(family, NO_ATTENTION)
    stacks = [model.model.encoder, model.model.decoder] if family == "encoder-decoder" else [model.model]
    for stack in stacks:
        assert all(isinstance(layer.self_attn, MeanMixer) for layer in stack.layers)
        assert all(layer.self_attn.is_causal == stack.is_causal for layer in stack.layers)
    # the mixer really mixes: the first position's output depends on a later one only when bidirectional
    batch = make_batch(family)
    changed = batch.input_ids.clone()
    changed[:, 2] = (changed[:, 2] + 1) % TINY["vocab_size"]
    with torch.no_grad():
        before = run(model, batch).logits
        batch.input_ids = changed
        after = run(model, batch).logits
    if family == "encoder":
        assert not torch.allclose(before[:, 0], after[:, 0])
    elif family == "decoder":
        torch.testing.assert_close(before[:, :2], after[:, :2])
        assert not torch.allclose(before[:, 2:], after[:, 2:])


def test_encoder_decoder_takes_a_decoder_mixer(mean_mixer):
    """A bidirectional-only mixer in the encoder, self-attention in the decoder (`decoder_token_mixer`)."""
    model = build_model(
        "encoder-decoder", {"token_mixer": "mean_bidirectional", "decoder_token_mixer": "self_attention"}
    )
    assert all(isinstance(layer.self_attn, MeanMixer) for layer in model.model.encoder.layers)
    assert all(isinstance(layer.self_attn, HfzooAttention) for layer in model.model.decoder.layers)
    batch = make_batch("encoder-decoder")
    # the decoder's KV cache behind a cache-less encoder: the same tokens and logits of every step without it
    check_cached_generation(model, batch.input_ids, batch.attention_mask, max_new_tokens=5)


@pytest.mark.parametrize(
    "family, overrides, message",
    [
        ("decoder", {"token_mixer": "unknown"}, r"token_mixer='unknown' is not supported; choose one of \["),
        ("encoder", {"token_mixer": "unknown"}, r"token_mixer='unknown' is not supported"),
        (
            "decoder",
            {"token_mixer": "mean_bidirectional", "use_cache": False},
            r"token_mixer='mean_bidirectional' is not defined for the causal decoder of hfzoo_decoder "
            r"\(the mean runs over later tokens too\); choose one of \['self_attention', .*'mean'\]",
        ),
        (
            "encoder-decoder",
            {"token_mixer": "mean_bidirectional", "use_cache": False},
            r"token_mixer='mean_bidirectional' is not defined for the causal decoder of hfzoo_encoder_decoder",
        ),
        (
            "encoder-decoder",
            {"decoder_token_mixer": "mean_bidirectional", "use_cache": False},
            r"decoder_token_mixer='mean_bidirectional' is not defined for the causal decoder",
        ),
        ("decoder", {"token_mixer": "mean"}, r"use_cache=True, but token_mixer='mean' has no KV cache"),
        ("encoder-decoder", {"token_mixer": "mean"}, r"use_cache=True, but token_mixer='mean' has no KV cache"),
        (
            "encoder",
            {"token_mixer": "mean", "position_embedding_type": "rotary"},
            r"position_embedding_type='rotary' acts inside attention, which token_mixer='mean' does not have; "
            r"choose one of \['none', 'learned', 'sinusoidal'\]",
        ),
    ],
)
def test_mixer_choice_is_validated_from_its_registry_entry(family, overrides, message, mean_mixer):
    with pytest.raises(StrictDataclassClassValidationError, match=message):
        FAMILIES[family][0](**{**TINY, **overrides})


def test_an_encoder_only_mixer_keeps_the_use_cache_default(mean_mixer):
    """An encoder has no causal stack: a mixer without a KV cache needs no `use_cache=False` there."""
    assert FAMILIES["encoder"][0](**{**TINY, "token_mixer": "mean"}).use_cache


def test_entry_metadata_restricts_families_backends_and_checks_fields(monkeypatch):
    def check(config):
        if config.hidden_size > 16:
            raise ValueError(f"hidden_size={config.hidden_size} is too wide for token_mixer='narrow'")

    entry = TokenMixer(MeanMixer, kv_cache=False, families=("hfzoo_encoder",), attention_backends=("eager",))
    monkeypatch.setitem(TOKEN_MIXERS, "encoder_only", entry)
    monkeypatch.setitem(TOKEN_MIXERS, "narrow", TokenMixer(MeanMixer, kv_cache=False, check_config=check))
    with pytest.raises(StrictDataclassClassValidationError, match="token_mixer='encoder_only' is not defined"):
        FAMILIES["encoder-decoder"][0](**{**TINY, "token_mixer": "encoder_only", "use_cache": False})
    # an eager-only mixer: SDPA is not offered, so the model falls back to eager attention by default
    model = FAMILIES["encoder"][1](FAMILIES["encoder"][0](**{**TINY, "token_mixer": "encoder_only"}))
    assert model.config._attn_implementation == "eager" and not model._supports_sdpa
    with pytest.raises(StrictDataclassClassValidationError, match="hidden_size=32 is too wide for token_mixer"):
        FAMILIES["encoder"][0](**{**TINY, "token_mixer": "narrow"})
    assert FAMILIES["encoder"][0](**{**TINY, "token_mixer": "narrow", "hidden_size": 16, "num_attention_heads": 2})
    # the check of a mixer no stack uses does not run
    assert FAMILIES["encoder"][0](**TINY)


def neighbours_only(config):
    """A mask overlay: attend to the previous, the same and the next position only."""
    return lambda batch_idx, head_idx, q_idx, kv_idx: abs(q_idx - kv_idx) <= 1


@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_mask_overlay_restricts_the_stacks_self_attention(family, monkeypatch, tmp_path):
    """An entry's `mask_overlay` is intersected with every stack's mask: eager, SDPA and the KV cache follow it."""
    monkeypatch.setitem(TOKEN_MIXERS, "neighbours", TokenMixer(HfzooAttention, mask_overlay=neighbours_only))
    overrides = {"token_mixer": "neighbours", "num_hidden_layers": 1, "num_decoder_layers": 1}
    if family != "encoder-decoder":
        overrides.pop("num_decoder_layers")
    check_variant(family, overrides, tmp_path)
    batch = make_batch(family)
    for attn in ("eager", "sdpa"):
        model = build_model(family, overrides, attn)
        with torch.no_grad():
            before = run(model, batch).logits
            if family == "encoder-decoder":
                batch.decoder_input_ids[:, 0] += 1
            else:
                batch.input_ids[:, 0] += 1
            after = run(model, batch).logits
            batch = make_batch(family)
        # one layer: position 0 reaches positions 0 and 1 only (the decoder's cross-attention reads the encoder;
        # outputs at padding positions are not compared)
        real = batch.attention_mask.bool() if family != "encoder-decoder" else torch.ones_like(before[..., 0]).bool()
        assert not torch.allclose(before[:, :2], after[:, :2])
        torch.testing.assert_close(before[:, 2:][real[:, 2:]], after[:, 2:][real[:, 2:]])
