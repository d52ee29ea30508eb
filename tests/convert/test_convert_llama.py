"""Llama / Qwen3 / Mistral (transformers' native classes) <-> hfzoo decoder: logit and generation parity both ways,
exact round trips, a native folder that plain transformers loads without hfzoo, the CLI, and refusals."""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from hfzoo import HfzooDecoderConfig, HfzooDecoderForCausalLM
from hfzoo.convert import (
    gpt2_config_from_hfzoo,
    hfzoo_config_from_llama,
    hfzoo_to_llama,
    llama_config_from_hfzoo,
    llama_to_hfzoo,
)
from hfzoo.convert.cli import main
from hfzoo.models.presets import build_config

VOCAB = 97
TINY = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rope_parameters={"rope_type": "default", "rope_theta": 500.0},
    rms_norm_eps=1e-5,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
)
# (config class, model class, extra fields): each native class with what it adds to Llama's shape.
NATIVE = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "llama-biases-tied": (
        LlamaConfig,
        LlamaForCausalLM,
        dict(attention_bias=True, mlp_bias=True, tie_word_embeddings=True),
    ),  # noqa: E501
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, dict(head_dim=16, tie_word_embeddings=True)),
    "mistral": (MistralConfig, MistralForCausalLM, dict(sliding_window=4)),  # shorter than the batch: it binds
}
TOLERANCE = 1e-5


def random_native(kind: str, seed: int = 0):
    """A native model built by transformers, every parameter random at a scale where a layout mistake shows."""
    config_class, model_class, extra = NATIVE[kind]
    torch.manual_seed(seed)
    model = model_class(config_class(**TINY, **extra)).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.uniform_(0.5, 1.5)
            else:
                parameter.normal_(0.0, 0.3)
    return model


def left_padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (2, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    return ids.masked_fill(mask == 0, 0), mask


def logits(model, ids, mask) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask).logits[mask.bool()]


def greedy(model, ids, mask) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, pad_token_id=0)


@pytest.mark.compat
@pytest.mark.parametrize("kind", list(NATIVE))
def test_native_to_hfzoo_to_native_keeps_logits_generation_and_weights(kind):
    native = random_native(kind)
    ids, mask = left_padded_batch()
    model = llama_to_hfzoo(native)
    assert isinstance(model, HfzooDecoderForCausalLM)
    torch.testing.assert_close(logits(model, ids, mask), logits(native, ids, mask), atol=TOLERANCE, rtol=TOLERANCE)
    expected = greedy(native, ids, mask)
    assert torch.equal(greedy(model, ids, mask), expected)
    back = hfzoo_to_llama(model)
    assert type(back) is type(native)
    assert back.config.to_diff_dict() == native.config.to_diff_dict()
    state = native.state_dict()
    assert list(back.state_dict()) == list(state)
    assert all(torch.equal(back.state_dict()[key], value) for key, value in state.items())
    torch.testing.assert_close(logits(back, ids, mask), logits(native, ids, mask), atol=TOLERANCE, rtol=TOLERANCE)
    assert torch.equal(greedy(back, ids, mask), expected)


@pytest.mark.compat
@pytest.mark.parametrize("preset, native_class", [("llama-tiny", LlamaForCausalLM), ("qwen3-tiny", Qwen3ForCausalLM),
                                                  ("mistral-tiny", MistralForCausalLM)])  # fmt: skip
def test_hfzoo_presets_convert_to_their_native_class_and_back(preset, native_class):
    torch.manual_seed(0)
    model = HfzooDecoderForCausalLM(build_config(preset, vocab_size=VOCAB, pad_token_id=0)).eval()
    ids, mask = left_padded_batch()
    native = hfzoo_to_llama(model)
    assert type(native) is native_class
    torch.testing.assert_close(logits(native, ids, mask), logits(model, ids, mask), atol=TOLERANCE, rtol=TOLERANCE)
    assert torch.equal(greedy(native, ids, mask), greedy(model, ids, mask))
    again = llama_to_hfzoo(native).state_dict()
    assert all(torch.equal(again[key], value) for key, value in model.state_dict().items())


def test_parity_check_is_sensitive_to_a_layout_mistake():
    """Swapping a layer's two norms (the only renamed tensors) changes the logits beyond the tolerance."""
    native = random_native("qwen3")
    state = dict(native.state_dict())
    first, second = "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight"
    state[first], state[second] = state[second], state[first]
    wrong = llama_to_hfzoo(state, native.config)
    ids, mask = left_padded_batch()
    assert not torch.allclose(logits(wrong, ids, mask), logits(native, ids, mask), atol=1e-3)


def test_mistral_window_and_qwen3_qk_norm_map_to_hfzoo_fields():
    mistral = hfzoo_config_from_llama(MistralConfig(**TINY, sliding_window=4))
    assert (mistral.token_mixer, mistral.attention_window) == ("sliding_window", 6)  # itself + 3 before it
    assert hfzoo_config_from_llama(MistralConfig(**TINY, sliding_window=None)).token_mixer == "self_attention"
    qwen3 = hfzoo_config_from_llama(Qwen3Config(**TINY, head_dim=16))
    assert (qwen3.qk_norm, qwen3.qk_norm_learnable_scale, qwen3.head_dim) == ("rms_norm", True, 16)
    llama = hfzoo_config_from_llama(LlamaConfig(**TINY))
    assert (llama.rope_theta, llama.rms_norm_eps, llama.num_key_value_heads) == (500.0, 1e-5, 2)
    assert (llama.position_embedding_type, llama.norm_type, llama.gated_mlp, llama.hidden_act) == (
        "rotary", "rms_norm", True, "silu",
    )  # fmt: skip


def test_every_field_that_does_not_map_is_refused_in_one_message_before_any_work():
    fields = dict(
        norm_position="post",
        position_embedding_type="alibi",
        rope_theta=10000.0,
        gated_mlp=False,
        num_experts=4,
        final_logit_softcapping=30.0,
        hidden_dropout_prob=0.1,
        scale_attention_scores=False,
    )
    config = build_config("llama-tiny", vocab_size=VOCAB, **fields)
    with pytest.raises(ValueError) as refused:
        hfzoo_to_llama({}, config)  # the config is refused before the (empty) state dict is read
    message = str(refused.value)
    assert "to Llama" in message
    for name, value in fields.items():
        if name != "rope_theta":  # at its default: maps
            assert f"{name}={value!r}" in message, name
    assert "rope_theta" not in message and "num_key_value_heads" not in message
    # per class: what Llama has and Qwen3 / Mistral lack
    with pytest.raises(ValueError, match=r"to Qwen3 .*mlp_bias=True \(needs False\)"):
        llama_config_from_hfzoo(build_config("qwen3-tiny", mlp_bias=True))
    with pytest.raises(ValueError, match=r"to Mistral .*attention_bias=True \(needs False\), mlp_bias=True"):
        llama_config_from_hfzoo(build_config("mistral-tiny", attention_bias=True, mlp_bias=True))
    assert isinstance(llama_config_from_hfzoo(build_config("llama-tiny", attention_bias=True, mlp_bias=True)),
                      LlamaConfig)  # fmt: skip
    with pytest.raises(ValueError, match="qk_norm='rms_norm' with token_mixer='sliding_window'"):
        llama_config_from_hfzoo(build_config("mistral-tiny", qk_norm="rms_norm"))


def test_native_settings_hfzoo_cannot_express_are_refused_together():
    llama3 = LlamaConfig(**{**TINY, "rope_parameters": {"rope_type": "linear", "rope_theta": 500.0, "factor": 2.0}},
                         hidden_act="gelu_pytorch_tanh_not_an_activation_of_hfzoo")  # fmt: skip
    with pytest.raises(ValueError, match=r"rope_type'\]='linear'.*hidden_act='gelu_pytorch_tanh_not_an"):
        hfzoo_config_from_llama(llama3)
    with pytest.raises(ValueError, match="use_sliding_window=True"):
        hfzoo_config_from_llama(Qwen3Config(**TINY, head_dim=16, use_sliding_window=True, max_window_layers=0))
    with pytest.raises(TypeError, match="expected a LlamaConfig, Qwen3Config or MistralConfig"):
        hfzoo_config_from_llama(HfzooDecoderConfig())
    with pytest.raises(TypeError, match="expected an HfzooDecoderConfig"):
        llama_config_from_hfzoo(LlamaConfig(**TINY))


def test_state_dict_inputs_and_key_errors():
    native = random_native("llama-biases-tied")
    state = {k: v for k, v in native.state_dict().items() if k != "lm_head.weight"}  # tied: may be left out
    from_state = llama_to_hfzoo(state, native.config)
    assert all(torch.equal(from_state.state_dict()[k], v) for k, v in llama_to_hfzoo(native).state_dict().items())
    with pytest.raises(TypeError, match="needs its config"):
        llama_to_hfzoo(state)
    with pytest.raises(ValueError, match=r"missing \['model.layers.1.mlp.up_proj.bias'\]"):
        llama_to_hfzoo({k: v for k, v in state.items() if k != "model.layers.1.mlp.up_proj.bias"}, native.config)
    with pytest.raises(ValueError, match=r"unexpected \['model.layers.0.self_attn.q_norm.weight'\]"):
        llama_to_hfzoo({**state, "model.layers.0.self_attn.q_norm.weight": torch.ones(8)}, native.config)


def test_other_converters_refuse_grouped_query_attention():
    config = HfzooDecoderConfig(vocab_size=VOCAB, hidden_size=32, num_attention_heads=4, num_key_value_heads=2)
    with pytest.raises(ValueError, match="num_key_value_heads=2 cannot be converted to GPT-2"):
        gpt2_config_from_hfzoo(config)


@pytest.mark.parametrize("preset, total", [("smollm2-135m", 134_515_008), ("qwen3-0.6b", 596_049_920)])
def test_published_shapes_have_the_native_parameter_count(preset, total):
    """SmolLM2-135M and Qwen3-0.6B: the hfzoo preset and the native class built from it count the same parameters,
    and that is the closed form `V h + L (h (2 H + 2 K) d + 3 h f + 2 h [+ 2 d QK-norm]) + h` (tied)."""
    config = build_config(preset)
    with torch.device("meta"):
        hfzoo_count = HfzooDecoderForCausalLM(config).num_parameters()
        native_count = AutoModelForCausalLM.from_config(llama_config_from_hfzoo(config)).num_parameters()
    h, d, f = config.hidden_size, config.head_dim, config.intermediate_size
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    qk_norm = 2 * d if config.qk_norm else 0
    layer = h * (2 * heads + 2 * kv_heads) * d + 3 * h * f + 2 * h + qk_norm
    assert hfzoo_count == native_count == config.vocab_size * h + config.num_hidden_layers * layer + h == total


LOAD_WITHOUT_HFZOO = textwrap.dedent(
    """
    import json, sys
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder, ids = sys.argv[1], json.loads(sys.argv[2])
    model = AutoModelForCausalLM.from_pretrained(folder).eval()  # no trust_remote_code
    tokenizer = AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        logits = model(torch.tensor(ids)).logits
    print(json.dumps({
        "class": type(model).__name__,
        "logits": logits.tolist(),
        "tokens": tokenizer("a b")["input_ids"],
        "max_new_tokens": GenerationConfig.from_pretrained(folder).max_new_tokens,
        "hfzoo_imported": any(name.split(".")[0] == "hfzoo" for name in sys.modules),
    }))
    """
)


def test_cli_round_trip_and_the_native_folder_loads_without_hfzoo(tmp_path, tokenizer_dir, clean_python):
    from transformers import AutoTokenizer

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = build_config("llama-tiny", vocab_size=len(tokenizer), tie_word_embeddings=True)
    model = HfzooDecoderForCausalLM(config).eval()
    model.generation_config = GenerationConfig(max_new_tokens=17, do_sample=False)
    source, native_dir, again = tmp_path / "hfzoo", tmp_path / "native", tmp_path / "again"
    model.save_pretrained(source)
    tokenizer.save_pretrained(source)
    main(["--model_name_or_path", str(source), "--output_dir", str(native_dir)])
    saved = json.loads((native_dir / "config.json").read_text())
    assert (saved["model_type"], saved["architectures"]) == ("llama", ["LlamaForCausalLM"])
    assert "auto_map" not in saved and (native_dir / "model.safetensors").is_file()
    ids = torch.randint(0, len(tokenizer), (1, 9)).tolist()
    result = subprocess.run(
        [str(clean_python), "-c", LOAD_WITHOUT_HFZOO, str(native_dir), json.dumps(ids)],
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert loaded["class"] == "LlamaForCausalLM" and not loaded["hfzoo_imported"]
    assert loaded["tokens"] == tokenizer("a b")["input_ids"] and loaded["max_new_tokens"] == 17
    with torch.no_grad():
        expected = model(torch.tensor(ids)).logits
    torch.testing.assert_close(torch.tensor(loaded["logits"]), expected, atol=TOLERANCE, rtol=TOLERANCE)
    # and back: the native folder converts to an hfzoo decoder with the same weights
    main(["--model_name_or_path", str(native_dir), "--output_dir", str(again)])
    back = HfzooDecoderForCausalLM.from_pretrained(again)
    assert back.config.num_key_value_heads == config.num_key_value_heads
    assert all(torch.equal(back.state_dict()[k], v) for k, v in model.state_dict().items())
    assert AutoTokenizer.from_pretrained(again)("a b")["input_ids"] == tokenizer("a b")["input_ids"]


HEADS = ("ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering")


def native_head(kind: str, head: str, **fields):
    """The native task head of `kind`'s family (`LlamaForTokenClassification`, ...), random parameters."""
    import transformers

    config_class, model_class, extra = NATIVE[kind]
    head_class = getattr(transformers, model_class.__name__.replace("ForCausalLM", head))
    torch.manual_seed(0)
    model = head_class(config_class(**TINY, **extra, num_labels=3, **fields)).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.3)
    return model


def head_outputs(model, ids, mask, head: str) -> dict[str, torch.Tensor]:
    """The head's logits and loss on a right-padded batch (the classifier pools the last non-padding token)."""
    if head == "ForSequenceClassification":
        targets = {"labels": torch.tensor([0, 2])}
    elif head == "ForTokenClassification":
        targets = {
            "labels": torch.randint(0, 3, ids.shape, generator=torch.Generator().manual_seed(2)).masked_fill(
                mask == 0, -100
            )
        }
    else:
        targets = {"start_positions": torch.tensor([1, 4]), "end_positions": torch.tensor([3, 20])}  # 20: cut off
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, **targets)
    return {key: value for key, value in out.items() if key in ("loss", "logits", "start_logits", "end_logits")}


@pytest.mark.compat
@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("kind", ["llama", "qwen3", "mistral"])
def test_native_task_heads_convert_to_the_hfzoo_heads_and_back_exactly(kind, head):
    """transformers' generic decoder heads (Llama's, Qwen3's, Mistral's; the span heads of Llama and Qwen3 keep their
    body under `transformer.`): the same logits and loss, the label set carried, the state dict back exactly."""
    native = native_head(kind, head, id2label={0: "neg", 1: "neu", 2: "pos"}, classifier_dropout=0.25)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (2, 12), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    model = llama_to_hfzoo(native)
    assert type(model).__name__ == f"HfzooDecoder{head}"
    assert model.config.id2label == {0: "neg", 1: "neu", 2: "pos"} and model.config.classifier_dropout == 0.25
    expected = head_outputs(native, ids, mask, head)
    got = head_outputs(model, ids, mask, head)
    assert got.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], atol=TOLERANCE, rtol=TOLERANCE, msg=key)
    back = hfzoo_to_llama(model)
    assert type(back) is type(native)
    assert back.config.to_diff_dict() == native.config.to_diff_dict()
    assert list(back.state_dict()) == list(native.state_dict())
    assert all(torch.equal(back.state_dict()[key], value) for key, value in native.state_dict().items())
    # a state dict picks its head from its keys, either way
    from_state = llama_to_hfzoo(native.state_dict(), native.config)
    assert type(from_state) is type(model)
    assert type(hfzoo_to_llama(model.state_dict(), model.config)) is type(native)

    class Finetuned(type(model)):  # a subclass (a user's own head class) converts as the class it extends
        pass

    subclassed = Finetuned(model.config)
    subclassed.load_state_dict(model.state_dict())
    assert type(hfzoo_to_llama(subclassed)) is type(native)


def test_cli_converts_a_native_classifier_folder_and_back_keeping_its_head(tmp_path):
    """A finetuned Qwen3 classifier folder (a reward model's shape) becomes the hfzoo decoder's classifier, not a
    language model without its `score`; a head the conversion has no counterpart for is refused."""
    from transformers import AutoModelForSequenceClassification, GPT2Config, GPT2DoubleHeadsModel

    native = native_head("qwen3", "ForSequenceClassification")
    source, hfzoo_dir, again = tmp_path / "native", tmp_path / "hfzoo", tmp_path / "again"
    native.save_pretrained(source)
    main(["--model_name_or_path", str(source), "--output_dir", str(hfzoo_dir)])
    assert json.loads((hfzoo_dir / "config.json").read_text())["architectures"] == [
        "HfzooDecoderForSequenceClassification"
    ]
    model = AutoModelForSequenceClassification.from_pretrained(hfzoo_dir).eval()
    ids = torch.randint(3, VOCAB, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, native(ids).logits, atol=TOLERANCE, rtol=TOLERANCE)
    main(["--model_name_or_path", str(hfzoo_dir), "--output_dir", str(again)])
    assert json.loads((again / "config.json").read_text())["architectures"] == ["Qwen3ForSequenceClassification"]
    reloaded = AutoModelForSequenceClassification.from_pretrained(again)
    assert all(torch.equal(reloaded.state_dict()[k], v) for k, v in native.state_dict().items())

    # GPT-2's language model with a multiple-choice head loaded as GPT2LMHeadModel without a word: it lost the head
    double_heads = tmp_path / "gpt2-double-heads"
    GPT2DoubleHeadsModel(GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=1, n_head=2)).save_pretrained(double_heads)
    with pytest.raises(SystemExit, match="GPT2DoubleHeadsModel is a task head the GPT-2 conversion has no"):
        main(["--model_name_or_path", str(double_heads), "--output_dir", str(tmp_path / "refused")])
    assert not (tmp_path / "refused").exists()


def test_cli_refuses_a_rotary_decoder_that_does_not_map_naming_every_field(tmp_path, capsys):
    source = tmp_path / "hfzoo"
    config = build_config("llama-tiny", vocab_size=VOCAB, norm_position="post", unet_skips=True)
    HfzooDecoderForCausalLM(config).save_pretrained(source)
    with pytest.raises(SystemExit, match=r"norm_position='post' \(needs 'pre'\), unet_skips=True \(needs False\)"):
        main(["--model_name_or_path", str(source), "--output_dir", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_cli_refuses_to_convert_a_folder_into_itself(tmp_path, capsys):
    source = tmp_path / "hfzoo"
    HfzooDecoderForCausalLM(build_config("llama-tiny", vocab_size=VOCAB)).save_pretrained(source)
    before = {f.name: f.read_bytes() for f in source.iterdir()}
    with pytest.raises(SystemExit) as exit_info:
        main(["--model_name_or_path", str(source), "--output_dir", f"{tmp_path}/./hfzoo"])
    assert exit_info.value.code == 2
    assert (
        f"--output_dir {tmp_path}/./hfzoo is the --model_name_or_path folder: the converted weights"
        in capsys.readouterr().err
    )
    assert {f.name: f.read_bytes() for f in source.iterdir()} == before  # the source is untouched
