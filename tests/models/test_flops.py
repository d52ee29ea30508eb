"""Training FLOPs from a config (`hfzoo.models.flops`): hand counts, and torch's FlopCounterMode on real models.

The hand counts write out 6N + 12 L T^2 d_attn (Kaplan et al. 2020 §2.1, PaLM App. B) for a small decoder,
encoder, encoder-decoder and a mixture-of-experts layer. `FlopCounterMode` counts the matrix products a
forward and backward pass of the real model performs; it must agree exactly with the count for every
Table 1 row (a modification whose compute the count misses fails here).
"""

from __future__ import annotations

import math

import pytest
import torch
from helpers.flop_counting import flop_counter, row_config
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM

import hfzoo  # noqa: F401
from hfzoo.models.flops import count_training_flops, weights_per_token
from hfzoo.models.narang import TABLE_1_ROWS
from hfzoo.models.presets import build_config

H, LAYERS, HEADS, HEAD_DIM, FF, VOCAB = 16, 2, 2, 8, 32, 64  # d_attn = HEADS * HEAD_DIM = 16
SMALL = dict(
    hidden_size=H,
    num_hidden_layers=LAYERS,
    num_attention_heads=HEADS,
    head_dim=HEAD_DIM,
    intermediate_size=FF,
    vocab_size=VOCAB,
    pad_token_id=0,
    eos_token_id=1,
)
T, DECODER_T = 10, 4
AUTO = {
    "hfzoo_decoder": AutoModelForCausalLM,
    "hfzoo_encoder": AutoModelForMaskedLM,
    "hfzoo_encoder_decoder": AutoModelForSeq2SeqLM,
}


def measured_flops(config, seq_len: int, decoder_seq_len: int | None = None) -> int:
    """FLOPs of the matrix products of one forward + backward pass of the real model on one sequence."""
    torch.manual_seed(0)
    model = AUTO[config.model_type].from_config(config, attn_implementation="eager")
    ids = torch.randint(3, config.vocab_size, (1, seq_len))
    batch = {"input_ids": ids, "labels": ids if decoder_seq_len is None else ids[:, :decoder_seq_len]}
    if config.num_softmaxes > 1:
        # the mixture of softmaxes' chunked loss recomputes its forward in backward (checkpointed chunks), which
        # model FLOPs do not count: measure the path with full logits
        batch["skip_logits"] = False
    with flop_counter() as counter:
        model(**batch).loss.backward()
    return counter.get_total_flops()


def test_decoder_hand_count():
    config = build_config("decoder-tiny", SMALL)
    # per token: 2 layers x (q, k, v, o: 4 x 16 x 16 + up, down: 2 x 16 x 32) + tied output 16 x 64
    per_token = 2 * (4 * 16 * 16 + 2 * 16 * 32) + 16 * 64
    assert per_token == 5120 == weights_per_token(config, "encoder") + weights_per_token(config, "head")
    expected = 6 * T * per_token + 12 * 2 * T * T * 16  # 6N per token + 12 L T^2 d_attn
    count = count_training_flops(config, T)
    assert (count.total, count.tokens, count.per_token) == (expected, T, expected / T) == (345600, 10, 34560)
    assert measured_flops(config, T) == expected


def test_encoder_hand_count_includes_the_masked_lm_transform():
    config = build_config("encoder-tiny", SMALL)
    per_token = 2 * (4 * 16 * 16 + 2 * 16 * 32) + 16 * 16 + 16 * 64  # + BERT's dense hidden -> hidden
    expected = 6 * T * per_token + 12 * 2 * T * T * 16
    assert count_training_flops(config, T).total == expected == 360960
    assert measured_flops(config, T) == expected


def test_encoder_decoder_hand_count():
    config = build_config("encoder-decoder-tiny", {**SMALL, "num_decoder_layers": 2})
    encoder = 2 * (4 * 16 * 16 + 2 * 16 * 32)  # per encoder token
    cross_key_value = 2 * (2 * 16 * 16)  # every decoder layer's k, v projections of each encoder token
    decoder = 2 * (4 * 16 * 16 + 2 * 16 * 16 + 2 * 16 * 32)  # self q, k, v, o + cross q, o + feed-forward
    head = 16 * 64
    weights = 6 * (T * (encoder + cross_key_value) + DECODER_T * (decoder + head))
    pairs = 2 * T * T + 2 * DECODER_T * (DECODER_T + T)  # encoder self; decoder self + cross
    expected = weights + 12 * pairs * 16
    count = count_training_flops(config, T, DECODER_T)
    assert (count.total, count.tokens) == (expected, T + DECODER_T) == (514560, 14)
    assert measured_flops(config, T, DECODER_T) == expected


def test_mixture_of_experts_counts_only_the_active_experts():
    config = build_config("decoder-tiny", {**SMALL, "num_experts": 4, "num_experts_per_tok": 2})
    feed_forward = 2 * (2 * 16 * 32) + 16 * 4  # top-2 of 4 experts + the router
    per_token = 2 * (4 * 16 * 16 + feed_forward) + 16 * 64
    expected = 6 * T * per_token + 12 * 2 * T * T * 16
    assert count_training_flops(config, T).total == expected
    assert measured_flops(config, T) == expected  # top-k routing sends each token to exactly k experts
    # Twice the experts, the same compute per token (only the router grows).
    more = build_config("decoder-tiny", {**SMALL, "num_experts": 8, "num_experts_per_tok": 2})
    assert count_training_flops(more, T).total - expected == 6 * T * 2 * 16 * 4


@pytest.mark.parametrize("seq_len", [8, 10])
def test_fourier_mixer_adds_5_n_log2_n_per_fft_to_the_attention_free_count(seq_len):
    """FNet = the self-attention encoder without attention's weights and scores, plus its FFTs (5 N log2 N each)."""
    attention = build_config("encoder-tiny", SMALL)
    fourier = build_config("encoder-tiny", {**SMALL, "token_mixer": "fourier"})
    d_attn = HEADS * HEAD_DIM
    attention_free = (
        count_training_flops(attention, seq_len).total
        - 6 * seq_len * LAYERS * 4 * H * d_attn  # q, k, v, o
        - 12 * LAYERS * seq_len * seq_len * d_attn  # scores and weighted values
    )
    # per sublayer, forward: an FFT of length H at each position, one of length seq_len at each channel
    ffts = seq_len * 5 * H * math.log2(H) + H * 5 * seq_len * math.log2(seq_len)
    count = count_training_flops(fourier, seq_len)
    assert count.total - attention_free == pytest.approx(LAYERS * 2 * ffts, rel=1e-12)  # forward + backward
    assert count.weights == attention_free  # the FFTs are no matrix products
    if seq_len == 8:  # 2 layers x 2 x (8 x 5 x 16 x 4 + 16 x 5 x 8 x 3)
        assert count.attention == 2 * 2 * (2560 + 1920) == 17920
    assert measured_flops(fourier, seq_len) == attention_free  # torch's FlopCounterMode counts no FFT


def test_bad_lengths_are_refused():
    decoder = build_config("decoder-tiny", SMALL)
    with pytest.raises(ValueError, match="decoder_seq_len is required for an encoder-decoder and only for one"):
        count_training_flops(decoder, T, DECODER_T)
    with pytest.raises(ValueError, match="decoder_seq_len is required"):
        count_training_flops(build_config("encoder-decoder-tiny", SMALL), T)
    with pytest.raises(ValueError, match="must be positive"):
        count_training_flops(decoder, 0)


@pytest.mark.parametrize("row", list(TABLE_1_ROWS))
def test_every_table_1_row_matches_flop_counter_mode(row):
    config = row_config(row)
    assert measured_flops(config, 12, 5) == count_training_flops(config, 12, 5).total


def test_switch_with_dropped_tokens_does_less_than_the_count():
    """The count assumes every token reaches its expert (model FLOPs); Switch's capacity may drop some."""
    config = build_config(
        "decoder-tiny", {**SMALL, "num_experts": 8, "router_type": "switch", "expert_capacity_factor": 0.5}
    )
    assert measured_flops(config, T) < count_training_flops(config, T).total


@pytest.mark.parametrize("family", ["decoder-tiny", "encoder-decoder-tiny"])
def test_sublayer_patterns_count_their_sublayers(family):
    """An attention-only stack counts 2N token mixers and no feed-forward; an ordering counts what it has."""
    for pattern, mixers, feed_forwards in (("ssss", 4, 0), ("fssf", 2, 2)):
        config = build_config(family, {**SMALL, "sublayer_pattern": pattern, "use_cache": False})
        stack = "decoder" if config.is_encoder_decoder else "encoder"
        cross = 2 * 16 * 16 if config.is_encoder_decoder else 0  # cross-attention q, o after each token mixer
        assert weights_per_token(config, stack) == mixers * (4 * 16 * 16 + cross) + feed_forwards * 2 * 16 * 32
        lengths = (T, DECODER_T) if config.is_encoder_decoder else (T,)
        assert measured_flops(config, *lengths) == count_training_flops(config, *lengths).total


@pytest.mark.parametrize("family", ["decoder-tiny", "encoder-tiny", "encoder-decoder-tiny"])
def test_value_residual_and_unet_skips_add_no_matrix_products(family):
    """ResFormer's value mixing and the U-Net skips are elementwise: the count and FlopCounterMode stay the plain model's."""
    fields = {**SMALL, "num_hidden_layers": 3}
    plain = build_config(family, fields)
    config = build_config(family, {**fields, "value_residual": True, "unet_skips": True})
    lengths = (T, DECODER_T) if config.is_encoder_decoder else (T,)
    assert count_training_flops(config, *lengths) == count_training_flops(plain, *lengths)


@pytest.mark.parametrize(
    "overrides",
    [
        {"qk_norm": "rms_norm"},
        {"qk_norm": "layer_norm", "qk_norm_learnable_scale": False, "position_embedding_type": "rotary"},
        {"attn_logit_softcapping": 5.0, "final_logit_softcapping": 3.0},
        {"hidden_act": "relu2", "gated_mlp": True},
    ],
    ids=["qk_norm", "qk_norm-rotary", "softcapping", "relu2-gated"],
)
@pytest.mark.parametrize("family", ["decoder-tiny", "encoder-tiny", "encoder-decoder-tiny"])
def test_elementwise_modifications_add_no_counted_flops(family, overrides):
    """QK-norm, soft-capping and squared ReLU add elementwise work only: the count and FlopCounterMode are unchanged."""
    config = build_config(family, {**SMALL, **overrides})
    lengths = (T, DECODER_T) if config.is_encoder_decoder else (T,)
    baseline = build_config(family, {**SMALL, "gated_mlp": overrides.get("gated_mlp", False)})  # GLU: one more matrix
    assert count_training_flops(config, *lengths).total == count_training_flops(baseline, *lengths).total
    assert measured_flops(config, *lengths) == count_training_flops(config, *lengths).total
