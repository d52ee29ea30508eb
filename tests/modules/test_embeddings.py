"""Token embeddings, output heads and parameter sharing (`hfzoo/modules/embeddings.py`, block sharing in `stack.py`).

Numerics against written-out formulas (factorized + scaled embeddings, tied factorized head, mixture of
softmaxes), the encoder-decoder's three vocabulary matrices, ALBERT block sharing with save/load, the KV
cache and gradient checkpointing, and the config validation of these fields. The generic checks
(fp32/bf16, round trip, padding, causality, backends) are rows of `tests/models/test_variants.py`.
"""

from __future__ import annotations

import math

import pytest
import torch
from huggingface_hub.errors import StrictDataclassClassValidationError
from safetensors.torch import load_file

from hfzoo import (
    HfzooDecoderConfig,
    HfzooDecoderForCausalLM,
    HfzooEncoderConfig,
    HfzooEncoderDecoderConfig,
    HfzooEncoderDecoderForConditionalGeneration,
    HfzooEncoderForMaskedLM,
)
from hfzoo.compat import output_cache
from hfzoo.modules.embeddings import TokenEmbedding, VocabProjection

TINY = dict(
    vocab_size=97,
    hidden_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
    pad_token_id=0,
)


def decoder(seed: int = 0, **overrides) -> HfzooDecoderForCausalLM:
    torch.manual_seed(seed)
    return HfzooDecoderForCausalLM(HfzooDecoderConfig(**{**TINY, **overrides})).eval()


def encoder_decoder(seed: int = 0, **overrides) -> HfzooEncoderDecoderForConditionalGeneration:
    torch.manual_seed(seed)
    config = HfzooEncoderDecoderConfig(**{**TINY, "num_decoder_layers": 2, **overrides})
    return HfzooEncoderDecoderForConditionalGeneration(config).eval()


def unique_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() yields each tied tensor once


# ---- numerics


def test_factorized_scaled_embedding_is_rows_times_projection_times_sqrt_width():
    config = HfzooDecoderConfig(**TINY, embedding_size=8, scale_embeddings=True)
    torch.manual_seed(0)
    embedding = TokenEmbedding(config)
    torch.nn.init.normal_(embedding.weight)
    torch.nn.init.normal_(embedding.embed_proj.weight)
    ids = torch.tensor([[3, 5, 96], [0, 1, 2]])
    expected = embedding.weight[ids] @ embedding.embed_proj.weight.T * math.sqrt(32)  # (2, 3, 8) @ (8, 32)
    assert embedding.weight.shape == (97, 8) and embedding.embed_proj.weight.shape == (32, 8)
    torch.testing.assert_close(embedding(ids), expected)


def test_tied_factorized_head_uses_both_input_factors_transposed():
    model = decoder(embedding_size=8)
    embed = model.model.embed_tokens
    assert model.lm_head.weight is embed.weight and model.lm_head.embed_proj.weight is embed.embed_proj.weight
    hidden = torch.randn(2, 5, 32)
    expected = hidden @ embed.embed_proj.weight @ embed.weight.T  # (2, 5, 32) @ (32, 8) @ (8, 97)
    torch.testing.assert_close(model.lm_head(hidden), expected)


def test_untied_head_of_factorized_model_is_a_full_matrix():
    """As Mesh TensorFlow: only a tied head shares the factorization (Narang et al.'s 227M row)."""
    model = decoder(embedding_size=8, tie_word_embeddings=False)
    assert model.lm_head.weight.shape == (97, 32) and model.lm_head.embed_proj is None
    assert unique_parameters(model) - unique_parameters(decoder(embedding_size=8)) == 97 * 32


def mixture_of_softmaxes_reference(head: VocabProjection, hidden: torch.Tensor) -> torch.Tensor:
    """Yang et al. 2018, §3, written out one component at a time: log sum_k pi_k softmax(h_k W^T)."""
    k_count, width = head.num_softmaxes, hidden.shape[-1]
    prior = torch.softmax(hidden @ head.mos_prior.weight.T, dim=-1)  # (..., K)
    latent = torch.tanh(hidden @ head.mos_latent.weight.T + head.mos_latent.bias)  # (..., K * width)
    probs = 0
    for k in range(k_count):
        context = latent[..., k * width : (k + 1) * width]
        probs = probs + prior[..., k : k + 1] * torch.softmax(context @ head.weight.T, dim=-1)
    return probs.log()


@pytest.mark.parametrize("family", ["decoder", "encoder", "encoder-decoder"])
def test_mixture_of_softmaxes_matches_written_out_formula_in_every_family(family):
    overrides = dict(TINY, num_softmaxes=3)
    torch.manual_seed(0)
    if family == "decoder":
        model = HfzooDecoderForCausalLM(HfzooDecoderConfig(**overrides))
        head = model.lm_head
    elif family == "encoder":
        model = HfzooEncoderForMaskedLM(HfzooEncoderConfig(**overrides))
        head = model.lm_head.decoder
    else:
        model = HfzooEncoderDecoderForConditionalGeneration(HfzooEncoderDecoderConfig(**overrides))
        head = model.lm_head
    hidden = torch.randn(2, 4, 32)
    log_probs = head(hidden)
    torch.testing.assert_close(log_probs, mixture_of_softmaxes_reference(head, hidden), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(2, 4))  # a distribution, not logits


def test_mixture_of_softmaxes_loss_is_negative_log_likelihood_of_the_mixture():
    model = decoder(num_softmaxes=4)
    ids = torch.randint(2, 97, (2, 9))
    out = model(ids, labels=ids)
    nll = -out.logits[:, :-1].gather(-1, ids[:, 1:, None]).mean()
    torch.testing.assert_close(out.loss, nll)


# ---- the encoder-decoder's three vocabulary matrices


@pytest.mark.parametrize(
    "tie_encoder_decoder, tie_output, matrices",
    [(True, True, 1), (True, False, 2), (False, True, 2), (False, False, 3)],
)
def test_encoder_decoder_vocab_matrices_tie_as_configured_and_save_once(
    tie_encoder_decoder, tie_output, matrices, tmp_path
):
    model = encoder_decoder(tie_encoder_decoder_embeddings=tie_encoder_decoder, tie_word_embeddings=tie_output)
    enc, dec, out = (
        model.model.encoder.embed_tokens.weight,
        model.model.decoder.embed_tokens.weight,
        model.lm_head.weight,
    )
    assert (enc is dec) == tie_encoder_decoder and (out is dec) == tie_output
    assert len({id(enc), id(dec), id(out)}) == matrices
    base = unique_parameters(encoder_decoder())
    assert unique_parameters(model) - base == (matrices - 1) * 97 * 32
    model.save_pretrained(tmp_path)
    saved = [k for k, v in load_file(tmp_path / "model.safetensors").items() if v.shape == (97, 32)]
    assert len(saved) == matrices, saved
    loaded = HfzooEncoderDecoderForConditionalGeneration.from_pretrained(tmp_path)
    for name, param in model.named_parameters():
        torch.testing.assert_close(loaded.get_parameter(name), param, rtol=0, atol=0)
    assert (loaded.model.decoder.embed_tokens.weight is loaded.lm_head.weight) == tie_output


# ---- block sharing


def test_block_sharing_ties_every_layer_to_layer_zero_and_saves_it_once(tmp_path):
    model = decoder(block_sharing="all")
    layers = model.model.layers
    per_layer = sum(p.numel() for p in layers[0].parameters())
    assert unique_parameters(decoder()) - unique_parameters(model) == (len(layers) - 1) * per_layer
    for layer in layers[1:]:
        assert layer.self_attn.q_proj.weight is layers[0].self_attn.q_proj.weight
        assert layer.mlp.down_proj.bias is layers[0].mlp.down_proj.bias
    model.save_pretrained(tmp_path)
    keys = load_file(tmp_path / "model.safetensors").keys()
    assert any(k.startswith("model.layers.0.") for k in keys)
    assert not any(k.startswith(("model.layers.1.", "model.layers.2.")) for k in keys)
    loaded = HfzooDecoderForCausalLM.from_pretrained(tmp_path)
    assert loaded.model.layers[2].mlp.up_proj.weight is loaded.model.layers[0].mlp.up_proj.weight


@pytest.mark.parametrize(
    "sharing, encoder_shared, decoder_shared", [("encoder", True, False), ("decoder", False, True)]
)
def test_one_stack_block_sharing_in_the_encoder_decoder(sharing, encoder_shared, decoder_shared):
    model = encoder_decoder(block_sharing=sharing)
    for stack, shared in ((model.model.encoder, encoder_shared), (model.model.decoder, decoder_shared)):
        assert (stack.layers[1].self_attn.o_proj.weight is stack.layers[0].self_attn.o_proj.weight) == shared


def test_block_shared_decoder_keeps_one_cache_layer_per_application():
    model = decoder(seed=3, block_sharing="all")
    prompt = torch.randint(2, 97, (2, 5))
    out = model(prompt, use_cache=True)
    assert len(output_cache(out).layers) == TINY["num_hidden_layers"]
    kwargs = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0)
    assert torch.equal(
        model.generate(prompt, use_cache=True, **kwargs), model.generate(prompt, use_cache=False, **kwargs)
    )


def test_block_shared_encoder_decoder_generates_the_same_with_and_without_cache():
    model = encoder_decoder(seed=4, block_sharing="all")
    source = torch.randint(2, 97, (2, 7))
    # No token twice (at init greedy decoding repeats the start token), and the logits of every step compared.
    kwargs = dict(max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0, decoder_start_token_id=0)
    kwargs.update(no_repeat_ngram_size=1, output_logits=True, return_dict_in_generate=True)
    cached = model.generate(source, use_cache=True, **kwargs)
    uncached = model.generate(source, use_cache=False, **kwargs)
    assert torch.equal(cached.sequences, uncached.sequences)
    torch.testing.assert_close(torch.stack(cached.logits), torch.stack(uncached.logits), rtol=1e-4, atol=1e-5)


def test_block_sharing_with_gradient_checkpointing_gives_the_same_gradients():
    ids = torch.randint(2, 97, (2, 10))
    grads = []
    for checkpointing in (False, True):
        model = decoder(seed=7, block_sharing="all").train()
        if checkpointing:
            model.activation_checkpointing_enable()
        model(ids, labels=ids).loss.backward()
        grads.append(model.model.layers[0].mlp.up_proj.weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])
    # The shared tensor's gradient sums over its three applications: not the gradient of one layer alone.
    unshared = decoder(seed=7).train()
    unshared(ids, labels=ids).loss.backward()
    assert not torch.allclose(grads[0], unshared.model.layers[0].mlp.up_proj.weight.grad)


# ---- config validation


@pytest.mark.parametrize(
    "config_class, overrides, message",
    [
        (
            HfzooDecoderConfig,
            {"block_sharing": "encoder"},
            r"block_sharing='encoder' is not supported by hfzoo_decoder",
        ),
        (
            HfzooEncoderConfig,
            {"block_sharing": "decoder"},
            r"block_sharing='decoder' is not supported by hfzoo_encoder",
        ),
        (HfzooEncoderDecoderConfig, {"block_sharing": "layers"}, r"block_sharing='layers'.*'encoder', 'decoder'"),
        (HfzooDecoderConfig, {"num_softmaxes": 0}, "num_softmaxes must be a positive integer, got 0"),
        (HfzooDecoderConfig, {"embedding_size": 0}, "embedding_size must be None or a positive integer, got 0"),
        (
            HfzooEncoderDecoderConfig,
            {"block_sharing": "all", "num_experts": 4, "moe_layer_interval": 2},
            r"block_sharing='all'.*moe_layer_interval=2",
        ),
    ],
)
def test_invalid_embedding_and_sharing_settings_are_refused(config_class, overrides, message):
    with pytest.raises(StrictDataclassClassValidationError, match=message):
        config_class(**TINY, **overrides)


def test_block_sharing_refuses_a_relative_bias_per_layer():
    overrides = {"position_embedding_type": "relative_attention_bias", "share_relative_attention_bias": False}
    with pytest.raises(StrictDataclassClassValidationError, match="block_sharing='all'.*share_relative_attention_bias"):
        HfzooEncoderDecoderConfig(**TINY, block_sharing="all", **overrides)
    assert HfzooEncoderDecoderConfig(**TINY, **overrides).block_sharing == "none"


def test_experts_on_every_layer_may_share_blocks():
    config = HfzooDecoderConfig(**TINY, block_sharing="all", num_experts=4, moe_layer_interval=1)
    assert config.block_sharing == "all"
