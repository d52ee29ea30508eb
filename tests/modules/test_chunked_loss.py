"""Chunked cross-entropy of the language-model heads: parity with plain cross-entropy, and no whole logits."""

from __future__ import annotations

import pytest
import torch
from helpers.variant_checks import TINY
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from hfzoo import (
    HfzooDecoderConfig,
    HfzooDecoderForCausalLM,
    HfzooEncoderConfig,
    HfzooEncoderDecoderConfig,
    HfzooEncoderDecoderForConditionalGeneration,
    HfzooEncoderForMaskedLM,
)
from hfzoo.modeling_utils import HfzooPreTrainedModel
from hfzoo.modules import embeddings
from hfzoo.modules.embeddings import VocabProjection, chunked_linear_cross_entropy


def _problem(tokens=37, features=24, vocab=301, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, features, generator=g, dtype=dtype).requires_grad_()
    weight = (torch.randn(vocab, features, generator=g, dtype=dtype) * 0.3).requires_grad_()
    bias = torch.randn(vocab, generator=g, dtype=dtype).requires_grad_()
    labels = torch.randint(0, vocab, (tokens,), generator=g)
    labels[::4] = -100
    return hidden, weight, bias, labels


def _grads(loss, *tensors):
    return torch.autograd.grad(loss, tensors)


@pytest.mark.parametrize("vocab_multiple", [None, 64])  # 301 scores; 320, 19 of them padding (as on a GPU)
@pytest.mark.parametrize("chunk_size", [None, 1, 5, 64])
@pytest.mark.parametrize("with_bias", [True, False])
def test_loss_and_gradients_equal_plain_cross_entropy(chunk_size, with_bias, vocab_multiple):
    hidden, weight, bias, labels = _problem()
    bias = bias if with_bias else None
    inputs = (hidden, weight) + ((bias,) if with_bias else ())
    reference = nn.functional.cross_entropy(nn.functional.linear(hidden, weight, bias), labels, reduction="sum")
    chunked = chunked_linear_cross_entropy(
        hidden, weight, labels, bias, chunk_size=chunk_size, vocab_multiple=vocab_multiple
    )
    assert chunked.dtype == torch.float32
    torch.testing.assert_close(chunked, reference, rtol=1e-6, atol=1e-5)
    # a non-unit upstream gradient (a mean, a loss weight) scales every gradient
    for got, want in zip(_grads(chunked * 0.37, *inputs), _grads(reference * 0.37, *inputs)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("vocab_multiple", [1, 64])
@pytest.mark.parametrize("softcap", [None, 2.0])
def test_compiled_chunk_function_gives_the_eager_loss_and_gradients(softcap, vocab_multiple):
    """`VocabProjection.compile_loss`'s compiled `linear_cross_entropy_chunk` (a shorter last chunk included)
    equals the eager function: loss and every gradient, with ignored labels, a soft cap and a padded vocabulary;
    and both equal the unpadded eager loss."""
    hidden, weight, bias, labels = _problem()
    compiled = torch.compile(embeddings.linear_cross_entropy_chunk, backend="inductor")
    for chunk_fn in (None, compiled):  # 37 tokens in chunks of 16: two of 16, one of 5
        loss = chunked_linear_cross_entropy(hidden, weight, labels, bias, chunk_size=16, softcap=softcap,
                                            chunk_fn=chunk_fn, vocab_multiple=vocab_multiple)  # fmt: skip
        results = (loss, *_grads(loss * 0.37, hidden, weight, bias))
        if chunk_fn is None:
            eager = results
    for got, want in zip(results, eager):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    unpadded = chunked_linear_cross_entropy(hidden, weight, labels, bias, chunk_size=16, softcap=softcap)
    for got, want in zip(results, (unpadded, *_grads(unpadded * 0.37, hidden, weight, bias))):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    head = VocabProjection(HfzooDecoderConfig(**TINY), bias=False, tied=False)
    assert head.chunk_fn is None and head.compile_loss(backend="eager") and head.chunk_fn is not None


@pytest.mark.parametrize("vocab_multiple", [1, 64])  # 500 scores; 512
@pytest.mark.parametrize("compiled", [False, True])  # the eager in-place gradient; the compiled fused one
@pytest.mark.parametrize("chunk_size", [16, None])  # four chunks; one
def test_bf16_autocast_matches_linear_under_autocast(chunk_size, compiled, vocab_multiple):
    hidden, weight, bias, labels = _problem(tokens=64, vocab=500)
    chunk_fn = torch.compile(embeddings.linear_cross_entropy_chunk, backend="inductor") if compiled else None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = nn.functional.linear(hidden, weight, bias)  # bf16, as nn.Linear under autocast
        chunked = chunked_linear_cross_entropy(
            hidden, weight, labels, bias, chunk_size=chunk_size, chunk_fn=chunk_fn, vocab_multiple=vocab_multiple
        )
    reference = nn.functional.cross_entropy(logits.float(), labels, reduction="sum")
    assert chunked.dtype == torch.float32
    torch.testing.assert_close(chunked, reference, rtol=1e-2, atol=0)
    got, want = _grads(chunked, hidden, weight, bias), _grads(reference, hidden, weight, bias)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype == torch.float32
        assert (g - w).norm() < 2e-2 * w.norm()


def test_edge_cases():
    hidden, weight, bias, labels = _problem()
    # every label ignored: zero loss, zero gradients
    loss = chunked_linear_cross_entropy(hidden, weight, torch.full_like(labels, -100), bias)
    assert loss.item() == 0.0
    assert all(g.abs().sum() == 0 for g in _grads(loss, hidden, weight, bias))
    # no tokens at all: zero loss, and zero gradients rather than none
    empty = hidden[:0].detach().requires_grad_()
    loss = chunked_linear_cross_entropy(empty, weight, labels[:0], bias)
    assert loss.item() == 0.0
    grads = _grads(loss, empty, weight, bias)
    assert grads[0].shape == empty.shape and all(g.abs().sum() == 0 for g in grads)
    # without grad mode: the same loss, nothing to hand over
    with torch.no_grad():
        no_grad = chunked_linear_cross_entropy(hidden, weight, labels, bias)
    torch.testing.assert_close(no_grad, chunked_linear_cross_entropy(hidden, weight, labels, bias))
    # gradients are handed over once: a second backward through the same graph is refused
    loss = chunked_linear_cross_entropy(hidden, weight, labels, bias)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="second one"):
        loss.backward()


def test_mixture_of_softmaxes_chunked_equals_full():
    torch.manual_seed(0)
    config = HfzooDecoderConfig(**{**TINY, "num_softmaxes": 3})
    head = VocabProjection(config, bias=False, tied=False)
    hidden = torch.randn(2, 9, TINY["hidden_size"], requires_grad=True)
    labels = torch.randint(0, TINY["vocab_size"], (2, 9))
    labels[0, :3] = -100
    full = nn.functional.nll_loss(head(hidden).flatten(0, 1).float(), labels.flatten(), reduction="sum")
    chunked = head(hidden, labels=labels)
    torch.testing.assert_close(chunked, full, rtol=1e-5, atol=1e-5)
    params = (hidden, *head.parameters())
    for got, want in zip(_grads(chunked, *params), _grads(full, *params)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


class _LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an operation returns."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if torch.is_tensor(tensor):
                self.largest = max(self.largest, tensor.numel())
        return out


def test_vocabulary_is_padded_by_request_or_on_an_accelerator_only(monkeypatch):
    padded = []
    zero_padded = embeddings._zero_padded
    monkeypatch.setattr(
        embeddings, "_zero_padded", lambda t, rows, dtype: padded.append(rows) or zero_padded(t, rows, dtype)
    )
    hidden, weight, bias, labels = _problem()
    chunked_linear_cross_entropy(hidden, weight, labels, bias)  # the CPU's default: no padding
    assert padded == []
    chunked_linear_cross_entropy(hidden, weight, labels, bias, vocab_multiple=64)
    assert padded == [320, 320]  # the weight's rows and the bias
    chunked_linear_cross_entropy(hidden, weight, labels, None, vocab_multiple=7)  # 301 = 7 x 43: nothing to pad
    assert padded == [320, 320]
    with pytest.raises(ValueError, match="vocab_multiple must be >= 1, got 0"):
        chunked_linear_cross_entropy(hidden, weight, labels, bias, vocab_multiple=0)


def test_default_chunk_is_sized_by_the_device(monkeypatch):
    # GPT-2's vocabulary: 128 tokens of float32 scores in the CPU's 32 MiB, 4,096 in a GPU's 1 GiB (fewer
    # float32 additions of the whole weight gradient, larger matrix products)
    assert embeddings._chunk_tokens(50257, "cpu") == 128
    assert embeddings._chunk_tokens(50257, "cuda") == 4096
    assert embeddings._chunk_tokens(8192, "cuda") == 32768
    seen = []
    chunk_tokens = embeddings._chunk_tokens
    monkeypatch.setattr(embeddings, "_chunk_tokens", lambda *a: seen.append(a) or chunk_tokens(*a))
    hidden, weight, bias, labels = _problem()
    chunked_linear_cross_entropy(hidden, weight, labels, bias)
    assert seen == [(weight.shape[0], "cpu")]  # the default chunk follows the inputs' device


def test_training_step_never_holds_whole_logits(monkeypatch):
    monkeypatch.setattr(embeddings, "LOSS_CHUNK_BYTES", 2**20)  # 64 tokens of this vocabulary per chunk
    config = HfzooDecoderConfig(**{**TINY, "vocab_size": 4096, "max_position_embeddings": 512})
    model = HfzooDecoderForCausalLM(config).train()
    ids = torch.randint(0, config.vocab_size, (2, 512))
    whole = ids.numel() * config.vocab_size  # 4.2M scores
    with _LargestTensor() as chunked:
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
    assert out.logits is None
    assert chunked.largest < whole / 4, chunked.largest
    with _LargestTensor() as plain:
        model(input_ids=ids, labels=ids, skip_logits=False).loss.backward()
    assert plain.largest >= whole  # the check sees whole logits where they exist


LM_HEADS = [
    (HfzooDecoderForCausalLM, HfzooDecoderConfig, {}),
    (HfzooDecoderForCausalLM, HfzooDecoderConfig, {"embedding_size": 16, "scale_lm_head_input": True}),
    (HfzooEncoderForMaskedLM, HfzooEncoderConfig, {}),
    (HfzooEncoderDecoderForConditionalGeneration, HfzooEncoderDecoderConfig, {"tie_word_embeddings": False}),
]


@pytest.mark.parametrize("model_class, config_class, overrides", LM_HEADS)
def test_heads_chunked_loss_equals_loss_from_logits(model_class, config_class, overrides):
    torch.manual_seed(0)
    model = model_class(config_class(**{**TINY, **overrides})).train()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(2, TINY["vocab_size"], (3, 11), generator=g)
    # non-contiguous labels, as collators that slice them give
    seq2seq = model_class is HfzooEncoderDecoderForConditionalGeneration
    labels = ids.clone()[:, :6] if seq2seq else ids.clone().t().contiguous().t()
    assert not labels.is_contiguous()
    labels[1, 4:] = -100
    batch = {"input_ids": ids, "labels": labels}
    results = []
    for skip_logits in (None, False):
        model.zero_grad()
        out = model(**batch, skip_logits=skip_logits)
        out.loss.backward()
        results.append((out, {n: p.grad.clone() for n, p in model.named_parameters()}))
    (chunked, chunked_grads), (full, full_grads) = results
    assert chunked.logits is None and full.logits is not None
    torch.testing.assert_close(chunked.loss, full.loss, rtol=1e-5, atol=1e-6)
    for name, grad in full_grads.items():
        torch.testing.assert_close(chunked_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    # Trainer's `num_items_in_batch`: the summed loss over the accumulated batch's count, both paths
    for skip_logits in (None, False):
        with torch.no_grad():
            normalized = model(**batch, skip_logits=skip_logits, num_items_in_batch=torch.tensor(100)).loss
        shifted = labels[:, 1:] if model_class is HfzooDecoderForCausalLM else labels
        count = shifted.ne(-100).sum()
        torch.testing.assert_close(normalized, full.loss.detach() * count / 100, rtol=1e-5, atol=1e-6)
    # eval mode, and no labels: logits as usual; asking to skip them without labels is refused
    assert model.eval()(**batch).logits is not None
    with pytest.raises(ValueError, match="skip_logits=True needs labels"):
        extra = {"decoder_input_ids": ids[:, :6]} if model_class is HfzooEncoderDecoderForConditionalGeneration else {}
        model(input_ids=ids, skip_logits=True, **extra)


ONE_PER_LM_HEAD = [LM_HEADS[0], LM_HEADS[2], LM_HEADS[3]]  # decoder causal LM, encoder masked LM, encoder-decoder


def _aligned_logits_and_targets(model, ids, labels):
    """Each head's full logits (eval, no labels) and the targets its positions predict, computed here."""
    with torch.no_grad():
        if isinstance(model, HfzooEncoderDecoderForConditionalGeneration):
            decoder_ids = model.prepare_decoder_input_ids_from_labels(labels)
            logits = model.eval()(input_ids=ids, decoder_input_ids=decoder_ids).logits
            return logits, labels  # position t predicts label t
        logits = model.eval()(input_ids=ids).logits
    if isinstance(model, HfzooDecoderForCausalLM):  # position t predicts label t + 1
        return logits, nn.functional.pad(labels, (0, 1), value=-100)[:, 1:]
    return logits, labels


@pytest.mark.parametrize("model_class, config_class, overrides", ONE_PER_LM_HEAD)
def test_lm_heads_share_one_loss_equal_to_direct_cross_entropy(model_class, config_class, overrides, monkeypatch):
    torch.manual_seed(0)
    model = model_class(config_class(**{**TINY, **overrides}))
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(2, TINY["vocab_size"], (3, 11), generator=g)
    labels = ids.clone()[:, :6] if model_class is HfzooEncoderDecoderForConditionalGeneration else ids.clone()
    labels[0, 1::2] = -100
    labels[2, :3] = -100
    logits, targets = _aligned_logits_and_targets(model, ids, labels)
    summed = nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), reduction="sum")
    count = targets.ne(-100).sum()
    monkeypatch.setattr(embeddings, "LOSS_CHUNK_BYTES", 4 * TINY["vocab_size"] * 4)  # chunks of 4 tokens
    model.train()
    for skip_logits in (True, False):  # chunked summed loss from the hidden states; loss from the logits
        for num_items, denominator in ((None, count), (40, 40), (torch.tensor(57), 57)):
            with torch.no_grad():
                out = model(input_ids=ids, labels=labels, skip_logits=skip_logits, num_items_in_batch=num_items)
            assert (out.logits is None) is skip_logits
            assert out.loss.dtype == torch.float32
            torch.testing.assert_close(out.loss, summed / denominator, rtol=1e-5, atol=1e-6)

    # every LM head computes its loss through the one helper of the shared base class
    class Routed(Exception):
        pass

    def refuse(*args, **kwargs):
        raise Routed

    monkeypatch.setattr(HfzooPreTrainedModel, "_lm_loss", refuse)
    for skip_logits in (True, False):
        with pytest.raises(Routed):
            model(input_ids=ids, labels=labels, skip_logits=skip_logits)
