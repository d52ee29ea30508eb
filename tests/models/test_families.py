"""Encoder and encoder-decoder families, and the task heads of all three families."""

from __future__ import annotations

import pytest
import torch
from helpers.variant_checks import TINY
from safetensors.torch import load_file
from transformers import (
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForQuestionAnswering,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
)
from transformers.cache_utils import DynamicCache

import hfzoo
from hfzoo import (
    HfzooDecoderConfig,
    HfzooDecoderForQuestionAnswering,
    HfzooDecoderForSequenceClassification,
    HfzooDecoderForTokenClassification,
    HfzooEncoderConfig,
    HfzooEncoderDecoderConfig,
    HfzooEncoderDecoderForConditionalGeneration,
    HfzooEncoderDecoderForQuestionAnswering,
    HfzooEncoderDecoderForSequenceClassification,
    HfzooEncoderDecoderForTokenClassification,
    HfzooEncoderForMaskedLM,
    HfzooEncoderForQuestionAnswering,
    HfzooEncoderForSequenceClassification,
    HfzooEncoderForTokenClassification,
)


def build(model_class, config_class, attn="sdpa", seed=0, **overrides):
    torch.manual_seed(seed)
    model = model_class(config_class(**{**TINY, **overrides}))
    model.set_attn_implementation(attn)
    return model.eval()


def padded_batch(lengths, seed=0, pad=0, low=2):
    g = torch.Generator().manual_seed(seed)
    ids = torch.full((len(lengths), max(lengths)), pad)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(low, TINY["vocab_size"], (n,), generator=g)
        mask[i, :n] = 1
    return ids, mask


@pytest.mark.parametrize(
    "config_class, auto_class, model_class",
    [
        (HfzooEncoderConfig, AutoModelForMaskedLM, HfzooEncoderForMaskedLM),
        (HfzooEncoderConfig, AutoModelForSequenceClassification, HfzooEncoderForSequenceClassification),
        (HfzooEncoderConfig, AutoModelForTokenClassification, HfzooEncoderForTokenClassification),
        (HfzooEncoderConfig, AutoModelForQuestionAnswering, HfzooEncoderForQuestionAnswering),
        (HfzooEncoderDecoderConfig, AutoModelForSeq2SeqLM, HfzooEncoderDecoderForConditionalGeneration),
        (HfzooEncoderDecoderConfig, AutoModelForSequenceClassification, HfzooEncoderDecoderForSequenceClassification),
        (HfzooEncoderDecoderConfig, AutoModelForTokenClassification, HfzooEncoderDecoderForTokenClassification),
        (HfzooEncoderDecoderConfig, AutoModelForQuestionAnswering, HfzooEncoderDecoderForQuestionAnswering),
        (HfzooDecoderConfig, AutoModelForSequenceClassification, HfzooDecoderForSequenceClassification),
        (HfzooDecoderConfig, AutoModelForTokenClassification, HfzooDecoderForTokenClassification),
        (HfzooDecoderConfig, AutoModelForQuestionAnswering, HfzooDecoderForQuestionAnswering),
    ],
)
def test_auto_classes(config_class, auto_class, model_class):
    config = config_class(**TINY)
    assert type(auto_class.from_config(config)) is model_class
    assert config.model_type in {"hfzoo_encoder", "hfzoo_decoder", "hfzoo_encoder_decoder"}
    assert AutoModel.from_config(config) is not None


# ---------------------------------------------------------------- encoder


def test_encoder_is_bidirectional_and_padding_invariant():
    model = build(HfzooEncoderForMaskedLM, HfzooEncoderConfig)
    ids, mask = padded_batch([12, 7, 3])
    logits = model(ids, attention_mask=mask).logits
    for i, n in enumerate([12, 7, 3]):
        alone = model(ids[i : i + 1, :n]).logits[0]
        torch.testing.assert_close(logits[i, :n], alone, rtol=1e-5, atol=1e-5)
    changed = ids.clone()
    changed[0, 11] = (changed[0, 11] + 1) % TINY["vocab_size"]
    assert not torch.allclose(model(changed, attention_mask=mask).logits[0, 0], logits[0, 0])


@pytest.mark.parametrize("model_class", [HfzooEncoderForMaskedLM, HfzooEncoderDecoderForConditionalGeneration])
def test_eager_and_sdpa_agree_with_padding(model_class):
    config_class = HfzooEncoderConfig if model_class is HfzooEncoderForMaskedLM else HfzooEncoderDecoderConfig
    ids, mask = padded_batch([10, 6])
    kwargs = {"attention_mask": mask}
    if model_class is HfzooEncoderDecoderForConditionalGeneration:
        kwargs["decoder_input_ids"] = padded_batch([5, 5], seed=1)[0]
    a = build(model_class, config_class, "eager")(ids, **kwargs).logits
    b = build(model_class, config_class, "sdpa")(ids, **kwargs).logits
    if model_class is HfzooEncoderForMaskedLM:
        a, b = a[mask.bool()], b[mask.bool()]
    assert (a - b).abs().max() < 1e-5


@pytest.mark.compat
def test_masked_lm_loss_and_tied_head(tmp_path):
    model = build(HfzooEncoderForMaskedLM, HfzooEncoderConfig)
    assert model.lm_head.decoder.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    ids, mask = padded_batch([9, 9])
    labels = torch.full_like(ids, -100)
    labels[:, [2, 5]] = ids[:, [2, 5]]
    out = model(ids, attention_mask=mask, labels=labels)
    expected = torch.nn.functional.cross_entropy(
        out.logits[:, [2, 5]].reshape(-1, TINY["vocab_size"]), ids[:, [2, 5]].reshape(-1)
    )
    torch.testing.assert_close(out.loss, expected)
    model.save_pretrained(tmp_path)
    assert "lm_head.decoder.weight" not in load_file(tmp_path / "model.safetensors")
    reloaded = AutoModelForMaskedLM.from_pretrained(tmp_path).eval()
    assert torch.equal(reloaded(ids, attention_mask=mask).logits, out.logits)


def test_token_type_ids_are_used():
    model = build(HfzooEncoderForMaskedLM, HfzooEncoderConfig)
    ids, _ = padded_batch([8])
    types = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1]])
    assert not torch.allclose(model(ids, token_type_ids=types).logits, model(ids).logits)
    no_types = build(HfzooEncoderForMaskedLM, HfzooEncoderConfig, type_vocab_size=0)
    assert no_types.model.token_type_embeddings is None


@pytest.mark.parametrize(
    "model_class, config_class",
    [
        (HfzooEncoderForSequenceClassification, HfzooEncoderConfig),
        (HfzooDecoderForSequenceClassification, HfzooDecoderConfig),
        (HfzooEncoderDecoderForSequenceClassification, HfzooEncoderDecoderConfig),
    ],
)
@pytest.mark.parametrize("problem", ["single_label_classification", "multi_label_classification", "regression"])
def test_sequence_classification_problem_types(model_class, config_class, problem):
    num_labels = 1 if problem == "regression" else 3
    model = build(model_class, config_class, num_labels=num_labels, problem_type=problem)
    ids, mask = padded_batch([7, 5, 4], low=3)
    ids[0, 6], ids[1, 4], ids[2, 3] = 1, 1, 1  # end each row with eos (encoder-decoder pools there)
    if problem == "single_label_classification":
        labels = torch.tensor([0, 2, 1])
        loss_fn = lambda logits: torch.nn.functional.cross_entropy(logits, labels)  # noqa: E731
    elif problem == "multi_label_classification":
        labels = torch.tensor([[1.0, 0, 1], [0, 0, 0], [0, 1, 0]])
        loss_fn = lambda logits: torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)  # noqa: E731
    else:
        labels = torch.tensor([0.5, -1.0, 2.0])
        loss_fn = lambda logits: torch.nn.functional.mse_loss(logits.squeeze(-1), labels)  # noqa: E731
    out = model(ids, attention_mask=mask, labels=labels)
    assert out.logits.shape == (3, num_labels)
    torch.testing.assert_close(out.loss, loss_fn(out.logits))
    # Pooling ignores padding: each row's logits equal those of the row alone.
    for i, n in enumerate([7, 5, 4]):
        alone = model(ids[i : i + 1, :n]).logits
        torch.testing.assert_close(out.logits[i : i + 1], alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "model_class, config_class, labels",
    [
        (HfzooEncoderForSequenceClassification, HfzooEncoderConfig, torch.tensor([0, 3])),
        (HfzooDecoderForSequenceClassification, HfzooDecoderConfig, torch.tensor([-1, 0])),
        (HfzooEncoderDecoderForSequenceClassification, HfzooEncoderDecoderConfig, torch.tensor([5, 0])),
        (HfzooEncoderForTokenClassification, HfzooEncoderConfig, torch.tensor([[0, 1, -100, 7, 0, 0]] * 2)),
        (HfzooDecoderForTokenClassification, HfzooDecoderConfig, torch.tensor([[0, 1, -100, 0, 0, -2]] * 2)),
    ],
)
def test_labels_outside_num_labels_are_refused(model_class, config_class, labels):
    model = build(model_class, config_class, num_labels=3)
    ids, _ = padded_batch([6, 6], low=3)
    ids[:, -1] = 1
    with pytest.raises(ValueError, match=r"outside \[0, num_labels=3\)"):
        model(ids, labels=labels)


TOKEN_CLASSIFIERS = [
    (HfzooEncoderForTokenClassification, HfzooEncoderConfig),
    (HfzooDecoderForTokenClassification, HfzooDecoderConfig),
    (HfzooEncoderDecoderForTokenClassification, HfzooEncoderDecoderConfig),
]
SPAN_HEADS = [
    (HfzooEncoderForQuestionAnswering, HfzooEncoderConfig),
    (HfzooDecoderForQuestionAnswering, HfzooDecoderConfig),
    (HfzooEncoderDecoderForQuestionAnswering, HfzooEncoderDecoderConfig),
]


@pytest.mark.parametrize("model_class, config_class", TOKEN_CLASSIFIERS)
def test_token_classification_loss_ignores_minus_100(model_class, config_class):
    model = build(model_class, config_class, num_labels=4)
    ids, mask = padded_batch([6, 4])
    labels = torch.tensor([[0, 1, 2, 3, 0, 1], [3, 2, 1, 0, -100, -100]])
    out = model(ids, attention_mask=mask, labels=labels)
    keep = labels != -100
    torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(out.logits[keep], labels[keep]))


@pytest.mark.parametrize("model_class, config_class", SPAN_HEADS)
def test_span_head_scores_each_row_as_if_alone_and_refuses_negative_positions(model_class, config_class):
    model = build(model_class, config_class, num_labels=5)  # two outputs regardless
    ids, mask = padded_batch([9, 6])
    out = model(ids, attention_mask=mask)
    assert out.start_logits.shape == out.end_logits.shape == (2, 9)
    alone = model(ids[1:, :6])
    torch.testing.assert_close(out.start_logits[1, :6], alone.start_logits[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.end_logits[1, :6], alone.end_logits[0], rtol=1e-5, atol=1e-5)
    # -100 (the other heads' "ignore") would be clamped to 0, the "no answer" token: refused
    with pytest.raises(ValueError, match="end_positions has -100 in row 1: answer positions are token indices from 0"):
        model(ids, attention_mask=mask, start_positions=torch.tensor([2, 3]), end_positions=torch.tensor([4, -100]))
    # in bf16 the logits stay bf16 and the loss is computed in float32, as the other heads' losses
    half = model.to(torch.bfloat16)(
        ids, attention_mask=mask, start_positions=torch.tensor([2, 3]), end_positions=torch.tensor([4, 5])
    )
    assert half.start_logits.dtype == torch.bfloat16 and half.loss.dtype == torch.float32
    logits = torch.stack([half.start_logits, half.end_logits]).float()  # (2, batch, seq_len)
    expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1), torch.tensor([2, 3, 4, 5]))
    torch.testing.assert_close(half.loss, expected)


PEFT_HEADS = [
    (*SPAN_HEADS[0], "QUESTION_ANS", "qa_outputs"),
    (*SPAN_HEADS[1], "QUESTION_ANS", "qa_outputs"),
    (*SPAN_HEADS[2], "QUESTION_ANS", "qa_outputs"),
    (*TOKEN_CLASSIFIERS[0], "TOKEN_CLS", "classifier"),
    (*TOKEN_CLASSIFIERS[1], "TOKEN_CLS", "score"),
    (*TOKEN_CLASSIFIERS[2], "TOKEN_CLS", "classifier"),
]


@pytest.mark.parametrize("method", ["lora", "prefix"])
@pytest.mark.parametrize("model_class, config_class, task_type, head", PEFT_HEADS)
def test_span_and_token_heads_train_and_reload_with_peft(tmp_path, method, model_class, config_class, task_type, head):
    """PEFT's QUESTION_ANS and TOKEN_CLS tasks: the adapter trains through the model's own forward (its loss), the
    head is trained and saved with it, the reload matches."""
    from peft import PeftModel

    from hfzoo.finetuning.adapters import build_peft_config, wrap_with_peft

    base = build(model_class, config_class, attn="eager", num_labels=3)
    ids, mask = padded_batch([7, 5])
    if task_type == "QUESTION_ANS":
        targets = {"start_positions": torch.tensor([1, 2]), "end_positions": torch.tensor([3, 4])}
        output = lambda out: out.start_logits  # noqa: E731
    else:
        targets = {"labels": torch.tensor([[0, 1, 2, 0, 1, 2, 0], [2, 1, 0, 2, 1, -100, -100]])}
        output = lambda out: out.logits  # noqa: E731
    with torch.no_grad():
        before = output(base(ids, attention_mask=mask))
    config = build_peft_config(method, base.config, task_type=task_type, num_virtual_tokens=4)
    model = wrap_with_peft(base, config).train()
    trainable = [name for name, param in model.named_parameters() if param.requires_grad]
    assert any(f"{head}.modules_to_save" in name for name in trainable), trainable
    calls = []
    base.register_forward_pre_hook(lambda module, args, kwargs: calls.append(set(kwargs)), with_kwargs=True)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for step in range(5):
        loss = model(input_ids=ids, attention_mask=mask, **targets).loss
        loss.backward()
        if method == "prefix" and step == 0:  # every layer's keys and values of the prefix reach the loss
            grad = model.prompt_encoder["default"].embedding.weight.grad
            per_layer = grad.view(config.num_virtual_tokens, config.num_layers * 2, -1).abs().sum((0, 2))
            assert (per_layer > 0).all(), per_layer
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert len(calls) == 5  # PEFT called the model (not its own loss on the backbone's states)
    model.save_pretrained(tmp_path)
    reloaded = PeftModel.from_pretrained(build(model_class, config_class, attn="eager", num_labels=3), tmp_path)
    with torch.no_grad():
        trained = output(model.eval()(input_ids=ids, attention_mask=mask))
        again = output(reloaded.eval()(input_ids=ids, attention_mask=mask))
    assert not torch.allclose(trained, before, atol=1e-3)
    torch.testing.assert_close(again, trained, rtol=0, atol=0)


def test_encoder_accepts_prefix_key_values():
    """PEFT prefix tuning hands a cache to the encoder; a prefix must change its outputs."""
    model = build(HfzooEncoderForMaskedLM, HfzooEncoderConfig).model
    ids, mask = padded_batch([6, 6])
    prefix = DynamicCache(config=model.config)
    for layer in range(TINY["num_hidden_layers"]):
        kv = torch.randn(2, TINY["num_attention_heads"], 3, 8)
        prefix.update(kv, kv.clone(), layer)
    with_prefix = model(ids, attention_mask=torch.cat([torch.ones(2, 3, dtype=torch.long), mask], 1), cache=prefix)
    without = model(ids, attention_mask=mask)
    assert with_prefix.last_hidden_state.shape == without.last_hidden_state.shape
    assert not torch.allclose(with_prefix.last_hidden_state, without.last_hidden_state)


# ---------------------------------------------------------------- decoder


@pytest.mark.compat
@pytest.mark.parametrize("head", ["token-classification", "question-answering"])
def test_decoder_task_heads_equal_transformers_llama_heads(head):
    """`LlamaForTokenClassification` / `LlamaForQuestionAnswering` (transformers' generic decoder heads) with their
    body converted by `hfzoo.convert.llama_to_hfzoo` and their head copied by name: the same logits and loss."""
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForQuestionAnswering, LlamaForTokenClassification

    from hfzoo.convert import llama_to_hfzoo

    torch.manual_seed(0)
    llama_config = LlamaConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, intermediate_size=64, num_labels=5, pad_token_id=0)  # fmt: skip
    native_class, hfzoo_class = {
        "token-classification": (LlamaForTokenClassification, HfzooDecoderForTokenClassification),
        "question-answering": (LlamaForQuestionAnswering, HfzooDecoderForQuestionAnswering),
    }[head]
    native = native_class(llama_config).eval()
    body = native.base_model_prefix + "."  # "model." or "transformer."
    causal_lm = LlamaForCausalLM(llama_config)
    causal_lm.model.load_state_dict(
        {k.removeprefix(body): v for k, v in native.state_dict().items() if k.startswith(body)}
    )
    converted = llama_to_hfzoo(causal_lm)
    converted.config.num_labels = 5  # the causal-LM converter carries no label set
    model = hfzoo_class(converted.config).eval()
    state = {k: v for k, v in converted.state_dict().items() if k.startswith("model.")}
    state |= {k: v for k, v in native.state_dict().items() if not k.startswith(body)}  # score / qa_outputs
    model.load_state_dict(state, strict=True)
    ids, mask = padded_batch([9, 6])
    if head == "token-classification":
        labels = torch.randint(0, 5, ids.shape).masked_fill(mask == 0, -100)
        expected, got = native(ids, attention_mask=mask, labels=labels), model(ids, attention_mask=mask, labels=labels)
        torch.testing.assert_close(got.logits, expected.logits, rtol=1e-5, atol=1e-5)
    else:
        positions = {"start_positions": torch.tensor([1, 3]), "end_positions": torch.tensor([4, 12])}  # 12: cut off
        expected, got = native(ids, attention_mask=mask, **positions), model(ids, attention_mask=mask, **positions)
        torch.testing.assert_close(got.start_logits, expected.start_logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got.end_logits, expected.end_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got.loss, expected.loss, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- encoder-decoder


def test_seq2seq_labels_are_shifted_right_behind_decoder_start():
    model = build(HfzooEncoderDecoderForConditionalGeneration, HfzooEncoderDecoderConfig)
    ids, mask = padded_batch([8, 5])
    labels = torch.tensor([[5, 6, 7, 1], [8, 1, -100, -100]])
    decoder_input_ids = torch.tensor([[0, 5, 6, 7], [0, 8, 1, 0]])
    a = model(ids, attention_mask=mask, labels=labels)
    b = model(ids, attention_mask=mask, decoder_input_ids=decoder_input_ids)
    torch.testing.assert_close(a.logits, b.logits)
    keep = labels != -100
    torch.testing.assert_close(a.loss, torch.nn.functional.cross_entropy(a.logits[keep], labels[keep]))


def test_seq2seq_decoder_is_causal_and_encoder_padding_invariant():
    model = build(HfzooEncoderDecoderForConditionalGeneration, HfzooEncoderDecoderConfig)
    ids, mask = padded_batch([9, 4])
    dec = padded_batch([6, 6], seed=3)[0]
    base = model(ids, attention_mask=mask, decoder_input_ids=dec).logits
    changed = dec.clone()
    changed[:, 4:] = 7
    torch.testing.assert_close(model(ids, attention_mask=mask, decoder_input_ids=changed).logits[:, :4], base[:, :4])
    alone = model(ids[1:, :4], decoder_input_ids=dec[1:]).logits
    torch.testing.assert_close(base[1:], alone, rtol=1e-5, atol=1e-5)


@pytest.mark.compat
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("num_decoder_layers", [2, 3])
def test_seq2seq_greedy_generation_same_with_and_without_cache(attn, num_decoder_layers):
    model = build(
        HfzooEncoderDecoderForConditionalGeneration,
        HfzooEncoderDecoderConfig,
        attn,
        seed=4,
        num_decoder_layers=num_decoder_layers,
    )
    ids, mask = padded_batch([10, 6], seed=4)
    # No token twice: at init greedy decoding repeats the start token, all cached keys the same.
    kwargs = dict(max_new_tokens=20, min_new_tokens=20, do_sample=False, no_repeat_ngram_size=1)
    a = model.generate(ids, attention_mask=mask, use_cache=True, **kwargs)
    b = model.generate(ids, attention_mask=mask, use_cache=False, **kwargs)
    assert a.shape == (2, 21) and (a[:, 0] == 0).all()
    assert torch.equal(a, b)


@pytest.mark.compat
def test_seq2seq_shares_one_embedding_matrix_and_round_trips(tmp_path):
    model = build(HfzooEncoderDecoderForConditionalGeneration, HfzooEncoderDecoderConfig, num_decoder_layers=3)
    shared = model.model.shared.weight.data_ptr()
    assert model.model.encoder.embed_tokens.weight.data_ptr() == shared
    assert model.model.decoder.embed_tokens.weight.data_ptr() == shared
    assert model.lm_head.weight.data_ptr() == shared
    assert len(model.model.decoder.layers) == 3 and len(model.model.encoder.layers) == 2
    model.save_pretrained(tmp_path)
    stored = load_file(tmp_path / "model.safetensors")
    assert [k for k in stored if k.endswith("embed_tokens.weight") or k == "lm_head.weight"] == []
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    state = reloaded.state_dict()
    for name, tensor in stored.items():
        assert torch.equal(state[name], tensor), name
    assert reloaded.model.decoder.embed_tokens.weight.data_ptr() == reloaded.model.shared.weight.data_ptr()
    ids, mask = padded_batch([7, 7])
    dec = padded_batch([4, 4], seed=2)[0]
    assert torch.equal(reloaded(ids, decoder_input_ids=dec).logits, model(ids, decoder_input_ids=dec).logits)


def test_seq2seq_untied_output_head():
    model = build(HfzooEncoderDecoderForConditionalGeneration, HfzooEncoderDecoderConfig, tie_word_embeddings=False)
    assert model.lm_head.weight.data_ptr() != model.model.shared.weight.data_ptr()
    assert model.model.decoder.embed_tokens.weight.data_ptr() == model.model.shared.weight.data_ptr()


def test_seq2seq_outputs_hidden_states_per_stack():
    model = build(HfzooEncoderDecoderForConditionalGeneration, HfzooEncoderDecoderConfig, "eager", num_decoder_layers=3)
    ids, _ = padded_batch([5])
    out = model(ids, decoder_input_ids=ids[:, :3], output_hidden_states=True, output_attentions=True)
    assert len(out.encoder_hidden_states) == 3 and len(out.decoder_hidden_states) == 4
    assert out.cross_attentions[0].shape == (1, TINY["num_attention_heads"], 3, 5)
    assert out.decoder_attentions[0].shape == (1, TINY["num_attention_heads"], 3, 3)


def test_encoder_decoder_config_validation():
    from huggingface_hub.errors import StrictDataclassClassValidationError

    with pytest.raises(StrictDataclassClassValidationError, match="num_decoder_layers"):
        HfzooEncoderDecoderConfig(**{**TINY, "num_decoder_layers": 0})
    assert HfzooEncoderDecoderConfig(**TINY).num_decoder_layers == TINY["num_hidden_layers"]
    deeper = HfzooEncoderDecoderConfig(**{**TINY, "num_decoder_layers": 5})
    assert deeper.get_text_config(decoder=True).num_hidden_layers == 5
    assert deeper.num_hidden_layers == TINY["num_hidden_layers"]
    assert hfzoo.HfzooEncoderDecoderConfig(**TINY).is_encoder_decoder


def test_embedding_norm_normalizes_the_summed_embeddings():
    """BERT's `embeddings.LayerNorm`: the first layer's input has zero mean and unit variance per token."""
    ids, mask = padded_batch([7, 5])
    for flag in (False, True):
        model = build(HfzooEncoderForMaskedLM, HfzooEncoderConfig, embedding_norm=flag, layer_norm_eps=1e-12)
        first = model.model(ids, attention_mask=mask, output_hidden_states=True).hidden_states[0]
        normalized = torch.allclose(first.mean(-1), torch.zeros(()), atol=1e-5) and torch.allclose(
            first.var(-1, unbiased=False), torch.ones(()), atol=1e-3
        )
        assert normalized == flag
        assert (model.model.embed_norm is not None) == flag
