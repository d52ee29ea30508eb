"""`resize_token_embeddings` on every head of every family: tied, untied, factorized, shared embeddings."""

from __future__ import annotations

import pytest
import torch
from helpers.variant_checks import TINY

from hfzoo import (
    HfzooDecoderConfig,
    HfzooDecoderForCausalLM,
    HfzooDecoderForSequenceClassification,
    HfzooDecoderModel,
    HfzooEncoderConfig,
    HfzooEncoderDecoderConfig,
    HfzooEncoderDecoderForConditionalGeneration,
    HfzooEncoderDecoderForSequenceClassification,
    HfzooEncoderForMaskedLM,
    HfzooEncoderForSequenceClassification,
    HfzooEncoderForTokenClassification,
)
from hfzoo.modules.embeddings import TokenEmbedding

ADDED = 10
NEW_VOCAB = TINY["vocab_size"] + ADDED

CASES = [
    (HfzooDecoderForCausalLM, HfzooDecoderConfig, {}),
    (HfzooDecoderForCausalLM, HfzooDecoderConfig, {"tie_word_embeddings": False}),
    (HfzooDecoderForCausalLM, HfzooDecoderConfig, {"embedding_size": 16}),
    (HfzooDecoderForCausalLM, HfzooDecoderConfig, {"num_softmaxes": 2}),
    (HfzooDecoderForSequenceClassification, HfzooDecoderConfig, {"num_labels": 3}),
    (HfzooDecoderModel, HfzooDecoderConfig, {}),
    (HfzooEncoderForMaskedLM, HfzooEncoderConfig, {}),
    (HfzooEncoderForMaskedLM, HfzooEncoderConfig, {"tie_word_embeddings": False, "embedding_size": 16}),
    (HfzooEncoderForSequenceClassification, HfzooEncoderConfig, {"num_labels": 3}),
    (HfzooEncoderForTokenClassification, HfzooEncoderConfig, {"num_labels": 5}),
    (HfzooEncoderDecoderForConditionalGeneration, HfzooEncoderDecoderConfig, {}),
    (HfzooEncoderDecoderForConditionalGeneration, HfzooEncoderDecoderConfig, {"tie_word_embeddings": False}),
    (
        HfzooEncoderDecoderForConditionalGeneration,
        HfzooEncoderDecoderConfig,
        {"tie_word_embeddings": False, "tie_encoder_decoder_embeddings": False},
    ),
    (HfzooEncoderDecoderForSequenceClassification, HfzooEncoderDecoderConfig, {"num_labels": 3}),
]


def _vocab_params(model) -> dict[str, torch.Tensor]:
    """Every parameter with a vocabulary dimension, by name (tied ones listed once by transformers)."""
    return {
        name: param
        for name, param in model.named_parameters(remove_duplicate=False)
        if param.shape[0] == model.config.vocab_size and name.endswith(("weight", "bias"))
    }


def _inputs(model, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    ids = torch.randint(2, vocab, (2, 9), generator=g)
    ids[:, -3:] = torch.arange(vocab - 3, vocab)  # the newest tokens
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if isinstance(model, HfzooEncoderDecoderForConditionalGeneration):
        batch["labels"] = torch.randint(2, vocab, (2, 5), generator=g)
        batch["labels"][:, 0] = vocab - 1
    elif isinstance(model, HfzooEncoderDecoderForSequenceClassification):
        batch["input_ids"][:, -1] = model.config.eos_token_id  # pooled at the last EOS
        batch["labels"] = torch.tensor([0, 2])
    elif isinstance(model, HfzooEncoderForTokenClassification):
        batch["labels"] = torch.randint(0, model.config.num_labels, ids.shape, generator=g)
    elif model.config.num_labels and "SequenceClassification" in type(model).__name__:
        batch["labels"] = torch.tensor([0, 2])
    elif not isinstance(model, HfzooDecoderModel):
        batch["labels"] = ids.clone()
    return batch


def _outputs(model, batch) -> torch.Tensor:
    out = model(**batch)
    return out.logits if "logits" in out else out.last_hidden_state


@pytest.mark.parametrize(
    "model_class, config_class, overrides",
    CASES,
    ids=[f"{c[0].__name__}-{'-'.join(f'{k}={v}' for k, v in c[2].items()) or 'default'}" for c in CASES],
)
def test_resize_train_save_reload(tmp_path, model_class, config_class, overrides):
    torch.manual_seed(0)
    model = model_class(config_class(**{**TINY, **overrides}))
    tied_before = model.get_output_embeddings() is not None and model.config.tie_word_embeddings
    old = {name: param.detach().clone() for name, param in _vocab_params(model).items()}
    assert old, "the model has no vocabulary matrix"

    returned = model.resize_token_embeddings(NEW_VOCAB)

    assert returned is model.get_input_embeddings() and isinstance(returned, TokenEmbedding)
    assert model.config.vocab_size == NEW_VOCAB
    resized = _vocab_params(model)
    assert resized.keys() == old.keys()  # every vocabulary matrix was resized (none left at the old size)
    for name, param in resized.items():
        assert param.shape[0] == NEW_VOCAB, name
        torch.testing.assert_close(param[: TINY["vocab_size"]], old[name], rtol=0, atol=0, msg=name)
        assert torch.isfinite(param[TINY["vocab_size"] :]).all(), name
    output = model.get_output_embeddings()
    if tied_before:
        assert output.weight is model.get_input_embeddings().weight
    elif output is not None:
        assert output.weight is not model.get_input_embeddings().weight
        assert output.out_features == NEW_VOCAB
    if isinstance(model, HfzooEncoderDecoderForConditionalGeneration):
        shared = model.config.tie_encoder_decoder_embeddings
        embeddings = (model.model.encoder.embed_tokens, model.model.decoder.embed_tokens)
        assert (embeddings[0].weight is embeddings[1].weight) is shared
        assert all(e.num_embeddings == NEW_VOCAB for e in embeddings)

    # train one step on the new tokens: their rows get gradients and change
    batch = _inputs(model)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    out = model(**batch)
    loss = out.loss if "loss" in out else out.last_hidden_state.square().mean()
    loss.backward()
    new_rows = model.get_input_embeddings().weight.grad[TINY["vocab_size"] :]
    assert new_rows.abs().sum() > 0
    optimizer.step()

    model.eval()
    with torch.no_grad():
        expected = _outputs(model, batch)
    model.save_pretrained(tmp_path)
    reloaded = model_class.from_pretrained(tmp_path).eval()
    assert reloaded.config.vocab_size == NEW_VOCAB
    with torch.no_grad():
        torch.testing.assert_close(_outputs(reloaded, batch), expected, rtol=0, atol=0)
    if tied_before:
        assert reloaded.get_output_embeddings().weight is reloaded.get_input_embeddings().weight
    for name, param in _vocab_params(reloaded).items():
        torch.testing.assert_close(param, dict(model.named_parameters(remove_duplicate=False))[name], msg=name)


def test_pad_to_multiple_of_and_mean_resizing():
    torch.manual_seed(0)
    model = HfzooDecoderForCausalLM(HfzooDecoderConfig(**{**TINY, "tie_word_embeddings": False}))
    model.resize_token_embeddings(NEW_VOCAB, pad_to_multiple_of=16)
    assert model.config.vocab_size == 112 and model.lm_head.weight.shape == (112, TINY["hidden_size"])
    # mean resizing (transformers' default): new input rows are drawn around the old rows' mean
    weight = model.get_input_embeddings().weight.detach()
    old_mean = weight[: TINY["vocab_size"]].mean(0)
    new_mean = weight[TINY["vocab_size"] :].mean(0)
    assert (new_mean - old_mean).norm() < 0.5 * (weight[: TINY["vocab_size"]] - old_mean).norm(dim=1).mean()


def test_shrinking_keeps_the_first_rows():
    torch.manual_seed(0)
    model = HfzooEncoderForMaskedLM(HfzooEncoderConfig(**TINY))
    before = model.lm_head.decoder.bias.detach().clone()
    model.resize_token_embeddings(50)
    assert model.lm_head.decoder.weight is model.model.embed_tokens.weight
    torch.testing.assert_close(model.lm_head.decoder.bias, before[:50])
    assert model(input_ids=torch.tensor([[2, 49]])).logits.shape == (1, 2, 50)


def test_a_module_that_cannot_resize_refuses():
    class FixedClusters(TokenEmbedding):
        vocab_resize_refusal = "its vocabulary is split into frequency clusters of fixed sizes"

    model = HfzooDecoderForCausalLM(HfzooDecoderConfig(**TINY))
    model.model.embed_tokens = FixedClusters(model.config)
    with pytest.raises(ValueError, match=r"embed_tokens \(FixedClusters\) cannot change.*frequency clusters"):
        model.resize_token_embeddings(NEW_VOCAB)
    assert model.config.vocab_size == TINY["vocab_size"]
