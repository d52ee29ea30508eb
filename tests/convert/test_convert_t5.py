"""T5 <-> hfzoo encoder-decoder conversion: logit parity with padding (v1.0 and v1.1), exact round trips, presets."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.variant_checks import check_cached_generation
from transformers import T5Config, T5ForConditionalGeneration

from hfzoo import HfzooEncoderDecoderConfig, HfzooEncoderDecoderForConditionalGeneration
from hfzoo.convert import hfzoo_config_from_t5, hfzoo_to_t5, t5_config_from_hfzoo, t5_to_hfzoo
from hfzoo.models.presets import build_config

# Two tiny sizes; the second has d_kv != d_model / num_heads, unequal stack depths and few buckets with a
# short max distance, so 12-token inputs reach T5's logarithmic and last buckets.
SIZES = {
    "d32-l2-h4": dict(vocab_size=97, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4),
    "d48-l3x2-h3-kv12": dict(
        vocab_size=131,
        d_model=48,
        d_kv=12,
        d_ff=80,
        num_layers=3,
        num_decoder_layers=2,
        num_heads=3,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=7,
    ),
}
VERSIONS = {
    # v1.0: ReLU, lm_head tied to the embeddings, its input scaled by d_model ** -0.5
    "v1.0": dict(feed_forward_proj="relu"),
    # v1.1: GeGLU (gelu_new), untied lm_head, no scaling
    "v1.1": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False),
}
TOLERANCE = 1e-4


def t5_config(size: str, version: str) -> T5Config:
    return T5Config(**SIZES[size], **VERSIONS[version], dropout_rate=0.0, decoder_start_token_id=0)


def perturb(model: torch.nn.Module, head: str, bias_std: float = 0.5) -> None:
    """Norm weights away from 1, and the relative bias and the head (parameters named with `head`) away from T5's
    small initial values, so that a misplaced norm, bias or head weight shows in the outputs."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "layer_norm" in name:
                param.copy_(1 + 0.3 * torch.randn_like(param))
            elif "relative_attention_bias" in name or (head and head in name):
                param.normal_(0.0, bias_std)


def random_t5(size: str, version: str, seed: int = 0) -> T5ForConditionalGeneration:
    """A T5 with T5's own random initialisation, random norm weights and biases, and (v1.1) an untied lm_head.

    transformers 5 builds every T5 with `lm_head` tied to `shared` (a v1.1 checkpoint unties it when
    loaded), so the v1.1 reference gets its own `lm_head` here, as after loading google/t5-v1_1-*.
    """
    torch.manual_seed(seed)
    model = T5ForConditionalGeneration(t5_config(size, version))
    if version == "v1.1":
        model.lm_head.weight = torch.nn.Parameter(torch.randn_like(model.lm_head.weight))
        model.all_tied_weights_keys.pop("lm_head.weight", None)
    perturb(model, "", bias_std=1.0)
    model.set_attn_implementation("eager")
    return model.eval()


def padded_batch(vocab_size: int, side: str, seed: int = 1) -> dict[str, torch.Tensor]:
    """Encoder inputs `(4, 12)` (12, 9, 5, 1 real tokens, padded on `side`) and right-padded decoder inputs `(4, 7)`."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, vocab_size, (4, 12), generator=g)
    mask = torch.zeros_like(ids)
    for row, length in enumerate([12, 9, 5, 1]):
        if side == "right":
            mask[row, :length] = 1
        else:
            mask[row, 12 - length :] = 1
    decoder_ids = torch.randint(2, vocab_size, (4, 7), generator=g)
    decoder_mask = torch.ones_like(decoder_ids)
    decoder_mask[1, 5:] = decoder_mask[3, 2:] = 0
    return dict(
        input_ids=ids.masked_fill(mask == 0, 0),
        attention_mask=mask,
        decoder_input_ids=decoder_ids.masked_fill(decoder_mask == 0, 0),
        decoder_attention_mask=decoder_mask,
    )


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("version", list(VERSIONS))
@pytest.mark.parametrize("size", list(SIZES))
def test_t5_to_hfzoo_logits_match_with_padding(size, version, backend, side):
    t5 = random_t5(size, version)
    model = t5_to_hfzoo(t5, attn_implementation=backend)
    assert isinstance(model, HfzooEncoderDecoderForConditionalGeneration)
    assert model.config._attn_implementation == backend
    assert model.config.tie_word_embeddings == model.config.scale_lm_head_input == (version == "v1.0")
    assert model.config.gated_mlp == (version == "v1.1")
    batch = padded_batch(t5.config.vocab_size, side)
    with torch.no_grad():
        expected = t5(**batch).logits
        actual = model(**batch).logits
    real = batch["decoder_attention_mask"].bool()
    assert expected.dtype == actual.dtype == torch.float32
    diff = (actual[real] - expected[real]).abs().max().item()
    print(f"\n{size} {version} {backend} {side}-padded: max |logit diff| = {diff:.3e} (std {expected[real].std():.2f})")
    assert expected[real].std() > 0.5  # far from trivial logits
    assert diff <= TOLERANCE


@pytest.mark.parametrize(
    "mistake",
    ["swap encoder/decoder relative bias", "share decoder bias direction", "drop lm_head scaling"],
)
def test_parity_check_is_sensitive_to_a_conversion_mistake(mistake):
    t5 = random_t5("d48-l3x2-h3-kv12", "v1.0")
    model = t5_to_hfzoo(t5, attn_implementation="eager")
    with torch.no_grad():
        if mistake == "swap encoder/decoder relative bias":
            enc, dec = model.model.encoder.relative_attention_bias, model.model.decoder.relative_attention_bias
            enc_w = enc.weight.clone()
            enc.weight.copy_(dec.weight)
            dec.weight.copy_(enc_w)
        elif mistake == "share decoder bias direction":
            model.model.decoder.relative_attention_bias.bidirectional = True
        else:
            model.lm_head.input_scale = None
    batch = padded_batch(t5.config.vocab_size, "right")
    with torch.no_grad():
        diff = (model(**batch).logits - t5(**batch).logits)[batch["decoder_attention_mask"].bool()]
    assert diff.abs().max() > 100 * TOLERANCE


@pytest.mark.parametrize("version", list(VERSIONS))
@pytest.mark.parametrize("size", list(SIZES))
def test_round_trip_gives_the_original_state_dict_exactly(size, version):
    t5 = random_t5(size, version)
    original = t5.state_dict()
    back = hfzoo_to_t5(t5_to_hfzoo(t5))
    assert isinstance(back, T5ForConditionalGeneration)
    state = back.state_dict()
    assert list(state) == list(original)
    for key, value in original.items():
        assert state[key].dtype == value.dtype and state[key].shape == value.shape, key
        assert torch.equal(state[key], value), key
    assert (back.lm_head.weight is back.shared.weight) == (version == "v1.0")
    assert back.config.scale_decoder_outputs == (version == "v1.0")
    batch = padded_batch(t5.config.vocab_size, "right")
    with torch.no_grad():
        assert torch.equal(back(**batch).logits, t5(**batch).logits)
    # and the other way round
    model = t5_to_hfzoo(t5)
    again = t5_to_hfzoo(hfzoo_to_t5(model)).state_dict()
    assert list(again) == list(model.state_dict())
    assert all(torch.equal(again[key], value) for key, value in model.state_dict().items())


def test_bfloat16_round_trip_keeps_dtype_and_values():
    t5 = random_t5("d32-l2-h4", "v1.1").to(torch.bfloat16)
    model = t5_to_hfzoo(t5)
    assert model.dtype == torch.bfloat16
    back = hfzoo_to_t5(model).state_dict()
    assert all(back[k].dtype == torch.bfloat16 and torch.equal(back[k], v) for k, v in t5.state_dict().items())


@pytest.mark.compat
@pytest.mark.parametrize("version", list(VERSIONS))
def test_greedy_generation_with_kv_cache_matches(version):
    t5 = random_t5("d48-l3x2-h3-kv12", version)
    model = t5_to_hfzoo(t5, attn_implementation="sdpa")
    batch = padded_batch(t5.config.vocab_size, "right")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    kwargs = dict(max_new_tokens=9, eos_token_id=None, pad_token_id=0)  # past the decoder bias's 7-token max distance
    # the same tokens and logits of every step with and without the cache (no token twice: check_cached_generation)
    cached = check_cached_generation(model, ids, mask, **kwargs)
    with torch.no_grad():  # and T5's own cached generation
        expected = t5.generate(
            ids,
            attention_mask=mask,
            use_cache=True,
            min_new_tokens=9,
            do_sample=False,
            no_repeat_ngram_size=1,
            output_logits=True,
            return_dict_in_generate=True,
            **kwargs,
        )
    assert torch.equal(cached.sequences, expected.sequences)
    torch.testing.assert_close(torch.stack(cached.logits), torch.stack(expected.logits), rtol=0, atol=TOLERANCE)


def test_state_dict_input_without_tied_copies_and_key_errors():
    t5 = random_t5("d32-l2-h4", "v1.0")
    # safetensors checkpoints store tied weights once: only shared.weight
    state = {
        k: v for k, v in t5.state_dict().items() if not k.endswith("embed_tokens.weight") and k != "lm_head.weight"
    }
    state["decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"] = torch.zeros(32, 4)  # legacy
    model = t5_to_hfzoo(state, t5.config)
    assert model.lm_head.weight is model.model.shared.weight
    batch = padded_batch(t5.config.vocab_size, "right")
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).logits, t5(**batch).logits, rtol=0, atol=TOLERANCE)
    with pytest.raises(TypeError, match="needs its config"):
        t5_to_hfzoo(state)
    with pytest.raises(ValueError, match="missing .*encoder.block.1.layer.0.layer_norm.weight"):
        t5_to_hfzoo({k: v for k, v in state.items() if k != "encoder.block.1.layer.0.layer_norm.weight"}, t5.config)
    untied = dict(t5.state_dict(), **{"lm_head.weight": torch.randn_like(t5.lm_head.weight)})
    with pytest.raises(ValueError, match="tie_word_embeddings=True but"):
        t5_to_hfzoo(untied, hfzoo_config_from_t5(t5.config))


@pytest.mark.parametrize("version", list(VERSIONS))
@pytest.mark.parametrize("size", list(SIZES))
def test_config_round_trip(size, version):
    t5 = t5_config(size, version)
    config = hfzoo_config_from_t5(t5)
    back = t5_config_from_hfzoo(config)
    for name in (
        "vocab_size",
        "d_model",
        "d_kv",
        "d_ff",
        "num_layers",
        "num_decoder_layers",
        "num_heads",
        "relative_attention_num_buckets",
        "relative_attention_max_distance",
        "dropout_rate",
        "layer_norm_epsilon",
        "feed_forward_proj",
        "dense_act_fn",
        "is_gated_act",
        "scale_decoder_outputs",
        "pad_token_id",
        "eos_token_id",
        "decoder_start_token_id",
    ):
        assert getattr(back, name) == getattr(t5, name), name
    assert hfzoo_config_from_t5(back).to_dict() == config.to_dict()


@pytest.mark.parametrize(
    "overrides, field",
    [
        ({"position_embedding_type": "rotary"}, "position_embedding_type"),
        ({"share_relative_attention_bias": False}, "share_relative_attention_bias"),
        ({"norm_type": "layer_norm"}, "norm_type"),
        ({"norm_position": "post"}, "norm_position"),
        ({"attention_bias": True}, "attention_bias"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"scale_attention_scores": True}, "scale_attention_scores"),
        ({"embedding_norm": True}, "embedding_norm"),
        ({"attention_probs_dropout_prob": 0.2}, "attention_probs_dropout_prob"),
    ],
)
def test_hfzoo_settings_t5_cannot_express_are_refused(overrides, field):
    fields = {**build_config("t5-v1.0").to_dict(), "num_hidden_layers": 1, "num_decoder_layers": 1, **overrides}
    for key in ("model_type", "transformers_version", "architectures"):
        fields.pop(key, None)
    with pytest.raises(ValueError, match=field):
        t5_config_from_hfzoo(HfzooEncoderDecoderConfig(**fields))


@pytest.mark.compat
@pytest.mark.parametrize("version", list(VERSIONS))
def test_t5_sequence_classifier_converts_to_the_hfzoo_classifier_and_back_exactly(version):
    """`T5ForSequenceClassification` (body under `transformer.`, `classification_head`): the same logits and loss in
    eval mode (both classify the decoder's state at the source's last EOS), the label set carried, the state dict
    back exactly; a state dict picks the classifier from its keys."""
    from transformers import T5ForSequenceClassification

    from hfzoo import HfzooEncoderDecoderForSequenceClassification

    torch.manual_seed(0)
    config = T5Config(**SIZES["d32-l2-h4"], **VERSIONS[version], dropout_rate=0.0, decoder_start_token_id=0,
                      num_labels=3, id2label={0: "a", 1: "b", 2: "c"}, classifier_dropout=0.1)  # fmt: skip
    t5 = T5ForSequenceClassification(config).eval()
    perturb(t5, "classification_head")
    ids = torch.randint(2, 97, (3, 10))
    mask = torch.ones_like(ids)
    ids[0, 9], ids[1, 6], ids[2, 3] = 1, 1, 1  # each row ends with EOS (id 1), then padding
    mask[1, 7:], mask[2, 4:] = 0, 0
    ids = ids.masked_fill(mask == 0, 0)
    labels = torch.tensor([0, 2, 1])
    model = t5_to_hfzoo(t5)
    assert isinstance(model, HfzooEncoderDecoderForSequenceClassification)
    assert model.config.id2label == config.id2label and model.config.classifier_dropout == 0.1
    with torch.no_grad():
        expected = t5(input_ids=ids, attention_mask=mask, labels=labels)
        got = model(input_ids=ids, attention_mask=mask, labels=labels)
    torch.testing.assert_close(got.logits, expected.logits, atol=TOLERANCE, rtol=TOLERANCE)
    torch.testing.assert_close(got.loss, expected.loss, atol=TOLERANCE, rtol=TOLERANCE)
    back = hfzoo_to_t5(model)
    assert type(back) is T5ForSequenceClassification
    assert back.config.to_diff_dict() == t5.config.to_diff_dict()
    assert sorted(back.state_dict()) == sorted(t5.state_dict())
    assert all(torch.equal(back.state_dict()[k], v) for k, v in t5.state_dict().items())
    assert isinstance(t5_to_hfzoo(t5.state_dict(), config), HfzooEncoderDecoderForSequenceClassification)
    assert type(hfzoo_to_t5(model.state_dict(), model.config)) is T5ForSequenceClassification


@pytest.mark.compat
def test_t5_span_head_converts_to_the_hfzoo_span_head_and_back_exactly():
    """`T5ForQuestionAnswering` (`qa_outputs` on the decoder reading the source shifted right, no decoder mask):
    the same start and end logits and loss on a right-padded batch with an answer cut off, the state dict back
    exactly; a head with other than two outputs is refused."""
    from transformers import T5ForQuestionAnswering

    from hfzoo import HfzooEncoderDecoderForQuestionAnswering

    torch.manual_seed(0)
    t5 = T5ForQuestionAnswering(t5_config("d48-l3x2-h3-kv12", "v1.1")).eval()
    with torch.no_grad():
        for name, param in t5.named_parameters():
            if "relative_attention_bias" in name or "qa_outputs" in name:
                param.normal_(0.0, 0.5)
    batch = padded_batch(131, "right")
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    positions = {"start_positions": torch.tensor([0, 3, 1, 0]), "end_positions": torch.tensor([5, 8, 30, 0])}
    model = t5_to_hfzoo(t5)
    assert isinstance(model, HfzooEncoderDecoderForQuestionAnswering)
    with torch.no_grad():
        expected, got = t5(**inputs, **positions), model(**inputs, **positions)
    for key in ("start_logits", "end_logits", "loss"):
        torch.testing.assert_close(got[key], expected[key], atol=TOLERANCE, rtol=TOLERANCE, msg=key)
    back = hfzoo_to_t5(model)
    assert type(back) is T5ForQuestionAnswering and back.config.to_diff_dict() == t5.config.to_diff_dict()
    assert sorted(back.state_dict()) == sorted(t5.state_dict())
    assert all(torch.equal(back.state_dict()[k], v) for k, v in t5.state_dict().items())
    three = T5ForQuestionAnswering(T5Config(**SIZES["d32-l2-h4"], num_labels=3, decoder_start_token_id=0))
    with pytest.raises(ValueError, match="qa_outputs.weight has 3 outputs .T5ForQuestionAnswering with num_labels=3"):
        t5_to_hfzoo(three)


@pytest.mark.compat
@pytest.mark.parametrize("version", ["v1.0", "v1.1"])
@pytest.mark.parametrize("head", ["ForTokenClassification", "EncoderModel"])
def test_t5_encoder_alone_and_its_token_classifier_convert_and_back_exactly(version, head):
    """`T5EncoderModel` and `T5ForTokenClassification` (no decoder; the classifier's body under `transformer.`): the
    same hidden states, or logits and loss (labels with -100 at padding), on a left- and a right-padded batch; the
    label set and classifier dropout carried; the state dict back exactly, and from state dicts by their keys."""
    import transformers

    from hfzoo import HfzooEncoderDecoderEncoderModel, HfzooEncoderDecoderForTokenClassification

    t5_class = getattr(transformers, f"T5{head}")
    ours_class = {"ForTokenClassification": HfzooEncoderDecoderForTokenClassification,
                  "EncoderModel": HfzooEncoderDecoderEncoderModel}[head]  # fmt: skip
    labels = {0: "O", 1: "B-PER", 2: "I-PER", 3: "B-LOC", 4: "I-LOC"}
    config = T5Config(**SIZES["d48-l3x2-h3-kv12"], **VERSIONS[version], dropout_rate=0.0, decoder_start_token_id=0,
                      num_labels=5, id2label=labels, classifier_dropout=0.2)  # fmt: skip
    torch.manual_seed(0)
    t5 = t5_class(config).eval()
    perturb(t5, "classifier")
    model = t5_to_hfzoo(t5)
    assert type(model) is ours_class and not any(".decoder." in f".{key}" for key in model.state_dict())
    for side in ("left", "right"):
        batch = padded_batch(131, side)
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        if head == "ForTokenClassification":
            inputs["labels"] = torch.randint(0, 5, (4, 12)).masked_fill(batch["attention_mask"] == 0, -100)
        with torch.no_grad():
            expected, got = t5(**inputs), model(**inputs)
        for key in ("logits", "loss") if head == "ForTokenClassification" else ("last_hidden_state",):
            real = batch["attention_mask"].bool() if key != "loss" else ...
            torch.testing.assert_close(got[key][real], expected[key][real], atol=TOLERANCE, rtol=TOLERANCE, msg=key)
    if head == "ForTokenClassification":
        assert model.config.id2label == labels and model.config.classifier_dropout == 0.2
    back = hfzoo_to_t5(model)
    assert type(back) is t5_class and back.config.to_diff_dict() == t5.config.to_diff_dict()
    assert sorted(back.state_dict()) == sorted(t5.state_dict())
    assert all(torch.equal(back.state_dict()[k], v) for k, v in t5.state_dict().items())
    assert type(t5_to_hfzoo(t5.state_dict(), config)) is ours_class
    assert type(hfzoo_to_t5(model.state_dict(), model.config)) is t5_class


def test_the_encoder_alone_and_its_token_classifier_load_from_a_pretrained_encoder_decoder(tmp_path):
    """From a pretrained language model's folder, without a warning about its decoder or head: the encoder's own
    states, and a new classifier on them."""
    from transformers import AutoModelForTokenClassification

    from hfzoo import HfzooEncoderDecoderEncoderModel, HfzooEncoderDecoderForTokenClassification

    pretrained = t5_to_hfzoo(random_t5("d48-l3x2-h3-kv12", "v1.1"))
    pretrained.save_pretrained(tmp_path / "lm")
    encoder, info = HfzooEncoderDecoderEncoderModel.from_pretrained(
        tmp_path / "lm", output_loading_info=True, attn_implementation="eager"
    )  # as the source
    assert not info["missing_keys"] and not info["unexpected_keys"]
    tagger, info = AutoModelForTokenClassification.from_pretrained(tmp_path / "lm", num_labels=3,
                                                                   output_loading_info=True,
                                                                   attn_implementation="eager")  # fmt: skip
    assert type(tagger) is HfzooEncoderDecoderForTokenClassification and not info["unexpected_keys"]
    assert sorted(info["missing_keys"]) == ["classifier.bias", "classifier.weight"]
    batch = padded_batch(131, "right")
    with torch.no_grad():
        expected = pretrained.model.encoder(batch["input_ids"], attention_mask=batch["attention_mask"])
        for model in (encoder.eval(), tagger.eval().model):
            got = model(batch["input_ids"], attention_mask=batch["attention_mask"])
            assert torch.equal(got.last_hidden_state, expected.last_hidden_state)


def test_cli_converts_a_t5_classifier_folder_and_back(tmp_path):
    """`hfzoo-convert` reads the classifier from `architectures` both ways (as `T5ForConditionalGeneration` its head
    would be dropped), converts the encoder alone, and refuses a folder lacking weights of the class it loads as."""
    from transformers import AutoModelForSequenceClassification, T5EncoderModel, T5ForSequenceClassification

    from hfzoo.convert.cli import main

    torch.manual_seed(0)
    t5 = T5ForSequenceClassification(t5_config("d32-l2-h4", "v1.1")).eval()
    source, converted, again = tmp_path / "t5", tmp_path / "hfzoo", tmp_path / "again"
    t5.save_pretrained(source)
    main(["--model_name_or_path", str(source), "--output_dir", str(converted)])
    assert type(AutoModelForSequenceClassification.from_pretrained(converted)).__name__ == (
        "HfzooEncoderDecoderForSequenceClassification"
    )
    main(["--model_name_or_path", str(converted), "--output_dir", str(again)])
    back = AutoModelForSequenceClassification.from_pretrained(again)
    assert type(back) is T5ForSequenceClassification
    assert all(torch.equal(back.state_dict()[k], v) for k, v in t5.state_dict().items())
    # a T5EncoderModel converts as the encoder alone (it loaded as T5ForConditionalGeneration, its decoder missing)
    encoder_only = tmp_path / "t5-encoder"
    T5EncoderModel(t5_config("d32-l2-h4", "v1.1")).save_pretrained(encoder_only)
    main(["--model_name_or_path", str(encoder_only), "--output_dir", str(tmp_path / "hfzoo-encoder")])
    config = json.loads((tmp_path / "hfzoo-encoder" / "config.json").read_text())
    assert config["architectures"] == ["HfzooEncoderDecoderEncoderModel"]
    # a folder whose config has more layers than its weights would get random ones: refused
    deeper = tmp_path / "t5-deeper"
    random_t5("d32-l2-h4", "v1.1").save_pretrained(deeper)
    config = json.loads((deeper / "config.json").read_text())
    (deeper / "config.json").write_text(json.dumps({**config, "num_decoder_layers": 3}))
    with pytest.raises(SystemExit, match=r"loaded as T5ForConditionalGeneration, \d+ of its weights are not in the "):
        main(["--model_name_or_path", str(deeper), "--output_dir", str(tmp_path / "refused")])
    assert not (tmp_path / "refused").exists()


def test_wrong_config_and_model_types_are_refused():
    with pytest.raises(TypeError, match="T5Config"):
        hfzoo_config_from_t5(HfzooEncoderDecoderConfig())
    with pytest.raises(TypeError, match="HfzooEncoderDecoderConfig"):
        t5_config_from_hfzoo(T5Config())
    with pytest.raises(TypeError, match="T5ForConditionalGeneration"):
        t5_to_hfzoo(torch.nn.Linear(2, 2))


@pytest.mark.parametrize(
    "preset, t5_fields",
    [
        ("t5-v1.0", dict(d_model=768, d_ff=3072, num_layers=12, num_heads=12, dropout_rate=0.1)),  # google-t5/t5-base
        (
            "t5-v1.1",  # google/t5-v1_1-base
            dict(
                d_model=768,
                d_ff=2048,
                num_layers=12,
                num_heads=12,
                dropout_rate=0.1,
                feed_forward_proj="gated-gelu",
                tie_word_embeddings=False,
            ),
        ),
    ],
)
def test_t5_presets_are_t5_base_with_t5s_parameter_count(preset, t5_fields):
    config = build_config(preset)
    reference = hfzoo_config_from_t5(T5Config(**t5_fields))
    assert config.to_dict() == reference.to_dict()
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        ours = HfzooEncoderDecoderForConditionalGeneration(config)
        theirs = T5ForConditionalGeneration(T5Config(**t5_fields))
    if not config.tie_word_embeddings:  # transformers 5 builds T5 tied; a v1.1 checkpoint has its own lm_head
        theirs.lm_head.weight = torch.nn.Parameter(torch.empty_like(theirs.lm_head.weight))
    count = sum(p.numel() for p in ours.parameters())
    assert count == sum(p.numel() for p in theirs.parameters())
    print(f"\n{preset}: {count / 1e6:.1f}M parameters")
