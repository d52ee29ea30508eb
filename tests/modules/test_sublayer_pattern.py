"""`config.sublayer_pattern`: the order of token-mixer (s) and feed-forward (f) sublayers (Press et al. 2020)."""

from __future__ import annotations

import pytest
import torch
from helpers.variant_checks import FAMILIES, TINY, build_model, check_cached_generation, make_batch, run
from huggingface_hub.errors import StrictDataclassClassValidationError

from hfzoo.compat import output_cache
from hfzoo.modules.experts import SparseMoeFeedForward
from hfzoo.modules.layer import layer_sublayers, num_residual_branches, sandwich_pattern

N = TINY["num_hidden_layers"]


def stacks(model, family):
    return [model.model.encoder, model.model.decoder] if family == "encoder-decoder" else [model.model]


def kinds(layer) -> str:
    return ("s" if layer.self_attn is not None else "") + ("f" if layer.mlp is not None else "")


def test_sandwich_pattern_follows_the_paper():
    """`s^k (sf)^(n-k) f^k` (Press et al. 2020): 2n sublayers, n of each kind, k = 0 is interleaved."""
    assert sandwich_pattern(4, 2) == "sssfsfff"
    assert sandwich_pattern(3, 0) == "sfsfsf"
    assert sandwich_pattern(3, 3) == "sssfff"
    pattern = sandwich_pattern(16, 6)
    assert len(pattern) == 32 and pattern.count("s") == pattern.count("f") == 16
    assert pattern.startswith("s" * 7) and pattern.endswith("f" * 7) and "sfsf" in pattern
    with pytest.raises(ValueError, match="k=5"):
        sandwich_pattern(4, 5)


def test_patterns_split_into_layers():
    assert layer_sublayers(None, 3) == ["sf", "sf", "sf"]
    assert layer_sublayers("sfsfsf", 3) == ["sf", "sf", "sf"]
    assert layer_sublayers("sssfsfff", 4) == ["s", "s", "sf", "sf", "f", "f"]
    assert layer_sublayers("fsfs", 2) == ["f", "sf", "s"]
    assert layer_sublayers("ssss", 2) == ["s"] * 4


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_interleaved_pattern_is_the_default_model(family):
    """`"sf" * N` builds the same modules, checkpoint keys and outputs as no pattern."""
    default, explicit = build_model(family, {}), build_model(family, {"sublayer_pattern": "sf" * N})
    assert default.state_dict().keys() == explicit.state_dict().keys()
    for (name, a), b in zip(default.state_dict().items(), explicit.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    batch = make_batch(family)
    with torch.no_grad():
        assert torch.equal(run(default, batch).logits, run(explicit, batch).logits)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_layers_cache_indices_and_cross_attention_follow_the_pattern(family):
    model = build_model(family, {"sublayer_pattern": "ssff", "num_experts": 2, "moe_layer_interval": 2})
    for stack in stacks(model, family):
        assert [kinds(layer) for layer in stack.layers] == ["s", "sf", "f"]
        # token mixers take KV-cache layers 0, 1, ...; cross-attention shares its mixer's index
        assert [layer.self_attn.layer_idx for layer in stack.layers if layer.self_attn is not None] == [0, 1]
        for layer in stack.layers:
            has_cross = layer.cross_attn is not None
            assert has_cross == (stack.has_cross_attention and layer.self_attn is not None)
            if has_cross:
                assert layer.cross_attn.layer_idx == layer.self_attn.layer_idx
        # experts on every 2nd feed-forward sublayer: the second one, in layer 2
        assert [isinstance(layer.mlp, SparseMoeFeedForward) for layer in stack.layers if layer.mlp] == [False, True]


def test_sublayers_run_in_pattern_order():
    """Reordering the same sublayers changes the function, and the model computes exactly the pattern's order."""
    interleaved = build_model("decoder", {"sublayer_pattern": "sfsf"})
    reordered = build_model("decoder", {"sublayer_pattern": "sffs"})  # layers: sf, f, s
    a, b = interleaved.model.layers, reordered.model.layers
    b[1].mlp.load_state_dict(a[1].mlp.state_dict())
    b[1].mlp_norm.load_state_dict(a[1].mlp_norm.state_dict())
    b[2].self_attn.load_state_dict(a[1].self_attn.state_dict())
    b[2].self_attn_norm.load_state_dict(a[1].self_attn_norm.state_dict())
    b[0].load_state_dict(a[0].state_dict())
    reordered.model.embed_tokens.load_state_dict(interleaved.model.embed_tokens.state_dict())
    reordered.model.embed_positions.load_state_dict(interleaved.model.embed_positions.state_dict())
    reordered.model.norm.load_state_dict(interleaved.model.norm.state_dict())
    ids = torch.randint(2, TINY["vocab_size"], (1, 6))
    with torch.no_grad():
        out_a = interleaved.model(ids).last_hidden_state
        out_b = reordered.model(ids).last_hidden_state
        # the reordered model by hand, from the interleaved model's sublayers: s0 f0 f1 s1
        h = interleaved.model.embed_tokens(ids) + interleaved.model.embed_positions(torch.arange(6)[None])
        s0, s1 = a[0].self_attn, a[1].self_attn
        h = h + s0(a[0].self_attn_norm(h))[0]
        h = h + a[0].mlp(a[0].mlp_norm(h))
        h = h + a[1].mlp(a[1].mlp_norm(h))
        h = h + s1(a[1].self_attn_norm(h))[0]
        h = interleaved.model.norm(h)
    torch.testing.assert_close(out_b, h)
    assert not torch.allclose(out_a, out_b)


@pytest.mark.parametrize("family", ["decoder", "encoder-decoder"])
def test_attention_only_stacks_cache_one_layer_per_mixer(family):
    """4 token mixers in a 2-layer stack: the generation cache is sized for 4 layers, and cached = uncached."""
    model = build_model(family, {"sublayer_pattern": "ssss"})
    assert model.config.get_text_config(decoder=True).num_hidden_layers == 4
    batch = make_batch(family)
    # the same tokens and logits of every step without the cache
    cached = check_cached_generation(model, batch.input_ids, batch.attention_mask, max_new_tokens=6)
    cache = output_cache(cached)
    self_cache = cache.self_attention_cache if family == "encoder-decoder" else cache
    assert len(self_cache.layers) == 4


def test_fixup_counts_the_pattern_branches():
    """Fixup's L: one branch per sublayer of each stack, plus one per cross-attention."""
    config_class = FAMILIES["encoder-decoder"][0]
    assert num_residual_branches(config_class(**TINY)) == 2 * N + 3 * N
    assert num_residual_branches(config_class(**{**TINY, "sublayer_pattern": "sssf"})) == 4 + 4 + 3
    assert num_residual_branches(FAMILIES["decoder"][0](**{**TINY, "sublayer_pattern": "ssss"})) == 4


@pytest.mark.parametrize(
    "family, overrides, message",
    [
        (
            "decoder",
            {"sublayer_pattern": "sfs"},
            r"sublayer_pattern='sfs' has 3 sublayers, but the decoder has num_hidden_layers=2 layers: "
            r"expected 2 \* 2 = 4",
        ),
        ("encoder", {"sublayer_pattern": "sfsfsf"}, r"sublayer_pattern='sfsfsf' has 6 sublayers.*expected 2 \* 2 = 4"),
        (
            "encoder-decoder",
            {"sublayer_pattern": "sfsf", "num_decoder_layers": 3},
            r"sublayer_pattern='sfsf' has 4 sublayers, but the decoder has num_decoder_layers=3 layers",
        ),
        ("decoder", {"sublayer_pattern": "sxsf"}, r"sublayer_pattern='sxsf' must be a non-empty string of the letters"),
        ("decoder", {"sublayer_pattern": ""}, r"sublayer_pattern='' must be a non-empty string"),
        ("encoder-decoder", {"sublayer_pattern": "ffff", "use_cache": False}, r"sublayer_pattern='ffff' has no token"),
        ("decoder", {"sublayer_pattern": "ffff"}, r"use_cache=True, but sublayer_pattern='ffff' has no token mixer"),
        ("decoder", {"sublayer_pattern": "ssff", "block_sharing": "all"}, r"block_sharing='all' ties every layer"),
        (
            "encoder-decoder",
            {"sublayer_pattern": "sffs", "block_sharing": "encoder"},
            r"block_sharing='encoder' ties every layer of the encoder",
        ),
        (
            "decoder",
            {"sublayer_pattern": "ssss", "num_experts": 2},
            r"moe_layer_interval=1 exceeds the number of feed-forward sublayers of the deepest stack \(0\)",
        ),
    ],
)
def test_bad_patterns_are_refused(family, overrides, message):
    with pytest.raises(StrictDataclassClassValidationError, match=message):
        FAMILIES[family][0](**{**TINY, **overrides})


def test_uniform_patterns_allow_block_sharing():
    model = build_model("decoder", {"sublayer_pattern": "ssss", "block_sharing": "all"})
    layers = model.model.layers
    assert len(layers) == 4 and layers[3].self_attn.q_proj.weight is layers[0].self_attn.q_proj.weight
