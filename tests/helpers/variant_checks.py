"""The checks every architecture variant must pass, in every family it applies to.

`check_variant(family, overrides, tmp_path)` builds a tiny model of `family` with the config
`overrides` and asserts, for fp32 and bf16 autocast:

- forward and backward run; the loss, logits and every gradient are finite; every trainable
  parameter receives a gradient (a built-but-unused module is a dead config switch);
- `save_pretrained` / `from_pretrained` round trip gives identical logits;
- padding invariance: a padded row gives the same logits as the row alone;
- causality: changing future tokens never changes earlier logits (decoder, and the decoder side of
  the encoder-decoder);
- greedy generation gives the same tokens and logits with and without the KV cache (decoder, encoder-decoder;
  unless the variant's config sets `use_cache=False`);
- fusing the query, key and value projections (`fuse_qkv_projections`, for inference) changes no logits or
  generated tokens, and unfusing restores the model exactly;
- eager and SDPA attention agree (unless the variant declares it supports eager only).

The checks run on `checked_model`: ReZero's and Fixup's residual branches, zero at init (every layer the
identity, so no check would see the layers), are switched on first (`switch_on_residual_branches`).

The table of variants lives in `tests/models/test_variants.py`, which also exports every row with
`trust_remote_code` code and loads all of them in one clean interpreter without hfzoo.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

from hfzoo import (
    HfzooDecoderConfig,
    HfzooDecoderForCausalLM,
    HfzooEncoderConfig,
    HfzooEncoderDecoderConfig,
    HfzooEncoderDecoderForConditionalGeneration,
    HfzooEncoderForMaskedLM,
)
from hfzoo.modules.attention import HfzooAttention
from hfzoo.modules.layer import Residual

FAMILIES = {
    "decoder": (HfzooDecoderConfig, HfzooDecoderForCausalLM),
    "encoder": (HfzooEncoderConfig, HfzooEncoderForMaskedLM),
    "encoder-decoder": (HfzooEncoderDecoderConfig, HfzooEncoderDecoderForConditionalGeneration),
}

TINY = dict(
    vocab_size=97,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
    pad_token_id=0,
    eos_token_id=1,
)

LENGTHS = (11, 6)  # a full row and a padded one
DECODER_LENGTH = 7


@dataclass
class Batch:
    input_ids: torch.Tensor  # (batch_size, seq_len) int64, right-padded with 0
    attention_mask: torch.Tensor  # (batch_size, seq_len) 1 = token
    decoder_input_ids: torch.Tensor | None  # (batch_size, DECODER_LENGTH) for the encoder-decoder
    labels: torch.Tensor  # targets for the family's loss, -100 = ignored


def make_batch(family: str, seed: int = 0) -> Batch:
    """A right-padded batch of random tokens (ids >= 2, so no pad/eos) with labels for the family's loss."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.zeros(len(LENGTHS), max(LENGTHS), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(LENGTHS):
        ids[i, :n] = torch.randint(2, TINY["vocab_size"], (n,), generator=g)
        mask[i, :n] = 1
    decoder_ids = None
    if family == "encoder-decoder":
        decoder_ids = torch.randint(2, TINY["vocab_size"], (len(LENGTHS), DECODER_LENGTH), generator=g)
        labels = decoder_ids.clone()
    else:
        labels = ids.masked_fill(mask == 0, -100)
    return Batch(ids, mask, decoder_ids, labels)


def build_model(family: str, overrides: dict, attn: str = "sdpa", seed: int = 0):
    """A tiny model of `family` (see `FAMILIES`) with config `overrides`, in eval mode."""
    config_class, model_class = FAMILIES[family]
    torch.manual_seed(seed)
    model = model_class(config_class(**{**TINY, **overrides}))
    model.set_attn_implementation(attn)
    return model.eval()


def switch_on_residual_branches(model: nn.Module, seed: int = 0) -> nn.Module:
    """Give the residual branches that ReZero and Fixup switch off at init the values a trained model has.

    ReZero's `alpha = 0` and Fixup's zeroed last projections make every layer the identity at init, so the
    checks would hold whatever the layers compute (their masks, cache, padding, backends). Here each ReZero
    `alpha` and Fixup scalar bias becomes non-zero and each Fixup-zeroed projection (`residual_init_scale`
    0) is drawn as an ordinary one, from a generator seeded by `seed` (the same values in every model of one
    check). Other models are returned unchanged.
    """
    generator = torch.Generator().manual_seed(seed)

    def draw(tensor: torch.Tensor, low: float, high: float) -> torch.Tensor:
        return low + (high - low) * torch.rand(tensor.shape, generator=generator)

    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear) and getattr(module, "residual_init_scale", None) == 0:
                std = model.config.initializer_range
                module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * std)
            if isinstance(module, Residual):
                for scalar in (module.rezero_alpha, module.fixup_bias_in, module.fixup_bias_out):
                    if scalar is not None:
                        scalar.copy_(draw(scalar, 0.3, 0.8))
    return model


def checked_model(family: str, overrides: dict, attn: str = "sdpa", seed: int = 0):
    """`build_model` with every residual branch switched on (`switch_on_residual_branches`): the checks' model."""
    return switch_on_residual_branches(build_model(family, overrides, attn, seed), seed)


def run(model, batch: Batch, **kwargs):
    """Forward `batch` through `model` (decoder inputs for the encoder-decoder)."""
    if batch.decoder_input_ids is not None:
        kwargs["decoder_input_ids"] = batch.decoder_input_ids
    return model(batch.input_ids, attention_mask=batch.attention_mask, **kwargs)


def valid_logits(family: str, batch: Batch, logits: torch.Tensor) -> torch.Tensor:
    """The logits that must not depend on padding: every decoder position, or the non-padding encoder positions."""
    return logits if family == "encoder-decoder" else logits[batch.attention_mask.bool()]


def check_forward_backward(
    family: str, overrides: dict, allow_unused: tuple[str, ...] = (), attn: str = "sdpa"
) -> None:
    """Finite loss, logits and gradients in fp32 and bf16 autocast; every parameter gets a gradient.

    The training loss (computed in chunks, no logits) equals the loss computed from the full logits.
    """
    for dtype in (torch.float32, torch.bfloat16):
        model = checked_model(family, overrides, attn).train()
        batch = make_batch(family)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype is torch.bfloat16):
            torch.manual_seed(1)  # the same dropout masks and router noise in both passes
            out = run(model, batch, labels=batch.labels)
            torch.manual_seed(1)
            full = run(model, batch, labels=batch.labels, skip_logits=False)
        assert out.logits is None, dtype
        assert torch.isfinite(out.loss), (dtype, out.loss)
        assert torch.isfinite(full.logits.float()).all(), dtype
        tolerance = 1e-5 if dtype is torch.float32 else 2e-2  # bf16: the full path rounds the logits
        torch.testing.assert_close(out.loss, full.loss.detach(), rtol=tolerance, atol=tolerance)
        out.loss.backward()
        for name, param in model.named_parameters():
            if not param.requires_grad:
                continue
            if param.grad is None:
                assert any(part in name for part in allow_unused), f"{name} received no gradient ({dtype})"
                continue
            assert torch.isfinite(param.grad).all(), f"non-finite gradient for {name} ({dtype})"


def check_round_trip(family: str, overrides: dict, tmp_path: Path, attn: str = "sdpa") -> None:
    """`save_pretrained` then `from_pretrained` gives identical logits."""
    model = checked_model(family, overrides, attn)
    batch = make_batch(family)
    with torch.no_grad():
        before = run(model, batch).logits
    model.save_pretrained(tmp_path)
    loaded = type(model).from_pretrained(tmp_path, attn_implementation=attn).eval()
    with torch.no_grad():
        after = run(loaded, batch).logits
    assert torch.equal(before, after)


def check_padding_invariance(family: str, overrides: dict, attn: str = "sdpa") -> None:
    """The padded row's logits equal those of the same row given alone without padding."""
    model = checked_model(family, overrides, attn)
    batch = make_batch(family)
    n = LENGTHS[1]
    with torch.no_grad():
        padded = run(model, batch).logits[1]
        alone = Batch(
            batch.input_ids[1:, :n],
            batch.attention_mask[1:, :n],
            None if batch.decoder_input_ids is None else batch.decoder_input_ids[1:],
            batch.labels[1:, :n],
        )
        single = run(model, alone).logits[0]
    if family != "encoder-decoder":
        padded = padded[:n]
    torch.testing.assert_close(padded, single, rtol=1e-4, atol=1e-5)


def check_no_mask_equals_full_mask(family: str, overrides: dict, attn: str = "sdpa") -> None:
    """Without an attention mask the logits are those with an all-ones mask (the pretraining loop leaves one out)."""
    model = checked_model(family, overrides, attn)
    batch = make_batch(family)
    ids = batch.input_ids[:1]  # the full row
    kwargs = {} if batch.decoder_input_ids is None else {"decoder_input_ids": batch.decoder_input_ids[:1]}
    with torch.no_grad():
        full = model(ids, attention_mask=torch.ones_like(ids), **kwargs).logits
        unmasked = model(ids, **kwargs).logits
    torch.testing.assert_close(unmasked, full, rtol=1e-5, atol=1e-6)


def check_causality(family: str, overrides: dict, attn: str = "sdpa") -> None:
    """Changing tokens after position t never changes the logits at positions <= t (causal stacks)."""
    if family == "encoder":
        return
    model = checked_model(family, overrides, attn)
    batch = make_batch(family)
    t = 3
    changed = Batch(batch.input_ids.clone(), batch.attention_mask, batch.decoder_input_ids, batch.labels)
    if family == "decoder":
        changed.input_ids[:, t + 1 :] = (changed.input_ids[:, t + 1 :] + 1) % TINY["vocab_size"]
    else:
        changed.decoder_input_ids = batch.decoder_input_ids.clone()
        changed.decoder_input_ids[:, t + 1 :] = (changed.decoder_input_ids[:, t + 1 :] + 1) % TINY["vocab_size"]
    with torch.no_grad():
        before, after = run(model, batch).logits, run(model, changed).logits
    torch.testing.assert_close(before[:, : t + 1], after[:, : t + 1], rtol=0, atol=1e-6)
    assert not torch.allclose(before[:, t + 1 :], after[:, t + 1 :])


def generation_prompt(family: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts for `generate` and their attention masks.

    Left-padded decoder prompts (5 tokens, 2 of them padding in the second row), or the encoder-decoder's
    right-padded sources.
    """
    batch = make_batch(family)
    if family != "decoder":
        return batch.input_ids, batch.attention_mask
    prompt = batch.input_ids[:, :5].clone()
    mask = torch.ones_like(prompt)
    prompt[1, :2], mask[1, :2] = TINY["pad_token_id"], 0
    return prompt, mask


def check_cached_generation(
    model,
    prompt: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    max_new_tokens: int = 4,
    reference=None,
    cache_kwargs: dict | None = None,
    repeat_tokens: bool = False,
    **kwargs,
):
    """Greedy generation with the KV cache gives the tokens and the logits of every step that it gives without.

    At init (tied embeddings) greedy decoding repeats the last token: the encoder-decoder would decode its
    start token over and over, every cached key and value the same, so that no misplaced position or cache
    slot could change a logit. No token is generated twice (`no_repeat_ngram_size=1`), and the logits of
    every step are compared, not only their argmax.

    Args:
        model: the model generating with its cache.
        prompt: the prompt (decoder) or the source (encoder-decoder), `(batch_size, seq_len)`.
        attention_mask: its mask, or None.
        max_new_tokens: tokens generated (also the minimum, so that no row stops early).
        reference: the model generating without a cache (default `model`), e.g. one on another backend.
        cache_kwargs: `generate` arguments for the cached run only (e.g. `cache_implementation`).
        repeat_tokens: compare the tokens only, on ordinary greedy decoding (for Switch routing, whose
            expert capacity counts the tokens of each call, `hfzoo.modules.experts`).
        **kwargs: further `generate` arguments for both runs.

    Returns:
        The cached run's `generate` output (`sequences`, `logits`, `past_key_values`).
    """
    kwargs = dict(
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        **({} if repeat_tokens else {"no_repeat_ngram_size": 1}),
        **({} if attention_mask is None else {"attention_mask": attention_mask}),
        **kwargs,
    )
    with torch.no_grad():
        cached = model.generate(prompt, use_cache=True, **(cache_kwargs or {}), **kwargs)
        uncached = (model if reference is None else reference).generate(prompt, use_cache=False, **kwargs)
    assert torch.equal(cached.sequences, uncached.sequences), (cached.sequences, uncached.sequences)
    if not repeat_tokens:
        torch.testing.assert_close(torch.stack(cached.logits), torch.stack(uncached.logits), rtol=1e-4, atol=1e-5)
    return cached


def check_generation_cache(family: str, overrides: dict, attn: str = "sdpa") -> None:
    """`check_cached_generation` on a variant (decoder, encoder-decoder), from `generation_prompt`'s prompts.

    Switch routing keeps the tokens-only check on repeated tokens: its expert capacity counts the tokens of
    each call, so decoding with a cache may keep tokens a full forward drops (`hfzoo.modules.experts`).
    Skipped for the encoder and for configs with `use_cache=False` (a variant without a KV cache).
    """
    if family == "encoder":
        return
    model = checked_model(family, overrides, attn)
    if not model.config.use_cache:
        return
    capacity_per_call = bool(model.config.num_experts) and model.config.router_type == "switch"
    prompt, mask = generation_prompt(family)
    tokens = check_cached_generation(model, prompt, mask, repeat_tokens=capacity_per_call).sequences
    assert tokens.shape[1] == (prompt.shape[1] if family == "decoder" else 1) + 4  # the prompt / the start token


def check_fused_qkv_projections(family: str, overrides: dict, tmp_path: Path, attn: str = "sdpa") -> None:
    """`fuse_qkv_projections` fuses every self-attention and changes no output; unfusing restores the model exactly.

    The fused model's logits equal the separate projections' (up to rounding); its cached greedy generation gives
    the tokens and logits of the unfused model without a cache; `save_pretrained` refuses it and writes nothing;
    `unfuse_qkv_projections` gives back the same parameters, in the same `state_dict` order, and the same logits.
    """
    model, reference = checked_model(family, overrides, attn), checked_model(family, overrides, attn)
    batch = make_batch(family)
    names = list(model.state_dict())
    self_attentions = [m for m in model.modules() if isinstance(m, HfzooAttention) and not m.is_cross_attention]
    with torch.no_grad():
        before = run(model, batch).logits
        assert model.fuse_qkv_projections() == len(self_attentions)
        fused = run(model, batch).logits
    torch.testing.assert_close(fused, before, rtol=1e-5, atol=1e-5)
    assert model.fuse_qkv_projections() == 0  # already fused
    if family != "encoder" and model.config.use_cache:
        capacity_per_call = bool(model.config.num_experts) and model.config.router_type == "switch"
        prompt, mask = generation_prompt(family)
        check_cached_generation(model, prompt, mask, reference=reference, repeat_tokens=capacity_per_call)
    if self_attentions:  # (a stack without attention, e.g. FNet's Fourier mixing, has nothing to fuse)
        with pytest.raises(ValueError, match=r"fused \(fuse_qkv_projections\): call model.unfuse_qkv_projections"):
            model.save_pretrained(tmp_path / "fused")
        assert not (tmp_path / "fused").exists()
    assert model.unfuse_qkv_projections() == len(self_attentions)
    assert list(model.state_dict()) == names
    with torch.no_grad():
        torch.testing.assert_close(run(model, batch).logits, before, rtol=0, atol=0)


def check_eager_matches_sdpa(family: str, overrides: dict) -> None:
    """Eager and SDPA attention give the same logits (max abs difference < 1e-5) on a padded batch."""
    batch = make_batch(family)
    with torch.no_grad():
        eager = valid_logits(family, batch, run(checked_model(family, overrides, "eager"), batch).logits)
        sdpa = valid_logits(family, batch, run(checked_model(family, overrides, "sdpa"), batch).logits)
    assert (eager - sdpa).abs().max() < 1e-5


def check_variant(
    family: str,
    overrides: dict,
    tmp_path: Path,
    backends: tuple[str, ...] = ("eager", "sdpa"),
    allow_unused: tuple[str, ...] = (),
) -> None:
    """Run every check above for one variant in one family.

    Args:
        family: a key of `FAMILIES`.
        overrides: config fields that define the variant (on top of `TINY`).
        tmp_path: a folder for the save/load round trip.
        backends: the attention backends the variant supports (eager-only variants give `("eager",)`).
        allow_unused: substrings of parameter names allowed to get no gradient (e.g. experts no token
            was routed to).
    """
    attn = "sdpa" if "sdpa" in backends else backends[0]
    overrides = dict(overrides)
    check_forward_backward(family, overrides, allow_unused, attn)
    check_round_trip(family, overrides, tmp_path, attn)
    check_padding_invariance(family, overrides, attn)
    check_no_mask_equals_full_mask(family, overrides, attn)
    check_causality(family, overrides, attn)
    check_generation_cache(family, overrides, attn)
    check_fused_qkv_projections(family, overrides, tmp_path, attn)
    if {"eager", "sdpa"} <= set(backends):
        check_eager_matches_sdpa(family, overrides)
