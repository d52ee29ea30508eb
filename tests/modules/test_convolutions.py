"""Lightweight and dynamic convolutions (`hfzoo.modules.convolutions`, Wu et al. 2019) against written-out references.

Each block is compared with its formula computed one output position and one channel at a time from the
module's own weights: `o_proj(pointwise(sum_j softmax(kernel_h)_j * GLU(in_proj(x))[i + j - padding_left, c]))`
with the lightweight kernel a parameter per head and the dynamic one predicted from position i. Incremental
decoding with the cache must reproduce the full-sequence outputs; the config refuses bad values of the
`conv_*` fields naming them. The variant matrix (`tests/models/test_variants.py`) runs both mixers through every family.
"""

from __future__ import annotations

import pytest
import torch
from helpers.variant_checks import FAMILIES, TINY, build_model
from huggingface_hub.errors import StrictDataclassClassValidationError
from torch.nn import functional as F
from transformers.cache_utils import DynamicCache

from hfzoo import HfzooDecoderConfig, HfzooEncoderConfig
from hfzoo.models.narang import resolve_row
from hfzoo.models.presets import PRESETS
from hfzoo.modules.convolutions import DynamicConvolution, LightweightConvolution, conv_kernel_width

HIDDEN, HEADS = 8, 2


def make_mixer(cls, is_causal: bool, kernel_size: int, pointwise: bool = True, seed: int = 0):
    config = HfzooDecoderConfig(
        vocab_size=11,
        hidden_size=HIDDEN,
        num_attention_heads=HEADS,
        num_hidden_layers=1,
        intermediate_size=16,
        token_mixer="dynamic_convolution" if cls is DynamicConvolution else "lightweight_convolution",
        conv_kernel_size=kernel_size,
        conv_pointwise_projection=pointwise,
        use_cache=True,
    )
    torch.manual_seed(seed)
    mixer = cls(config, 0, is_causal=is_causal).eval()
    for param in mixer.parameters():  # larger than the 0.02 initialisation, so the kernels are far from uniform
        torch.nn.init.normal_(param, std=0.5)
    return mixer


def reference(mixer, hidden_states: torch.Tensor, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The block's formula, one output position and channel at a time."""
    batch_size, length, hidden = hidden_states.shape
    inputs = F.glu(mixer.in_proj(hidden_states), dim=-1)
    if padding_mask is not None:
        inputs = inputs * padding_mask[..., None]
    width, left = mixer.kernel_size, mixer.padding_left
    per_head = hidden // mixer.num_heads
    out = torch.zeros_like(inputs)
    for b in range(batch_size):
        for i in range(length):
            if isinstance(mixer, DynamicConvolution):
                kernels = mixer.weight_proj(inputs[b, i]).view(mixer.num_heads, width)
            else:
                kernels = mixer.weight
            kernels = kernels.softmax(-1)
            for c in range(hidden):
                for j in range(width):
                    t = i + j - left
                    if 0 <= t < length:
                        out[b, i, c] += kernels[c // per_head, j] * inputs[b, t, c]
    if mixer.pointwise is not None:
        out = mixer.pointwise(out)
    return mixer.o_proj(out)


@pytest.mark.parametrize("cls", [LightweightConvolution, DynamicConvolution])
@pytest.mark.parametrize("is_causal, kernel_size", [(True, 3), (False, 3), (False, 4), (True, 1)])
def test_block_matches_the_written_out_formula(cls, is_causal, kernel_size):
    mixer = make_mixer(cls, is_causal, kernel_size, pointwise=kernel_size != 1)
    x = torch.randn(2, 6, HIDDEN)
    padding = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])
    with torch.no_grad():
        out, weights = mixer(x, padding_mask=padding)
        expected = reference(mixer, x, padding)
    assert weights is None
    torch.testing.assert_close(out[0], expected[0])
    torch.testing.assert_close(out[1, :4], expected[1, :4])  # outputs at padding are unspecified


def test_centred_window_of_an_even_kernel_reaches_one_more_position_to_the_right():
    """fairseq's padding for an even width k in the encoder: (k - 1) // 2 to the left, k // 2 to the right."""
    mixer = make_mixer(LightweightConvolution, is_causal=False, kernel_size=4)
    assert mixer.padding_left == 1
    x = torch.randn(1, 7, HIDDEN)
    with torch.no_grad():
        base = mixer(x)[0]
        for t, expected_changed in ((5, {3, 4, 5, 6}), (0, {0, 1})):  # i sees i - 1 ... i + 2
            changed = x.clone()
            changed[0, t] += 1.0
            differs = (mixer(changed)[0] - base).abs().amax(-1)[0] > 1e-6
            assert set(differs.nonzero().flatten().tolist()) == expected_changed


@pytest.mark.parametrize("cls", [LightweightConvolution, DynamicConvolution])
def test_incremental_decoding_with_the_cache_equals_the_full_sequence(cls):
    mixer = make_mixer(cls, is_causal=True, kernel_size=4)
    x = torch.randn(2, 7, HIDDEN)
    cache = DynamicCache()
    with torch.no_grad():
        full = mixer(x)[0]
        steps = [mixer(x[:, :3], cache=cache)[0]]  # a prompt, then one token at a time
        steps += [mixer(x[:, i : i + 1], cache=cache)[0] for i in range(3, 7)]
    torch.testing.assert_close(torch.cat(steps, 1), full)
    assert cache.get_seq_length() == 7  # the cache keeps every input of the layer (its length is the sequence's)


def test_kernel_widths_per_layer():
    def widths(**fields):
        config = HfzooDecoderConfig(
            **{**TINY, "num_hidden_layers": 6, "token_mixer": "lightweight_convolution"}, **fields
        )
        return [conv_kernel_width(config, i) for i in range(6)]

    assert widths() == [3, 7, 15, 31, 31, 31]  # Wu et al.'s 3, 7, 15, 31 x 4
    assert widths(conv_kernel_size=5) == [5] * 6
    assert widths(conv_kernel_size=[1, 2, 3, 4, 5, 6]) == [1, 2, 3, 4, 5, 6]
    model = build_model("encoder-decoder", {"token_mixer": "dynamic_convolution", "conv_kernel_size": [2, 5]})
    for stack in (model.model.encoder, model.model.decoder):
        assert [layer.self_attn.kernel_size for layer in stack.layers] == [2, 5]
        assert [layer.self_attn.padding_left for layer in stack.layers] == ([1, 4] if stack.is_causal else [0, 2])
    assert all(layer.cross_attn is not None for layer in model.model.decoder.layers)  # cross-attention stays


def test_dynamic_kernels_depend_on_the_current_input_only():
    mixer = make_mixer(DynamicConvolution, is_causal=True, kernel_size=3)
    x = torch.randn(1, 5, HIDDEN)
    with torch.no_grad():
        inputs = F.glu(mixer.in_proj(x), dim=-1)
        kernels = mixer.weight_proj(inputs).view(1, 5, HEADS, 3).softmax(-1)
    assert not torch.allclose(kernels[0, 0], kernels[0, 1])  # a kernel per position
    torch.testing.assert_close(kernels.sum(-1), torch.ones(1, 5, HEADS))  # normalized over the width


def test_weight_dropout_drops_kernel_taps_in_training_only():
    mixer = make_mixer(LightweightConvolution, is_causal=False, kernel_size=5)
    mixer.weight_dropout = 0.5
    kernel = mixer.normalized_kernel(mixer.weight)
    torch.testing.assert_close(kernel, mixer.weight.softmax(-1))  # eval: no dropout
    mixer.train()
    torch.manual_seed(0)
    dropped = mixer.normalized_kernel(mixer.weight)
    assert (dropped == 0).any() and torch.allclose(dropped[dropped != 0], 2 * mixer.weight.softmax(-1)[dropped != 0])


def test_a_prefix_cache_in_a_bidirectional_stack_is_refused():
    mixer = make_mixer(LightweightConvolution, is_causal=False, kernel_size=3)
    with pytest.raises(ValueError, match="a convolution has no keys and values to prepend a prefix to"):
        mixer(torch.randn(1, 4, HIDDEN), cache=DynamicCache())


@pytest.mark.parametrize(
    "family, overrides, message",
    [
        ("decoder", {"conv_num_heads": 3}, r"conv_num_heads=3 must be a positive divisor of hidden_size=32"),
        ("encoder", {"num_attention_heads": 4, "conv_num_heads": 0}, r"conv_num_heads=0 must be a positive divisor"),
        ("decoder", {"conv_kernel_size": 0}, r"conv_kernel_size=0 must be a positive width"),
        ("encoder", {"conv_kernel_size": [3, -1]}, r"conv_kernel_size=\[3, -1\] must be a positive width"),
        (
            "encoder-decoder",
            {"conv_kernel_size": [3, 5, 7]},
            r"conv_kernel_size has 3 widths, but the encoder has 2 convolution layers",
        ),
        ("decoder", {"conv_weight_dropout": 1.0}, r"conv_weight_dropout must be in \[0, 1\), got 1.0"),
        (
            "decoder",
            {"position_embedding_type": "relative_attention_bias"},
            r"position_embedding_type='relative_attention_bias' acts inside attention, which "
            r"token_mixer='lightweight_convolution' does not have",
        ),
    ],
)
def test_bad_convolution_fields_are_refused(family, overrides, message):
    fields = {**TINY, "token_mixer": "lightweight_convolution", "use_cache": False, **overrides}
    with pytest.raises(StrictDataclassClassValidationError, match=message):
        FAMILIES[family][0](**fields)


def test_convolution_fields_without_a_convolution_are_refused():
    with pytest.raises(
        StrictDataclassClassValidationError,
        match=r"conv_kernel_size=7 only applies to token_mixer='lightweight_convolution' or 'dynamic_convolution', "
        r"but token_mixer='self_attention'",
    ):
        HfzooEncoderConfig(**TINY, conv_kernel_size=7)
    # one stack with a convolution is enough (a per-layer list must then fit that stack)
    config = FAMILIES["encoder-decoder"][0](
        **TINY, token_mixer="dynamic_convolution", decoder_token_mixer="self_attention", conv_kernel_size=[3, 5]
    )
    assert config.conv_kernel_size == [3, 5]


def test_narang_rows_resolve_to_the_mesh_tensorflow_block_sizes():
    """64 kernels (d_model / heads) of width 31, pointwise projection, no attention-level positions."""
    for row, mixer in (
        ("Dynamic convolution", "dynamic_convolution"),
        ("Lightweight convolution", "lightweight_convolution"),
    ):
        assert resolve_row(row, PRESETS["narang-vanilla"]) == {
            "token_mixer": mixer,
            "position_embedding_type": "none",
            "conv_pointwise_projection": True,
            "conv_kernel_size": 31,
            "conv_num_heads": 64,
        }
