"""FNet's Fourier token mixing (`hfzoo.modules.fourier`) against numpy's FFT, and its place in the configs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers.flop_counting import flop_counter
from helpers.variant_checks import FAMILIES, TINY, build_model
from huggingface_hub.errors import StrictDataclassClassValidationError

from hfzoo.models.flops import count_training_flops, weights_per_token
from hfzoo.models.presets import build_config
from hfzoo.modules.fourier import FourierMixer, fourier_transform


def numpy_fnet(tokens: np.ndarray) -> np.ndarray:
    """`Re(F_seq(F_hidden(x)))` of one sequence `(n, hidden)` with numpy's FFT in float64 (eq. 3 of the paper)."""
    return np.fft.fft(np.fft.fft(tokens, axis=-1), axis=0).real


def test_unpadded_batch_matches_numpy_fft2():
    x = torch.randn(3, 13, 8)
    expected = np.stack([numpy_fnet(row) for row in x.double().numpy()])
    torch.testing.assert_close(fourier_transform(x), torch.from_numpy(expected).float(), rtol=1e-5, atol=1e-4)


def test_each_row_is_transformed_over_its_own_tokens():
    """Right, left and scattered padding: a row's tokens get the n-point DFT over them; padding gets 0."""
    x = torch.randn(4, 9, 6)
    mask = torch.tensor(
        [
            [1, 1, 1, 1, 1, 1, 1, 1, 1],  # a full row next to padded ones (DFT-matrix path)
            [1, 1, 1, 1, 1, 0, 0, 0, 0],  # right padding
            [0, 0, 0, 1, 1, 1, 1, 1, 1],  # left padding
            [1, 0, 1, 1, 0, 1, 0, 0, 1],  # tokens at scattered positions
        ],
        dtype=torch.bool,
    )
    out = fourier_transform(x, mask)
    for row in range(4):
        keep = mask[row]
        expected = torch.from_numpy(numpy_fnet(x[row, keep].double().numpy())).float()
        torch.testing.assert_close(out[row, keep], expected, rtol=1e-5, atol=1e-4)
        assert torch.equal(out[row, ~keep], torch.zeros_like(out[row, ~keep]))


def test_long_sequences_keep_exact_angles():
    """`r_i r_j mod n` in integers: a 600-token padded row still matches numpy in float64."""
    x = torch.randn(2, 601, 4, dtype=torch.float64)
    mask = torch.ones(2, 601, dtype=torch.bool)
    mask[1, -1] = False
    out = fourier_transform(x, mask)
    expected = torch.from_numpy(numpy_fnet(x[1, :600].numpy())).float()
    scale = expected.abs().max()
    assert ((out[1, :600] - expected).abs().max() / scale) < 1e-5


def test_mixer_has_no_parameters_keeps_the_dtype_and_is_bidirectional_only():
    mixer = FourierMixer(FAMILIES["encoder"][0](**TINY), layer_idx=0, is_causal=False)
    assert list(mixer.parameters()) == []
    x = torch.randn(2, 5, 32, dtype=torch.bfloat16)
    out, weights = mixer(x, padding_mask=torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool))
    assert out.dtype == torch.bfloat16 and weights is None
    with pytest.raises(ValueError, match="cannot run in a causal stack"):
        FourierMixer(FAMILIES["encoder"][0](**TINY), layer_idx=0, is_causal=True)


def test_fnet_encoder_mixes_with_the_transform_and_nothing_else():
    """Every encoder layer's token mixer is the Fourier transform: no attention projections in the model."""
    model = build_model("encoder", {"token_mixer": "fourier"})
    assert all(isinstance(layer.self_attn, FourierMixer) for layer in model.model.layers)
    assert not [name for name, _ in model.named_parameters() if "self_attn." in name]
    x = torch.randn(2, 7, TINY["hidden_size"])
    torch.testing.assert_close(
        model.model.layers[0].self_attn(x)[0], torch.fft.fft2(x, dim=(-2, -1)).real, rtol=1e-6, atol=1e-5
    )


@pytest.mark.parametrize(
    "family, overrides, message",
    [
        (
            "decoder",
            {"token_mixer": "fourier", "use_cache": False},
            r"token_mixer='fourier' is not defined for the causal decoder of hfzoo_decoder \(the Fourier transform "
            r"over the sequence mixes every position into every other, so a token would see later ones\); "
            r"choose one of \['self_attention'",
        ),
        (
            "encoder-decoder",
            {"token_mixer": "fourier"},
            r"token_mixer='fourier' is not defined for the causal decoder of hfzoo_encoder_decoder \(the Fourier",
        ),
        (
            "encoder-decoder",
            {"decoder_token_mixer": "fourier", "use_cache": False},
            r"decoder_token_mixer='fourier' is not defined for the causal decoder",
        ),
        (
            "encoder",
            {"token_mixer": "fourier", "position_embedding_type": "rotary"},
            r"position_embedding_type='rotary' acts inside attention, which token_mixer='fourier' does not have",
        ),
    ],
)
def test_fnet_is_refused_where_it_would_see_later_tokens(family, overrides, message):
    with pytest.raises(StrictDataclassClassValidationError, match=message):
        FAMILIES[family][0](**{**TINY, **overrides})


def test_flops_count_the_ffts_and_no_mixing_weights_or_scores():
    """FNet's sublayer has no weights or scores: the feed-forward and head, plus 5 N log2 N per FFT of length N."""
    config = build_config("encoder-tiny", {"token_mixer": "fourier", "vocab_size": 64})
    feed_forward, head = 2 * 64 * 256, 64 * 64 + 64 * 64  # per layer; MLM transform + tied output
    assert weights_per_token(config, "encoder") == 2 * feed_forward
    seq_len, hidden, layers = 10, config.hidden_size, config.num_hidden_layers
    # forward, per sublayer: an FFT of length hidden at each position and one of length seq_len at each channel
    ffts = seq_len * 5 * hidden * math.log2(hidden) + hidden * 5 * seq_len * math.log2(seq_len)
    assert FourierMixer.transform_flops(config, seq_len) == pytest.approx(ffts, rel=1e-12)
    count = count_training_flops(config, seq_len)
    assert count.weights == 6 * 10 * (2 * feed_forward + head)
    assert count.attention == pytest.approx(layers * 2 * ffts, rel=1e-12)  # backward: one FFT of the same size
    # the real model's matrix products agree with the weight term (torch's FlopCounterMode counts no FFT)
    torch.manual_seed(0)
    model = FAMILIES["encoder"][1](config)
    ids = torch.randint(3, 64, (1, 10))
    with flop_counter() as counter:
        model(input_ids=ids, labels=ids).loss.backward()
    assert counter.get_total_flops() == count.weights == count.total - count.attention
