"""Connections across a stack's layers (`hfzoo.modules.connections`): value residual learning and U-Net skips.

Both are compared with written-out references on a tiny model: ResFormer's `V_n' = l1 V_n + l2 V_1`
(Zhou et al. 2024) with attention computed by hand, and the U-Net wiring `h <- layer_j(h + w_i out_i)`,
j = L-1-i, with the layers called one at a time. Gradient checkpointing must give the same gradients, and
bad settings are refused when the config is built.
"""

from __future__ import annotations

import pytest
import torch
from helpers.variant_checks import FAMILIES, TINY, build_model, check_cached_generation, make_batch, run
from huggingface_hub.errors import StrictDataclassClassValidationError

from hfzoo import HfzooDecoderConfig, HfzooEncoderConfig, HfzooEncoderDecoderConfig
from hfzoo.modules.connections import UNetSkips

#: No positions and no padding: the written-out references need only the token embeddings and a causal mask.
PLAIN = {"position_embedding_type": "none", "num_hidden_layers": 3}


def randomize(parameter: torch.nn.Parameter, seed: int) -> None:
    """Move learned weights off their initial value (0.5 / 1), so a swapped or ignored weight shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        parameter.copy_(torch.rand(parameter.shape, generator=g) * 2 - 0.5)


def reference_value_residual(model, ids: torch.Tensor) -> torch.Tensor:
    """The decoder's final hidden states with ResFormer's value mixing, attention written out (eager, causal)."""
    stack = model.model
    hidden = stack.embed_tokens(ids)
    seq_len = ids.shape[1]
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
    first_values = None
    for n, layer in enumerate(stack.layers):
        attn = layer.self_attn
        x = layer.self_attn_norm(hidden)

        def heads(t, attn=attn):
            return t.view(*t.shape[:2], attn.num_heads, attn.head_dim).transpose(1, 2)

        q, k, v = heads(attn.q_proj(x)), heads(attn.k_proj(x)), heads(attn.v_proj(x))
        if n == 0:
            first_values = v
        else:
            lambda_1, lambda_2 = stack.value_residual.lambdas[n - 1]
            v = lambda_1 * v + lambda_2 * first_values
        scores = (q @ k.transpose(-1, -2)) * attn.head_dim**-0.5
        probs = scores.masked_fill(~causal, float("-inf")).softmax(-1)
        out = (probs @ v).transpose(1, 2).reshape(*ids.shape, -1)
        hidden = hidden + attn.o_proj(out)
        hidden = hidden + layer.mlp(layer.mlp_norm(hidden))
    return stack.norm(hidden)


@torch.no_grad()
def test_value_residual_matches_resformer_written_out():
    model = build_model("decoder", {**PLAIN, "value_residual": True}, attn="eager")
    randomize(model.model.value_residual.lambdas, seed=1)
    ids = torch.randint(2, TINY["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(0))
    out = model.model(ids).last_hidden_state
    torch.testing.assert_close(out, reference_value_residual(model, ids), rtol=1e-5, atol=1e-5)
    # and the mixing matters: the plain model with the same weights differs
    plain = build_model("decoder", PLAIN, attn="eager")
    plain.load_state_dict(model.state_dict(), strict=False)
    assert not torch.allclose(plain.model(ids).last_hidden_state, out, atol=1e-3)


@pytest.mark.parametrize("family", list(FAMILIES))
@torch.no_grad()
def test_value_residual_with_weights_1_0_is_the_plain_model(family):
    """lambda = (1, 0) in every later token mixer leaves the values alone: the plain model's outputs."""
    model = build_model(family, {"value_residual": True}, attn="eager")
    stacks = [model.model.encoder, model.model.decoder] if family == "encoder-decoder" else [model.model]
    for stack in stacks:
        stack.value_residual.lambdas.copy_(torch.tensor([1.0, 0.0]).expand_as(stack.value_residual.lambdas))
    plain = build_model(family, {}, attn="eager")
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    assert not missing and all("value_residual" in key for key in unexpected)
    batch = make_batch(family)
    torch.testing.assert_close(run(model, batch).logits, run(plain, batch).logits)


@pytest.mark.parametrize("num_layers", [3, 4])
@torch.no_grad()
def test_unet_skips_match_the_written_out_wiring(num_layers):
    """`h <- layer_j(h + w_i out_i)` for j = L-1-i in the second half; an odd stack's middle layer takes no skip."""
    model = build_model("decoder", {**PLAIN, "num_hidden_layers": num_layers, "unet_skips": True}, attn="eager")
    stack = model.model
    assert stack.unet_skips.weight.shape == (num_layers // 2,)
    randomize(stack.unet_skips.weight, seed=2)
    ids = torch.randint(2, TINY["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(0))
    hidden = stack.embed_tokens(ids)
    mask = stack.self_attention_mask(hidden, None, None, torch.arange(9)[None])
    outputs = []
    for j, layer in enumerate(stack.layers):
        i = num_layers - 1 - j
        if i < j:  # second half, the middle layer excluded
            hidden = hidden + stack.unet_skips.weight[i] * outputs[i]
        hidden = layer(hidden, attention_mask=mask)
        outputs.append(hidden)
    torch.testing.assert_close(stack(ids).last_hidden_state, stack.norm(hidden), rtol=1e-5, atol=1e-5)
    assert [UNetSkips.mirror(num_layers, j) for j in range(num_layers)] == (
        [None, None, 0] if num_layers == 3 else [None, None, 1, 0]
    )


@pytest.mark.parametrize("family", list(FAMILIES))
@torch.no_grad()
def test_unet_skips_with_weights_0_are_the_plain_model(family):
    model = build_model(family, {"unet_skips": True}, attn="eager")
    stacks = [model.model.encoder, model.model.decoder] if family == "encoder-decoder" else [model.model]
    for stack in stacks:
        stack.unet_skips.weight.zero_()
    plain = build_model(family, {}, attn="eager")
    plain.load_state_dict(model.state_dict(), strict=False)
    batch = make_batch(family)
    torch.testing.assert_close(run(model, batch).logits, run(plain, batch).logits)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_gradient_checkpointing_gives_the_same_gradients(family):
    """The first values and the skips cross checkpointed layers: recomputation must not change any gradient."""
    overrides = {"value_residual": True, "unet_skips": True, "num_hidden_layers": 3, "num_decoder_layers": 3}
    if family != "encoder-decoder":
        del overrides["num_decoder_layers"]
    batch = make_batch(family)
    grads = []
    for checkpointing in (False, True):
        model = build_model(family, overrides, attn="eager").train()
        if checkpointing:
            model.activation_checkpointing_enable()
        run(model, batch, labels=batch.labels).loss.backward()
        grads.append({name: p.grad for name, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys()
    assert any("value_residual" in name for name in grads[0]) and any("unet_skips" in name for name in grads[0])
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], msg=name)


@pytest.mark.parametrize("family", ["decoder", "encoder-decoder"])
@torch.no_grad()
def test_greedy_tokens_are_the_same_with_a_dynamic_a_static_and_no_cache(family):
    """The cache stores the mixed values and the skips act per position: every cache gives the uncached tokens."""
    model = build_model(family, {"value_residual": True, "unet_skips": True, "num_hidden_layers": 3})
    for name, parameter in model.named_parameters():
        if "value_residual" in name or "unet_skips" in name:
            randomize(parameter, seed=3)
    ids = torch.randint(2, TINY["vocab_size"], (2, 6), generator=torch.Generator().manual_seed(0))
    for cache in ("dynamic", "static"):  # the same tokens and logits of every step as without a cache
        check_cached_generation(model, ids, max_new_tokens=6, cache_kwargs={"cache_implementation": cache})


def test_weights_count_and_start_as_modded_nanogpt():
    """2 weights per later token mixer (0.5, 0.5) and 1 per skip (1.0), in each stack of the encoder-decoder."""
    base = build_model("encoder-decoder", {"num_hidden_layers": 3, "num_decoder_layers": 5})
    model = build_model(
        "encoder-decoder", {"num_hidden_layers": 3, "num_decoder_layers": 5, "value_residual": True, "unet_skips": True}
    )
    assert model.num_parameters() - base.num_parameters() == (2 * 2 + 2 * 4) + (1 + 2)
    assert torch.equal(model.model.decoder.value_residual.lambdas, torch.full((4, 2), 0.5))
    assert torch.equal(model.model.encoder.unet_skips.weight, torch.ones(1))


@pytest.mark.parametrize(
    "config_class, overrides, message",
    [
        (HfzooDecoderConfig, {"value_residual": 1}, r"value_residual must be True or False, got 1"),
        (HfzooDecoderConfig, {"unet_skips": "yes"}, r"unet_skips must be True or False, got 'yes'"),
        (
            HfzooDecoderConfig,
            {"value_residual": True, "layer_stack": "universal"},
            r"value_residual=True is not defined for layer_stack='universal' \(it applies one block recurrently.*"
            r"use layer_stack in \['standard'\] or value_residual=False",
        ),
        (
            HfzooDecoderConfig,
            {"unet_skips": True, "layer_stack": "universal"},
            r"unet_skips=True is not defined for layer_stack='universal'",
        ),
        (
            HfzooEncoderConfig,
            {"unet_skips": True, "layer_stack": "funnel"},
            r"unet_skips=True is not defined for layer_stack='funnel' \(it pools the sequence",
        ),
        (
            HfzooEncoderDecoderConfig,
            {"value_residual": True, "decoder_layer_stack": "universal"},
            r"value_residual=True is not defined for decoder_layer_stack='universal'",
        ),
        (
            HfzooEncoderConfig,
            {"value_residual": True, "token_mixer": "fourier"},
            r"token_mixer='fourier' has no per-head values to mix; choose token_mixer in \['self_attention', "
            r"'sliding_window', 'bigbird', 'branched_attention'\] or value_residual=False",
        ),
        (
            HfzooDecoderConfig,
            {"value_residual": True, "token_mixer": "synthesizer"},
            r"token_mixer='synthesizer' has no per-head values",
        ),
        (
            HfzooEncoderDecoderConfig,
            {"value_residual": True, "decoder_token_mixer": "lightweight_convolution"},
            r"decoder_token_mixer='lightweight_convolution' has no per-head values",
        ),
        (
            HfzooDecoderConfig,
            {"value_residual": True, "layer_type": "evolved_transformer"},
            r"value_residual=True is not defined for layer_type='evolved_transformer'",
        ),
        (
            HfzooDecoderConfig,
            {"value_residual": True, "num_hidden_layers": 1},
            r"value_residual=True needs at least 2 token mixers in the decoder .* num_hidden_layers=1",
        ),
        (
            HfzooDecoderConfig,
            {"value_residual": True, "sublayer_pattern": "sfff", "use_cache": True},
            r"value_residual=True needs at least 2 token mixers .* gives it 1",
        ),
        (
            HfzooEncoderDecoderConfig,
            {"unet_skips": True, "num_decoder_layers": 1},
            r"unet_skips=True connects layer i .* the decoder has 1 layer \(num_decoder_layers=1\)",
        ),
    ],
)
def test_bad_settings_are_refused(config_class, overrides, message):
    with pytest.raises(StrictDataclassClassValidationError, match=message):
        config_class(**{**TINY, **overrides})
