"""Synthesizer attention (`hfzoo.modules.synthesizer`, Tay et al. 2020) against a written-out reference.

The reference computes the logits of each synthesis one (head, query, key) entry at a time from the module's
weights (dense: `relu(q_i) . W_2[j]`; random: `R[h, i, j]`; factorized: `sum_t R_1[h, i, t] R_2[h, j, t]`),
mixes them with `q_i . k_j` as the mixing says, masks and normalizes them and weighs the values. Incremental
decoding must reproduce the full sequence, longer inputs than the matrices are refused, and so are bad fields.
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers.variant_checks import FAMILIES, TINY, build_model
from huggingface_hub.errors import StrictDataclassClassValidationError
from transformers.cache_utils import DynamicCache

from hfzoo import HfzooDecoderConfig, HfzooEncoderConfig
from hfzoo.models.narang import resolve_row
from hfzoo.models.presets import PRESETS
from hfzoo.modules.synthesizer import SYNTHESIZER_MIXINGS, SYNTHESIZERS, Synthesizer

HIDDEN, HEADS, HEAD_DIM, MAX_LEN = 12, 2, 3, 8


def make_synthesizer(kind: str, mixing: str, is_causal: bool, seed: int = 0) -> Synthesizer:
    config = HfzooDecoderConfig(
        vocab_size=11,
        hidden_size=HIDDEN,
        num_attention_heads=3,
        num_hidden_layers=1,
        intermediate_size=16,
        max_position_embeddings=MAX_LEN,
        position_embedding_type="none",
        token_mixer="synthesizer",
        synthesizer_type=kind,
        synthesizer_mixing=mixing,
        synthesizer_num_heads=HEADS,
        synthesizer_head_dim=HEAD_DIM,
        synthesizer_factorized_rank=2,
    )
    torch.manual_seed(seed)
    mixer = Synthesizer(config, 0, is_causal=is_causal).eval()
    for param in mixer.parameters():
        torch.nn.init.normal_(param, std=0.5)
    return mixer


def reference(mixer: Synthesizer, x: torch.Tensor, key_padding: torch.Tensor | None = None) -> torch.Tensor:
    """Tay et al.'s formula entry by entry: logits, mixture, mask, softmax, weighted values, output projection."""
    batch_size, length, _ = x.shape

    def heads(proj):
        return proj(x).view(batch_size, length, HEADS, HEAD_DIM)

    q = heads(mixer.q_proj) if mixer.q_proj is not None else None
    k = heads(mixer.k_proj) if mixer.k_proj is not None else None
    v = heads(mixer.v_proj)
    synthesis = mixer.synthesis
    out = torch.zeros(batch_size, length, HEADS, HEAD_DIM)
    for b in range(batch_size):
        for h in range(HEADS):
            for i in range(length):
                logits = torch.full((length,), -math.inf)
                for j in range(length):
                    if (mixer.is_causal and j > i) or (key_padding is not None and not key_padding[b, j]):
                        continue
                    if isinstance(synthesis, SYNTHESIZERS["dense"]):
                        synthesized = (q[b, i, h].relu() * synthesis.proj.weight[j]).sum()
                    elif isinstance(synthesis, SYNTHESIZERS["random"]):
                        synthesized = synthesis.logits.weight[i, h * MAX_LEN + j]
                    else:
                        r1 = synthesis.query_factors.weight[i].view(HEADS, -1)[h]
                        r2 = synthesis.key_factors.weight[j].view(HEADS, -1)[h]
                        synthesized = (r1 * r2).sum()
                    if mixer.mixing == "none":
                        logits[j] = synthesized
                    else:
                        dot = (q[b, i, h] * k[b, j, h]).sum() * HEAD_DIM**-0.5
                        if mixer.mixing == "plus":
                            logits[j] = synthesized + dot
                        else:
                            alpha = torch.sigmoid(mixer.mixing_logit[0])
                            logits[j] = alpha * synthesized + (1 - alpha) * dot
                out[b, i, h] = (logits.softmax(0)[:, None] * v[b, :, h]).sum(0)
    return mixer.o_proj(out.reshape(batch_size, length, -1))


@pytest.mark.parametrize("kind", list(SYNTHESIZERS))
@pytest.mark.parametrize("mixing", list(SYNTHESIZER_MIXINGS))
@pytest.mark.parametrize("is_causal", [True, False])
def test_synthesizer_matches_the_written_out_formula(kind, mixing, is_causal):
    mixer = make_synthesizer(kind, mixing, is_causal)
    x = torch.randn(2, 5, HIDDEN)
    padding = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])
    # the eager backend's additive mask for a bidirectional stack with padding; a causal stack builds its own
    mask = None if is_causal else torch.zeros(2, 1, 5, 5).masked_fill(~padding[:, None, None], torch.finfo().min)
    with torch.no_grad():
        out, weights = mixer(x, attention_mask=mask)
        expected = reference(mixer, x, None if is_causal else padding)
    torch.testing.assert_close(out, expected)
    if is_causal:  # the synthesized matrix is masked: no weight on a later position
        assert torch.equal(weights.triu(1), torch.zeros_like(weights))
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, HEADS, 5))


def test_a_boolean_mask_and_an_additive_mask_give_the_same_weights():
    """SDPA's boolean mask (True = attend) and eager's additive mask mean the same to the synthesizer."""
    mixer = make_synthesizer("random", "plus", is_causal=False)
    x = torch.randn(2, 4, HIDDEN)
    keep = torch.tensor([[True] * 4, [True, True, False, False]])[:, None, None].expand(2, 1, 4, 4)
    with torch.no_grad():
        boolean = mixer(x, attention_mask=keep)[1]
        additive = mixer(x, attention_mask=torch.zeros(2, 1, 4, 4).masked_fill(~keep, torch.finfo().min))[1]
    torch.testing.assert_close(boolean, additive)
    assert torch.equal(boolean[1, :, :, 2:], torch.zeros(HEADS, 4, 2))


@pytest.mark.parametrize("kind", list(SYNTHESIZERS))
@pytest.mark.parametrize("mixing", ["none", "plus_alpha"])
def test_incremental_decoding_with_the_cache_equals_the_full_sequence(kind, mixing):
    mixer = make_synthesizer(kind, mixing, is_causal=True)
    x = torch.randn(2, 7, HIDDEN)
    cache = DynamicCache()
    with torch.no_grad():
        full = mixer(x)[0]
        steps = [mixer(x[:, :3], cache=cache)[0]]
        steps += [mixer(x[:, i : i + 1], cache=cache)[0] for i in range(3, 7)]
    torch.testing.assert_close(torch.cat(steps, 1), full)
    assert cache.get_seq_length() == 7


def test_random_logits_do_not_depend_on_the_input():
    mixer = make_synthesizer("random", "none", is_causal=False)
    with torch.no_grad():
        first = mixer(torch.randn(1, 6, HIDDEN))[1]
        second = mixer(torch.randn(1, 6, HIDDEN))[1]
    torch.testing.assert_close(first, second)
    assert mixer.q_proj is None and mixer.k_proj is None  # no queries or keys at all


def test_mixing_weight_starts_at_one_half():
    model = build_model("decoder", {"token_mixer": "synthesizer", "synthesizer_mixing": "plus_alpha"})
    alphas = [layer.self_attn.mixing_logit for layer in model.model.layers]
    assert all(torch.equal(alpha, torch.zeros(1)) for alpha in alphas)


def test_sequences_longer_than_the_synthesized_matrices_are_refused():
    model = build_model("decoder", {"token_mixer": "synthesizer", "synthesizer_type": "random"})
    ids = torch.randint(2, TINY["vocab_size"], (1, TINY["max_position_embeddings"] + 1))
    with torch.no_grad():
        model(ids[:, :-1])  # exactly max_position_embeddings tokens are fine
        with pytest.raises(ValueError, match=r"sequence of 65 tokens is longer than max_position_embeddings=64"):
            model(ids)


def test_a_prefix_cache_in_a_bidirectional_stack_is_refused():
    mixer = make_synthesizer("dense", "plus", is_causal=False)
    with pytest.raises(ValueError, match="its synthesized rows have no columns for prefix keys"):
        mixer(torch.randn(1, 3, HIDDEN), cache=DynamicCache())


def test_layer_parameters_follow_the_synthesis():
    """Per layer: dense q, v, o + W_2; random v, o + R; factorized v, o + R_1, R_2; mixtures add q / k (+ a)."""
    inner = HEADS * HEAD_DIM
    projection = HIDDEN * inner + inner  # weight + bias
    counts = {
        (kind, mixing): sum(p.numel() for p in make_synthesizer(kind, mixing, True).parameters())
        for kind in SYNTHESIZERS
        for mixing in SYNTHESIZER_MIXINGS
    }
    output = inner * HIDDEN + HIDDEN
    assert counts["dense", "none"] == 2 * projection + output + HEAD_DIM * MAX_LEN
    assert counts["random", "none"] == projection + output + HEADS * MAX_LEN * MAX_LEN
    assert counts["factorized_random", "none"] == projection + output + 2 * MAX_LEN * HEADS * 2
    assert counts["random", "plus"] == counts["random", "none"] + 2 * projection
    assert counts["dense", "plus_alpha"] == counts["dense", "plus"] + 1 == counts["dense", "none"] + projection + 1


@pytest.mark.parametrize(
    "family, overrides, message",
    [
        ("decoder", {"synthesizer_type": "fixed"}, r"synthesizer_type='fixed' is not supported; choose one of \["),
        ("encoder", {"synthesizer_mixing": "minus"}, r"synthesizer_mixing='minus' is not supported"),
        ("decoder", {"synthesizer_num_heads": 0}, r"synthesizer_num_heads must be None or a positive integer"),
        ("decoder", {"synthesizer_factorized_rank": 0}, r"synthesizer_factorized_rank must be a positive integer"),
        ("encoder", {"position_embedding_type": "shaw"}, r"position_embedding_type='shaw' is not supported by"),
        (
            "decoder",
            {"position_embedding_type": "rotary"},
            r"position_embedding_type='rotary' rotates queries and keys, which token_mixer='synthesizer' has only "
            r"with synthesizer_mixing='plus' / 'plus_alpha'",
        ),
        (
            "decoder",
            {"position_embedding_type": "rotary", "synthesizer_mixing": "plus", "synthesizer_head_dim": 4},
            r"synthesizer_head_dim equal to head_dim=8",
        ),
        (
            "encoder-decoder",
            {"position_embedding_type": "alibi", "synthesizer_num_heads": 2},
            r"position_embedding_type='alibi' gives num_attention_heads=4 score biases, but the synthesizer has "
            r"synthesizer_num_heads=2",
        ),
    ],
)
def test_bad_synthesizer_fields_are_refused(family, overrides, message):
    with pytest.raises(StrictDataclassClassValidationError, match=message):
        FAMILIES[family][0](**{**TINY, "token_mixer": "synthesizer", **overrides})


def test_synthesizer_fields_without_a_synthesizer_are_refused():
    with pytest.raises(
        StrictDataclassClassValidationError,
        match=r"synthesizer_type='random' only applies to token_mixer='synthesizer', but token_mixer='self_attention'",
    ):
        HfzooEncoderConfig(**TINY, synthesizer_type="random")


def test_narang_rows_resolve_to_mesh_tensorflow_shapes():
    assert resolve_row("Synthesizer (random plus alpha)", PRESETS["narang-vanilla"]) == {
        "token_mixer": "synthesizer",
        "synthesizer_type": "random",
        "synthesizer_mixing": "plus_alpha",
        "synthesizer_num_heads": 8,
        "synthesizer_head_dim": 128,
        "position_embedding_type": "none",
    }
