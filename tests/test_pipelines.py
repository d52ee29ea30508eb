"""transformers pipelines on hfzoo checkpoints: fill-mask, text-(2text-)generation, text- and token-classification."""

from __future__ import annotations

import pytest
import torch
from transformers import pipeline

import hfzoo
import hfzoo.pipelines
from hfzoo.data.loading import clean_text
from hfzoo.tokenization import train_bpe_tokenizer

SIZES = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=128
)


@pytest.fixture(scope="module")
def texts(gutenberg_books):
    return [clean_text(b["text"])[:200_000] for b in gutenberg_books[:2]]


def tokenizer_for(family, texts):
    return train_bpe_tokenizer([texts], vocab_size=700, model_family=family, num_extra_ids=10)


def save(model, tokenizer, path):
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def config_for(config_class, tokenizer, **extra):
    ids = {k: getattr(tokenizer, k) for k in ("pad_token_id", "bos_token_id", "eos_token_id")}
    return config_class(vocab_size=len(tokenizer), **SIZES, **{k: v for k, v in ids.items() if v is not None}, **extra)


def heads(suffix: str) -> list[tuple[str, type, type]]:
    """`(family, config class, model class)` of each family's head `Hfzoo<Family><suffix>`."""
    families = {"encoder": "Encoder", "decoder": "Decoder", "encoder-decoder": "EncoderDecoder"}
    return [(family, getattr(hfzoo, f"Hfzoo{name}Config"), getattr(hfzoo, f"Hfzoo{name}{suffix}"))
            for family, name in families.items()]  # fmt: skip


@pytest.mark.compat
def test_fill_mask(tmp_path, texts):
    tokenizer = tokenizer_for("encoder", texts)
    torch.manual_seed(0)
    model = hfzoo.HfzooEncoderForMaskedLM(config_for(hfzoo.HfzooEncoderConfig, tokenizer))
    fill = pipeline("fill-mask", model=save(model, tokenizer, tmp_path), top_k=3)
    text = f"It was the best of {tokenizer.mask_token}."
    out = fill(text)
    assert len(out) == 3
    for candidate in out:
        assert candidate["token"] not in tokenizer.all_special_ids
        assert candidate["sequence"].startswith("It was the best of")
    # The saved model's own top 3 at the mask, so a checkpoint loaded with other weights fails.
    inputs = tokenizer(text, return_tensors="pt")
    with torch.no_grad():
        logits = model.eval()(**inputs).logits[inputs["input_ids"] == tokenizer.mask_token_id]
    scores, tokens = logits.softmax(-1)[0].topk(3)
    assert [c["token"] for c in out] == tokens.tolist()
    assert [c["score"] for c in out] == pytest.approx(scores.tolist(), rel=1e-4)


@pytest.mark.compat
def test_text_generation(tmp_path, texts):
    tokenizer = tokenizer_for("decoder", texts)
    torch.manual_seed(0)
    model = hfzoo.HfzooDecoderForCausalLM(config_for(hfzoo.HfzooDecoderConfig, tokenizer))
    generate = pipeline("text-generation", model=save(model, tokenizer, tmp_path))
    # No token twice: at init greedy decoding repeats the last token, whatever the weights.
    kwargs = dict(max_new_tokens=10, min_new_tokens=10, do_sample=False, no_repeat_ngram_size=1)
    out = generate("Once upon a time", **kwargs)
    text = out[0]["generated_text"]
    assert text.startswith("Once upon a time") and len(text) > len("Once upon a time")
    # The saved model's own continuation, so a checkpoint loaded with other weights fails.
    ids = generate("Once upon a time", return_tensors=True, **kwargs)[0]["generated_token_ids"]
    expected = model.eval().generate(**tokenizer("Once upon a time", return_tensors="pt"), **kwargs)
    assert list(ids) == expected[0].tolist()


@pytest.mark.compat
def test_text2text_generation(tmp_path, texts):
    tokenizer = tokenizer_for("encoder-decoder", texts)
    torch.manual_seed(0)
    config = config_for(hfzoo.HfzooEncoderDecoderConfig, tokenizer, decoder_start_token_id=tokenizer.pad_token_id)
    model = hfzoo.HfzooEncoderDecoderForConditionalGeneration(config)
    # transformers v5 removed its "text2text-generation" task; hfzoo.pipelines registers the equivalent.
    path = save(model, tokenizer, tmp_path)
    t2t = pipeline(hfzoo.pipelines.TASK, model=path)
    out = t2t("The old man and the sea", max_new_tokens=8, min_new_tokens=8, do_sample=False)
    inputs = tokenizer("The old man and the sea", return_tensors="pt")
    expected = model.eval().generate(**inputs, max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert out == [{"generated_text": tokenizer.decode(expected[0], skip_special_tokens=True)}]
    assert expected.shape == (1, 9)  # decoder start + 8 new tokens


@pytest.mark.compat
@pytest.mark.parametrize("family, config_class, model_class", heads("ForSequenceClassification"))
def test_text_classification(tmp_path, texts, family, config_class, model_class):
    tokenizer = tokenizer_for(family, texts)
    torch.manual_seed(0)
    config = config_for(config_class, tokenizer, num_labels=2, id2label={0: "NEGATIVE", 1: "POSITIVE"},
                        label2id={"NEGATIVE": 0, "POSITIVE": 1})  # fmt: skip
    model = model_class(config)
    classify = pipeline("text-classification", model=save(model, tokenizer, tmp_path), top_k=None)
    reviews = ["a wonderful, moving story", "dull and far too long; it never ends, and nothing happens in it"]
    for batch_size in (1, 2):  # 2: the shorter text is padded
        out = classify(reviews, batch_size=batch_size)
        for text, row in zip(reviews, out):
            assert {r["label"] for r in row} == {"NEGATIVE", "POSITIVE"}
            assert sum(r["score"] for r in row) == pytest.approx(1.0, abs=1e-5)
            # The saved model's own probabilities on the text alone, unpadded (padding moves them by about 1e-7 here;
            # an ignored attention mask or other weights by more than 5e-5).
            with torch.no_grad():
                probs = model.eval()(**tokenizer(text, return_tensors="pt")).logits.softmax(-1)[0]
            assert {r["label"]: r["score"] for r in row} == pytest.approx(
                {"NEGATIVE": probs[0].item(), "POSITIVE": probs[1].item()}, rel=0, abs=1e-5
            )


@pytest.mark.compat
@pytest.mark.parametrize("family, config_class, model_class", heads("ForTokenClassification"))
def test_token_classification(tmp_path, texts, family, config_class, model_class):
    """Each token the pipeline reports is the saved model's own argmax at that token, with its probability and its
    characters in the text; the tokens it leaves out are those whose argmax is "O" (and the special tokens)."""
    tokenizer = tokenizer_for(family, texts)
    torch.manual_seed(0)
    labels = {0: "O", 1: "B-PER", 2: "I-PER"}
    config = config_for(config_class, tokenizer, num_labels=3, id2label=labels,
                        label2id={name: i for i, name in labels.items()})  # fmt: skip
    model = model_class(config)
    head = model.score if family == "decoder" else model.classifier  # the decoder's is named as Llama's
    with torch.no_grad():
        head.bias.copy_(torch.tensor([0.0, 0.1, 0.1]))  # some tokens of each label
    tag = pipeline("token-classification", model=save(model, tokenizer, tmp_path))
    text = "The old man and the sea went to London in 1952 with his son."
    inputs = tokenizer(text, return_tensors="pt", return_offsets_mapping=True)
    offsets = inputs.pop("offset_mapping")[0]
    with torch.no_grad():
        probs = model.eval()(**inputs).logits.softmax(-1)[0]
    special = set(tokenizer.all_special_ids)
    expected = [
        (index, labels[int(row.argmax())], row.max().item(), *map(int, offsets[index]))
        for index, row in enumerate(probs)
        if int(row.argmax()) != 0 and int(inputs["input_ids"][0, index]) not in special
    ]
    got = [(e["index"], e["entity"], float(e["score"]), e["start"], e["end"]) for e in tag(text)]
    assert [g[:2] + g[3:] for g in got] == [e[:2] + e[3:] for e in expected] and len(expected) >= 2
    assert [g[2] for g in got] == pytest.approx([e[2] for e in expected], rel=0, abs=1e-5)
