"""Transparent attention (Bapna et al. 2018): `hfzoo/modules/attention.py:TransparentAttention` in the stack.

Each decoder cross-attention must read `sum_i softmax(W_j)_i h_i` over the encoder's embedding output, its
layer outputs and its final output (checked against the encoder's `hidden_states`, which transformers
records at the same points); with all weight on the last output the model is the plain encoder-decoder;
generation (beam search included) and the refusals outside the encoder-decoder. The generic checks are rows
of `tests/models/test_variants.py`.
"""

from __future__ import annotations

import pytest
import torch
from huggingface_hub.errors import StrictDataclassClassValidationError

from hfzoo import (
    HfzooDecoderConfig,
    HfzooEncoderConfig,
    HfzooEncoderDecoderConfig,
    HfzooEncoderDecoderForConditionalGeneration,
)

TINY = dict(
    vocab_size=97,
    hidden_size=32,
    num_hidden_layers=3,
    num_decoder_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
    pad_token_id=0,
    eos_token_id=1,
)


def build(seed: int = 0, **overrides) -> HfzooEncoderDecoderForConditionalGeneration:
    torch.manual_seed(seed)
    config = HfzooEncoderDecoderConfig(**{**TINY, "transparent_attention": True, **overrides})
    return HfzooEncoderDecoderForConditionalGeneration(config).eval()


def batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(3)
    ids = torch.randint(2, 97, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    return ids, mask, torch.randint(2, 97, (2, 5))


def test_each_cross_attention_reads_its_softmax_weighted_sum_of_the_encoder_outputs():
    model = build()
    transparent = model.model.decoder.transparent_attention
    assert transparent.weight.shape == (2, 3 + 1)  # one vector per decoder layer over embeddings + 3 layers
    with torch.no_grad():
        transparent.weight.normal_()
    read = {}

    def record(index):
        def hook(module, args, kwargs):
            read[index] = kwargs["key_value_states"]

        return hook

    for i, layer in enumerate(model.model.decoder.layers):
        layer.cross_attn.register_forward_pre_hook(record(i), with_kwargs=True)
    ids, mask, decoder_ids = batch()
    with torch.no_grad():
        model(ids, attention_mask=mask, decoder_input_ids=decoder_ids)
        encoder = model.get_encoder()(ids, attention_mask=mask, output_hidden_states=True)
    outputs = torch.stack(encoder.hidden_states, dim=1)  # embeddings, layers 1-2, final norm(layer 3)
    torch.testing.assert_close(encoder.layer_outputs, outputs)
    weights = torch.softmax(transparent.weight, dim=-1)
    for j in range(2):
        expected = sum(weights[j, i] * encoder.hidden_states[i] for i in range(4))
        torch.testing.assert_close(read[j], expected)


def test_all_weight_on_the_last_encoder_output_is_the_plain_encoder_decoder():
    """Bapna et al.'s combination generalizes the Transformer: a one-hot s_j on h_N gives back the baseline."""
    model = build()
    plain = build(transparent_attention=False)
    state = {k: v for k, v in model.state_dict().items() if "transparent_attention" not in k}
    plain.load_state_dict(state)
    with torch.no_grad():
        model.model.decoder.transparent_attention.weight.copy_(torch.tensor([[-1e4, -1e4, -1e4, 0.0]] * 2))
    ids, mask, decoder_ids = batch()
    with torch.no_grad():
        ours = model(ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits
        reference = plain(ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits
    torch.testing.assert_close(ours, reference)


def test_weights_are_initialised_as_mesh_tensorflow_and_learn():
    model = build(num_hidden_layers=2, num_decoder_layers=24)  # 24 x 3 logits
    weight = model.model.decoder.transparent_attention.weight
    assert 0.8 * 3**-0.5 < weight.std().item() < 1.2 * 3**-0.5  # normal(0, (N + 1) ** -0.5)
    ids, mask, decoder_ids = batch()
    model(ids, attention_mask=mask, decoder_input_ids=decoder_ids, labels=decoder_ids).loss.backward()
    assert weight.grad is not None and weight.grad.abs().sum() > 0


@pytest.mark.compat
@pytest.mark.parametrize("num_beams", [1, 3])
def test_generation_is_the_same_with_and_without_the_cache(num_beams):
    """`generate` encodes once and expands `layer_outputs` (batch first) for beams."""
    model = build(seed=1)
    ids, mask, _ = batch()
    kwargs = dict(attention_mask=mask, max_new_tokens=4, min_new_tokens=4, do_sample=False, num_beams=num_beams)
    # No token twice (at init greedy decoding repeats the start token), and the logits of every step compared.
    kwargs.update(no_repeat_ngram_size=1, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        cached = model.generate(ids, use_cache=True, num_return_sequences=num_beams, **kwargs)
        uncached = model.generate(ids, use_cache=False, num_return_sequences=num_beams, **kwargs)
    assert cached.sequences.shape == (2 * num_beams, 5) and torch.equal(cached.sequences, uncached.sequences)
    torch.testing.assert_close(torch.stack(cached.logits), torch.stack(uncached.logits), rtol=1e-4, atol=1e-5)


def test_encoder_outputs_without_the_layer_outputs_are_refused():
    model = build()
    ids, mask, decoder_ids = batch()
    with pytest.raises(ValueError, match="transparent_attention=True: .* encoder_layer_outputs is required"):
        model(decoder_input_ids=decoder_ids, encoder_outputs=(torch.randn(2, 9, 32),))


def test_a_sublayer_pattern_gives_one_weight_vector_per_cross_attention():
    model = build(num_hidden_layers=2, num_decoder_layers=2, sublayer_pattern="ssff")  # layers s, sf, f
    assert model.model.decoder.transparent_attention.weight.shape == (2, 3 + 1)
    ids, mask, decoder_ids = batch()
    assert torch.isfinite(model(ids, attention_mask=mask, decoder_input_ids=decoder_ids).logits).all()


@pytest.mark.parametrize("config_class", [HfzooDecoderConfig, HfzooEncoderConfig])
def test_transparent_attention_is_refused_without_an_encoder_decoder(config_class):
    fields = {k: v for k, v in TINY.items() if k != "num_decoder_layers"}
    with pytest.raises(
        StrictDataclassClassValidationError,
        match=r"transparent_attention=True is defined for the encoder-decoder \(hfzoo_encoder_decoder\) only",
    ):
        config_class(**fields, transparent_attention=True)
    with pytest.raises(StrictDataclassClassValidationError, match="transparent_attention must be True or False"):
        HfzooEncoderDecoderConfig(**TINY, transparent_attention="yes")
