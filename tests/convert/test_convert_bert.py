"""BERT <-> hfzoo encoder conversion: output parity with padding, exact weight round trip, configs, real checkpoint."""

from __future__ import annotations

import logging

import pytest
import torch
from helpers.paths import minilm_dir
from transformers import (
    AutoModelForMaskedLM,
    AutoModelForQuestionAnswering,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    BertConfig,
    BertForMaskedLM,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
)

from hfzoo import (
    HfzooEncoderConfig,
    HfzooEncoderForMaskedLM,
    HfzooEncoderForQuestionAnswering,
    HfzooEncoderForSequenceClassification,
    HfzooEncoderForTokenClassification,
    HfzooEncoderModel,
)
from hfzoo.convert import (
    bert_config_from_hfzoo,
    bert_to_hfzoo,
    convert_bert_checkpoint,
    convert_checkpoint,
    hfzoo_config_from_bert,
    hfzoo_to_bert,
)
from hfzoo.models.presets import build_config

# Two tiny BERT sizes; dropout 0 so that train/eval make no difference.
SIZES = {
    "h32-l2-a4": dict(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64),
    "h48-l3-a6": dict(
        vocab_size=131, hidden_size=48, num_hidden_layers=3, num_attention_heads=6, intermediate_size=80,
        max_position_embeddings=40, type_vocab_size=3, hidden_act="gelu_new", layer_norm_eps=1e-6,
    ),
}  # fmt: skip
TOLERANCE = 1e-4
CLASSES = [(BertModel, HfzooEncoderModel), (BertForMaskedLM, HfzooEncoderForMaskedLM),
           (BertForSequenceClassification, HfzooEncoderForSequenceClassification),
           (BertForQuestionAnswering, HfzooEncoderForQuestionAnswering),
           (BertForTokenClassification, HfzooEncoderForTokenClassification)]  # fmt: skip


def random_bert(cls, size: str, seed: int = 0, **overrides):
    """A BERT whose every parameter is random at a scale where a renaming mistake changes the outputs.

    BERT's own init (std 0.02, unit/zero layer norms) makes attention nearly uniform and the norms
    interchangeable, which would hide e.g. a query/key or LayerNorm swap.
    """
    torch.manual_seed(seed)
    num_labels = 2 if cls is BertForQuestionAnswering else 3  # a span head: start and end
    config = BertConfig(
        **{**SIZES[size], "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "num_labels": num_labels}
        | overrides
    )
    model = cls(config, add_pooling_layer=False) if cls is BertModel else cls(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "LayerNorm" in name and name.endswith("weight"):
                param.copy_(1 + 0.3 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.copy_(0.3 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.25)
    model.set_attn_implementation("eager")
    return model.eval()


def padded_batch(config, seed: int = 1) -> dict[str, torch.Tensor]:
    """Right-padded `(4, 12)` batch: rows of 12, 9, 5 and 2 real tokens, two segments each."""
    generator = torch.Generator().manual_seed(seed)
    lengths, seq_len = [12, 9, 5, 2], 12
    ids = torch.randint(1, config.vocab_size, (len(lengths), seq_len), generator=generator)
    mask = torch.zeros_like(ids)
    types = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
        types[row, length // 2 : length] = config.type_vocab_size - 1
    return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask, "token_type_ids": types}


def outputs(model, batch) -> torch.Tensor:
    """The logits, the span head's `(batch, seq_len, 2)` start and end logits, or the last hidden states."""
    with torch.no_grad():
        out = model(**batch)
    if hasattr(out, "start_logits"):
        return torch.stack([out.start_logits, out.end_logits], dim=-1)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("classes", CLASSES, ids=lambda c: c[0].__name__)
def test_bert_to_hfzoo_outputs_match_with_padding(classes, size, backend):
    bert_class, hfzoo_class = classes
    bert = random_bert(bert_class, size)
    model = bert_to_hfzoo(bert, attn_implementation=backend)
    assert type(model) is hfzoo_class
    assert model.config._attn_implementation == backend
    batch = padded_batch(bert.config)
    expected, actual = outputs(bert, batch), outputs(model, batch)
    real = batch["attention_mask"].bool() if expected.dim() == 3 else slice(None)
    diff = (actual[real] - expected[real]).abs().max().item()
    print(f"\n{bert_class.__name__} {size} {backend}: max |diff| = {diff:.3e} (std {expected[real].std():.2f})")
    assert expected[real].std() > 0.3  # far from trivial
    assert diff <= TOLERANCE


def test_parity_check_is_sensitive_to_a_renaming_mistake():
    bert = random_bert(BertModel, "h32-l2-a4")
    model = bert_to_hfzoo(bert)
    layer = model.layers[1]
    with torch.no_grad():  # swap the two LayerNorms of one layer
        a, b = layer.self_attn_norm.weight.clone(), layer.mlp_norm.weight.clone()
        layer.self_attn_norm.weight.copy_(b)
        layer.mlp_norm.weight.copy_(a)
    batch = padded_batch(bert.config)
    assert (outputs(model, batch) - outputs(bert, batch)).abs().max() > 100 * TOLERANCE


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("classes", CLASSES, ids=lambda c: c[0].__name__)
def test_round_trip_gives_the_original_state_dict_exactly(classes, size):
    bert_class, _ = classes
    bert = random_bert(bert_class, size)
    original = bert.state_dict()
    back = hfzoo_to_bert(bert_to_hfzoo(bert))
    assert type(back) is bert_class
    state = back.state_dict()
    assert sorted(state) == sorted(original)
    for key, value in original.items():
        assert state[key].dtype == value.dtype and torch.equal(state[key], value), key
    # and a state dict converts like the model
    from_state = bert_to_hfzoo(original, bert.config, attn_implementation="eager")
    assert type(from_state) is classes[1]
    batch = padded_batch(bert.config)
    assert torch.equal(outputs(from_state, batch), outputs(bert_to_hfzoo(bert), batch))


def test_masked_lm_head_stays_tied_after_conversion():
    model = bert_to_hfzoo(random_bert(BertForMaskedLM, "h32-l2-a4"))
    assert model.lm_head.decoder.weight is model.model.embed_tokens.weight


@pytest.mark.parametrize("size", list(SIZES))
def test_config_round_trip(size):
    bert_config = BertConfig(**SIZES[size], classifier_dropout=0.2, pad_token_id=0)
    config = hfzoo_config_from_bert(bert_config)
    assert (config.norm_position, config.embedding_norm, config.position_embedding_type) == ("post", True, "learned")
    back = bert_config_from_hfzoo(config)
    for name in [*SIZES[size], "classifier_dropout", "pad_token_id", "hidden_act", "layer_norm_eps", "type_vocab_size"]:
        assert getattr(back, name) == getattr(bert_config, name), name


def test_bert_preset_is_bert_base():
    config = build_config("bert")
    assert isinstance(config, HfzooEncoderConfig)
    bert = bert_config_from_hfzoo(config)
    reference = BertConfig()  # transformers' defaults are BERT-base (uncased vocabulary)
    for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                 "hidden_act", "max_position_embeddings", "type_vocab_size", "layer_norm_eps", "pad_token_id"):  # fmt: skip
        assert getattr(bert, name) == getattr(reference, name), name


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (dict(norm_position="pre"), "norm_position"),
        (dict(embedding_norm=False), "embedding_norm"),
        (dict(attention_bias=False), "attention_bias"),
        (dict(type_vocab_size=0), "type_vocab_size"),
    ],
)
def test_bert_cannot_express_is_refused(change, match):
    config = hfzoo_config_from_bert(BertConfig(**SIZES["h32-l2-a4"]))
    fields = {**config.to_dict(), **change}
    for key in ("model_type", "transformers_version"):
        fields.pop(key, None)
    with pytest.raises(ValueError, match=match):
        bert_config_from_hfzoo(HfzooEncoderConfig(**fields))


def test_mismatched_state_dict_is_refused():
    bert = random_bert(BertForMaskedLM, "h32-l2-a4")
    state = dict(bert.state_dict())
    del state["bert.encoder.layer.1.output.dense.weight"]
    with pytest.raises(ValueError, match="missing.*layer.1.output.dense.weight"):
        bert_to_hfzoo(state, bert.config)
    with pytest.raises(TypeError, match="needs its config"):
        bert_to_hfzoo(bert.state_dict())


@pytest.mark.slow
def test_real_minilm_checkpoint_converts_with_matching_hidden_states(tmp_path):
    from transformers import AutoTokenizer

    path = minilm_dir()
    bert = BertModel.from_pretrained(path, attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    batch = tokenizer(
        ["A man is playing a guitar.", "The quick brown fox jumps over the lazy dog near the river bank."],
        ["Someone plays music.", "A fox."],
        padding=True,
        return_tensors="pt",
    )
    model = bert_to_hfzoo(bert)
    expected, actual = outputs(bert, dict(batch)), outputs(model, dict(batch))
    real = batch["attention_mask"].bool()
    assert (actual[real] - expected[real]).abs().max() <= TOLERANCE
    # The checkpoint folder conversion keeps the pooler as the classifier's dense layer.
    out = convert_bert_checkpoint(path, tmp_path / "minilm")
    encoder = HfzooEncoderModel.from_pretrained(out, attn_implementation="eager").eval()
    assert (outputs(encoder, dict(batch))[real] - expected[real]).abs().max() <= TOLERANCE
    classifier = AutoModelForSequenceClassification.from_pretrained(out, num_labels=2)
    assert isinstance(classifier, HfzooEncoderForSequenceClassification)
    assert torch.equal(classifier.classifier.dense.weight, bert.pooler.dense.weight)
    assert AutoTokenizer.from_pretrained(out)("a b")["input_ids"] == tokenizer("a b")["input_ids"]


def test_finetuning_the_converted_model_follows_bert_step_by_step():
    """Same weights, same batches, no dropout: AdamW full finetuning of both models stays in step (gradients match)."""
    bert = random_bert(BertForSequenceClassification, "h32-l2-a4", num_labels=2)
    with torch.no_grad():  # BERT's own init scale, so that training behaves as usual
        for param in bert.parameters():
            param.mul_(0.1)
    model = bert_to_hfzoo(bert)
    batch = padded_batch(bert.config)
    before = outputs(bert, batch)
    bert.train(), model.train()
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (bert, model)]
    labels = torch.tensor([0, 1, 1, 0])
    for _ in range(5):
        losses = []
        for m, optimizer in zip((bert, model), optimizers):
            loss = m(**batch, labels=labels).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        assert abs(losses[0] - losses[1]) < 1e-5
    bert.eval(), model.eval()
    assert (outputs(bert, batch) - outputs(model, batch)).abs().max() < 1e-4
    assert (outputs(bert, batch) - before).abs().max() > 1e-3  # training moved the model


def test_training_mode_dropout_matches_bert():
    """With hidden dropout on, a converted model in train mode drops exactly what BERT drops (same seed, same masks).

    BERT has no dropout on the feed-forward hidden layer nor before the pooler; hfzoo's converted config
    (`activation_dropout=0.0`) and classification head match that, so the two draw the same dropout
    masks in the same order and give the same training-mode logits.
    """
    bert = random_bert(BertForSequenceClassification, "h32-l2-a4", hidden_dropout_prob=0.1)
    model = bert_to_hfzoo(bert)
    assert model.config.activation_dropout == 0.0
    batch = padded_batch(bert.config)
    bert.train(), model.train()
    logits = []
    for m in (bert, model):
        torch.manual_seed(123)
        with torch.no_grad():
            logits.append(m(**batch).logits)
    assert (logits[0] - logits[1]).abs().max() < 1e-4
    torch.manual_seed(124)
    with torch.no_grad():
        other = model(**batch).logits
    assert (other - logits[1]).abs().max() > 1e-3  # dropout is really on


def test_question_answering_loss_matches_bert():
    """Same span loss as BertForQuestionAnswering, answers cut off by truncation (position >= seq_len) left out."""
    bert = random_bert(BertForQuestionAnswering, "h32-l2-a4")
    model = bert_to_hfzoo(bert)
    batch = padded_batch(bert.config)
    for start, end in (([0, 3, 1, 0], [2, 7, 4, 1]), ([0, 12, 1, 40], [2, 12, 4, 40])):
        positions = {"start_positions": torch.tensor(start), "end_positions": torch.tensor(end)}
        with torch.no_grad():
            expected, actual = bert(**batch, **positions).loss, model(**batch, **positions).loss
        assert abs(actual.item() - expected.item()) < 1e-5, (start, actual, expected)
    kept_rows = {k: v[[0, 2]] for k, v in batch.items()}  # the second positions leave rows 1 and 3 out
    with torch.no_grad():
        two_rows = model(**kept_rows, start_positions=torch.tensor([0, 1]), end_positions=torch.tensor([2, 4])).loss
    assert abs(two_rows.item() - actual.item()) < 1e-5


def test_question_answering_head_with_other_than_two_outputs_is_refused():
    bert = random_bert(BertForQuestionAnswering, "h32-l2-a4", num_labels=3)
    with pytest.raises(ValueError, match="qa_outputs.weight has 3 outputs.*2 outputs"):
        bert_to_hfzoo(bert)


@pytest.mark.parametrize(
    "bert_class, auto_class, hfzoo_class",
    [
        (BertForSequenceClassification, AutoModelForSequenceClassification, HfzooEncoderForSequenceClassification),
        (BertForQuestionAnswering, AutoModelForQuestionAnswering, HfzooEncoderForQuestionAnswering),
        (BertForTokenClassification, AutoModelForTokenClassification, HfzooEncoderForTokenClassification),
    ],
)
def test_finetuned_checkpoint_keeps_its_head_both_ways(tmp_path, bert_class, auto_class, hfzoo_class):
    """A finetuned BERT folder -> hfzoo (its Auto class, its `architectures`) -> BERT again, the same tensors."""
    bert = random_bert(bert_class, "h32-l2-a4")
    bert.save_pretrained(tmp_path / "bert")
    out = convert_bert_checkpoint(tmp_path / "bert", tmp_path / "hfzoo")
    model = auto_class.from_pretrained(out, attn_implementation="eager")
    assert isinstance(model, hfzoo_class)
    assert model.config.architectures == [hfzoo_class.__name__]
    batch = padded_batch(bert.config)
    assert (outputs(model.eval(), batch) - outputs(bert, batch)).abs().max() <= TOLERANCE
    convert_checkpoint(out, tmp_path / "back")
    back = bert_class.from_pretrained(tmp_path / "back")
    original = bert.state_dict()
    assert sorted(back.state_dict()) == sorted(original)
    assert all(torch.equal(back.state_dict()[key], value) for key, value in original.items())


def test_pretraining_checkpoint_converts_to_the_masked_lm_without_its_next_sentence_head(tmp_path, caplog):
    """The original BERT releases are BertForPreTraining folders: masked-LM head kept, NSP head left out with a word."""
    from transformers import BertForPreTraining

    bert = random_bert(BertForPreTraining, "h32-l2-a4")
    bert.save_pretrained(tmp_path / "bert")
    with caplog.at_level(logging.WARNING, logger="hfzoo.convert.bert"):
        out = convert_bert_checkpoint(tmp_path / "bert", tmp_path / "hfzoo")
    assert "left out BERT's next-sentence-prediction head (cls.seq_relationship.bias, cls.seq_relationship.weight)" in (
        caplog.text
    )
    model = AutoModelForMaskedLM.from_pretrained(out, attn_implementation="eager").eval()
    assert isinstance(model, HfzooEncoderForMaskedLM)
    batch = padded_batch(bert.config)
    with torch.no_grad():
        expected = bert(**batch).prediction_logits
    real = batch["attention_mask"].bool()
    assert (outputs(model, batch)[real] - expected[real]).abs().max() <= TOLERANCE
    # in memory too, from the model or its state dict
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="hfzoo.convert.bert"):
        for source in (bert, bert.state_dict()):
            converted = bert_to_hfzoo(source, bert.config, attn_implementation="eager")
            assert isinstance(converted, HfzooEncoderForMaskedLM)
            assert (outputs(converted, batch)[real] - expected[real]).abs().max() <= TOLERANCE
    assert caplog.text.count("left out BERT's next-sentence-prediction head") == 2
