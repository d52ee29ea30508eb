"""The Funnel Transformer layer stack (`hfzoo.modules.funnel`, `layer_stack="funnel"`): pooling, pool-query-only
attention, up-sampling, the compressed encoder of the encoder-decoder, and where it is refused."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.variant_checks import FAMILIES, TINY, build_model, make_batch, run
from huggingface_hub.errors import StrictDataclassClassValidationError
from transformers.cache_utils import DynamicCache

from hfzoo.modules.funnel import mean_pool

FUNNEL = {"layer_stack": "funnel"}
ENCODER_DECODER = {"layer_stack": "funnel", "decoder_layer_stack": "standard"}


def test_mean_pooling_averages_the_real_positions_of_each_window():
    x = torch.arange(2 * 5 * 1, dtype=torch.float32).view(2, 5, 1)
    valid = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)
    pooled, pooled_valid = mean_pool(x, valid)
    assert pooled.shape == (2, 3, 1)
    # row 0: (0+1)/2, (2+3)/2, 4; row 1: (5+6)/2, 7 (its padding left out), nothing
    torch.testing.assert_close(pooled[..., 0], torch.tensor([[0.5, 2.5, 4.0], [5.5, 7.0, 0.0]]))
    assert pooled_valid.tolist() == [[True, True, True], [True, True, False]]


def capture(module, store: list, inputs: bool = False):
    """Append a module's (first) input or output at each call."""
    if inputs:
        return module.register_forward_pre_hook(lambda m, args, kwargs: store.append(args[0]), with_kwargs=True)
    return module.register_forward_hook(lambda m, args, output: store.append(output))


def test_pooled_queries_attend_to_the_unpooled_keys_and_values():
    """Dai et al. §2.2, written out for the first layer of the second block (pre-norm, eager attention)."""
    model = build_model("encoder", {**FUNNEL, "funnel_upsampling_layers": 0}, attn="eager")
    layers = model.model.layers
    outputs = []
    for layer in layers[:2]:
        capture(layer, outputs)
    batch = make_batch("encoder")
    with torch.no_grad():
        run(model, batch)
        full, got = outputs
        pooled, pooled_valid = mean_pool(full, batch.attention_mask.bool())
        layer = layers[1]
        attn, heads, head_dim = layer.self_attn, TINY["num_attention_heads"], 32 // TINY["num_attention_heads"]
        queries, keys = layer.self_attn_norm(pooled), layer.self_attn_norm(full)

        def split(x):
            return x.view(*x.shape[:2], heads, head_dim).transpose(1, 2)

        scores = split(attn.q_proj(queries)) @ split(attn.k_proj(keys)).transpose(2, 3) / math.sqrt(head_dim)
        scores = scores.masked_fill(~batch.attention_mask.bool()[:, None, None, :], float("-inf"))
        mixed = (torch.softmax(scores, dim=-1) @ split(attn.v_proj(keys))).transpose(1, 2).flatten(2)
        hidden = pooled + attn.o_proj(mixed)
        expected = hidden + layer.mlp(layer.mlp_norm(hidden))
    real = pooled_valid
    torch.testing.assert_close(got[real], expected[real], rtol=1e-5, atol=1e-5)


def test_score_biases_see_pooled_positions_at_their_window_start():
    model = build_model(
        "encoder", {**FUNNEL, "num_hidden_layers": 3, "position_embedding_type": "relative_attention_bias"}
    )
    calls = []
    model.model.relative_attention_bias.register_forward_pre_hook(lambda m, args: calls.append(args))
    with torch.no_grad():
        run(model, make_batch("encoder"))  # 11 tokens; blocks of one layer at 11, 6 and 3 positions
    stack_call, *funnel_calls = calls
    positions = [(q.tolist(), k.tolist()) for q, k in funnel_calls]
    assert positions == [
        ([0, 2, 4, 6, 8, 10], list(range(11))),  # block 2's first layer: pooled queries, unpooled keys
        ([0, 2, 4, 6, 8, 10], [0, 2, 4, 6, 8, 10]),
        ([0, 4, 8], [0, 2, 4, 6, 8, 10]),  # block 3's first layer
        ([0, 4, 8], [0, 4, 8]),
    ]


def test_the_encoder_upsamples_and_adds_the_first_block():
    """Dai et al. §2.3: each pooled position repeated over its window, plus the first block's output."""
    model = build_model("encoder", {**FUNNEL, "num_hidden_layers": 3, "funnel_upsampling_layers": 0})
    first, last, final = [], [], []
    capture(model.model.layers[0], first)
    capture(model.model.layers[2], last)
    capture(model.model.norm, final, inputs=True)
    batch = make_batch("encoder")
    with torch.no_grad():
        logits = run(model, batch).logits
    assert logits.shape[:2] == batch.input_ids.shape and last[0].shape[1] == 3  # 11 -> 6 -> 3 positions
    expected = last[0].repeat_interleave(4, dim=1)[:, :11] + first[0]
    torch.testing.assert_close(final[0], expected)
    assert len(build_model("encoder", FUNNEL).model.layers) == TINY["num_hidden_layers"] + 2  # + 2 up-sampling


def test_the_encoder_decoder_cross_attends_to_the_compressed_encoder():
    """Narang et al. 2021: the decoder reads the pooled encoder output, with its pooled padding mask."""
    model = build_model("encoder-decoder", {**ENCODER_DECODER, "num_hidden_layers": 3})
    batch = make_batch("encoder-decoder")
    with torch.no_grad():
        out = run(model, batch)
    assert out.encoder_last_hidden_state.shape[1] == 3  # 11 -> 6 -> 3
    mask = model.model.encoder.output_attention_mask(batch.attention_mask)
    assert mask.tolist() == [[1, 1, 1], [1, 1, 0]]  # the second row has 6 real tokens: 6 -> 3 -> 2 real
    assert len(model.model.encoder.layers) == 3  # no up-sampling layers


@pytest.mark.parametrize(
    "family, overrides, message",
    [
        (
            "decoder",
            FUNNEL,
            r"layer_stack='funnel' is not defined for the causal decoder of hfzoo_decoder \(pooling mixes "
            r"neighbouring positions, so a position would see later ones\); choose one of \['standard', 'universal'\]",
        ),
        (
            "encoder-decoder",
            FUNNEL,
            r"layer_stack='funnel' is not defined for the causal decoder of hfzoo_encoder_decoder",
        ),
        (
            "encoder-decoder",
            {"decoder_layer_stack": "funnel"},
            r"decoder_layer_stack='funnel' is not defined for the causal decoder",
        ),
        (
            "encoder",
            {**FUNNEL, "position_embedding_type": "rotary"},
            r"position_embedding_type='rotary' .* cannot be pooled",
        ),
        (
            "encoder",
            {**FUNNEL, "position_embedding_type": "relative_attention_bias", "share_relative_attention_bias": False},
            r"cannot be pooled by layer_stack='funnel'",
        ),
        (
            "encoder",
            {**FUNNEL, "funnel_block_sizes": [1, 2]},
            r"funnel_block_sizes=\[1, 2\] has 3 layers, but the encoder",
        ),
        ("encoder", {**FUNNEL, "funnel_block_sizes": [2, 0]}, r"funnel_block_sizes must be None or a non-empty list"),
        ("encoder", {**FUNNEL, "funnel_upsampling_layers": -1}, r"funnel_upsampling_layers must be an integer >= 0"),
        (
            "encoder-decoder",
            {**ENCODER_DECODER, "funnel_upsampling_layers": 1},
            r"funnel_upsampling_layers=1: the encoder of hfzoo_encoder_decoder does not up-sample",
        ),
        ("encoder", {**FUNNEL, "num_experts": 2}, r"num_experts=2 with layer_stack='funnel'"),
        (
            "encoder",
            {"funnel_block_sizes": [1, 1]},
            r"funnel_block_sizes=\[1, 1\] only applies to layer_stack='funnel'",
        ),
    ],
)
def test_the_funnel_is_refused_where_it_is_undefined(family, overrides, message):
    with pytest.raises(StrictDataclassClassValidationError, match=message):
        FAMILIES[family][0](**{**TINY, **overrides})


def test_a_prefix_cache_is_refused():
    model = build_model("encoder", FUNNEL)
    batch = make_batch("encoder")
    with pytest.raises(ValueError, match="layer_stack='funnel' pools the sequence, so it takes no cache"):
        model(batch.input_ids, cache=DynamicCache())
