"""GPT-2 <-> hfzoo decoder conversion: logit parity with padding, exact weight round trip, configs, preset."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, GPT2Model

from hfzoo import HfzooDecoderConfig, HfzooDecoderForCausalLM
from hfzoo.convert import gpt2_config_from_hfzoo, gpt2_to_hfzoo, hfzoo_config_from_gpt2, hfzoo_to_gpt2
from hfzoo.models.presets import build_config

# Two tiny GPT-2 sizes; dropout 0 so that train/eval make no difference.
SIZES = {
    "h32-l2-a4": dict(vocab_size=97, n_embd=32, n_layer=2, n_head=4, n_positions=64),
    "h48-l3-a6": dict(vocab_size=131, n_embd=48, n_layer=3, n_head=6, n_positions=40, n_inner=80),
}
TOLERANCE = 1e-4

# The fields both configs describe (GPT-2 name, hfzoo name).
MAPPED_FIELDS = [
    ("vocab_size", "vocab_size"),
    ("n_embd", "hidden_size"),
    ("n_layer", "num_hidden_layers"),
    ("n_head", "num_attention_heads"),
    ("n_positions", "max_position_embeddings"),
    ("activation_function", "hidden_act"),
    ("layer_norm_epsilon", "layer_norm_eps"),
    ("resid_pdrop", "hidden_dropout_prob"),
    ("attn_pdrop", "attention_probs_dropout_prob"),
    ("initializer_range", "initializer_range"),
    ("tie_word_embeddings", "tie_word_embeddings"),
    ("use_cache", "use_cache"),
    ("bos_token_id", "bos_token_id"),
    ("eos_token_id", "eos_token_id"),
    ("pad_token_id", "pad_token_id"),
]


def gpt2_config(size: str, **overrides) -> GPT2Config:
    fields = SIZES[size]
    return GPT2Config(
        **{
            **fields,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "attn_pdrop": 0.0,
            "bos_token_id": fields["vocab_size"] - 1,
            "eos_token_id": fields["vocab_size"] - 1,
            **overrides,
        }
    )


def random_gpt2(size: str, seed: int = 0, **overrides) -> GPT2LMHeadModel:
    """A GPT-2 whose every parameter is random at a scale where a layout mistake changes the logits.

    GPT-2's own init (std 0.02, unit/zero layer norms) makes attention nearly uniform and the norms
    interchangeable, which would hide e.g. a q/k swap or an ln_1/ln_2 swap.
    """
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(gpt2_config(size, **overrides))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".ln_" in name and name.endswith("weight"):
                param.copy_(1 + 0.3 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.copy_(0.3 * torch.randn_like(param))
            else:
                param.normal_(0.0, 0.25)
    model.set_attn_implementation("eager")
    return model.eval()


def padded_batch(vocab_size: int, side: str, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """`(input_ids, attention_mask)` of shape `(4, 12)`: rows of 12, 9, 5 and 1 real tokens."""
    generator = torch.Generator().manual_seed(seed)
    lengths, seq_len = [12, 9, 5, 1], 12
    ids = torch.randint(0, vocab_size, (len(lengths), seq_len), generator=generator)
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        if side == "right":
            mask[row, :length] = 1
        else:
            mask[row, seq_len - length :] = 1
    ids = ids.masked_fill(mask == 0, vocab_size - 1)  # padding token, as a tokenizer would put
    return ids, mask


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("backend", ["eager", "sdpa"])
@pytest.mark.parametrize("size", list(SIZES))
def test_gpt2_to_hfzoo_logits_match_with_padding(size, backend, side):
    gpt2 = random_gpt2(size)
    model = gpt2_to_hfzoo(gpt2, attn_implementation=backend)
    assert isinstance(model, HfzooDecoderForCausalLM)
    assert model.config._attn_implementation == backend
    ids, mask = padded_batch(gpt2.config.vocab_size, side)
    # Left padding: positions counted from the first real token (as generate() does); right: default.
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0) if side == "left" else None
    with torch.no_grad():
        expected = gpt2(ids, attention_mask=mask, position_ids=position_ids).logits
        actual = model(ids, attention_mask=mask, position_ids=position_ids).logits
    real = mask.bool()
    assert expected.dtype == actual.dtype == torch.float32
    assert torch.isfinite(actual[real]).all()
    diff = (actual[real] - expected[real]).abs().max().item()
    print(f"\n{size} {backend} {side}-padded: max |logit diff| = {diff:.3e} (logit std {expected[real].std():.2f})")
    assert expected[real].std() > 0.5  # the logits are far from trivial
    assert diff <= TOLERANCE


def test_parity_check_is_sensitive_to_a_layout_mistake():
    gpt2 = random_gpt2("h32-l2-a4")
    model = gpt2_to_hfzoo(gpt2, attn_implementation="eager")
    attn = model.model.layers[1].self_attn
    with torch.no_grad():  # swap queries and keys of one layer: what a wrong c_attn split would do
        q, k = attn.q_proj.weight.clone(), attn.k_proj.weight.clone()
        attn.q_proj.weight.copy_(k)
        attn.k_proj.weight.copy_(q)
    ids, mask = padded_batch(gpt2.config.vocab_size, "right")
    with torch.no_grad():
        diff = (model(ids, attention_mask=mask).logits - gpt2(ids, attention_mask=mask).logits)[mask.bool()]
    assert diff.abs().max() > 100 * TOLERANCE


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("tied", [True, False])
def test_round_trip_gives_the_original_state_dict_exactly(size, tied):
    gpt2 = random_gpt2(size, tie_word_embeddings=tied)
    original = gpt2.state_dict()
    back = hfzoo_to_gpt2(gpt2_to_hfzoo(gpt2))
    assert isinstance(back, GPT2LMHeadModel)
    state = back.state_dict()
    assert list(state) == list(original)
    for key, value in original.items():
        assert state[key].dtype == value.dtype and state[key].shape == value.shape, key
        assert torch.equal(state[key], value), key
    assert (back.lm_head.weight is back.transformer.wte.weight) == tied
    # and the other way round
    model = gpt2_to_hfzoo(gpt2)
    again = gpt2_to_hfzoo(hfzoo_to_gpt2(model)).state_dict()
    assert list(again) == list(model.state_dict())
    assert all(torch.equal(again[key], value) for key, value in model.state_dict().items())


def test_bfloat16_round_trip_keeps_dtype_and_values():
    gpt2 = random_gpt2("h48-l3-a6").to(torch.bfloat16)
    model = gpt2_to_hfzoo(gpt2)
    assert model.dtype == torch.bfloat16
    back = hfzoo_to_gpt2(model).state_dict()
    assert all(back[k].dtype == torch.bfloat16 and torch.equal(back[k], v) for k, v in gpt2.state_dict().items())


@pytest.mark.compat
def test_greedy_generation_with_kv_cache_matches():
    gpt2 = random_gpt2("h32-l2-a4")
    model = gpt2_to_hfzoo(gpt2, attn_implementation="sdpa")
    ids, mask = padded_batch(gpt2.config.vocab_size, "left")
    kwargs = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=gpt2.config.vocab_size - 1)
    with torch.no_grad():
        expected = gpt2.generate(ids, **kwargs)
        actual = model.generate(ids, **kwargs)
    assert torch.equal(actual, expected)


def test_state_dict_input_without_prefix_or_head_and_key_errors():
    gpt2 = random_gpt2("h32-l2-a4")
    base = GPT2Model(gpt2.config)
    base.load_state_dict(gpt2.transformer.state_dict())
    # An OpenAI-style checkpoint: no "transformer." prefix, no lm_head, legacy mask buffers.
    state = {**base.state_dict(), "h.0.attn.bias": torch.ones(1, 1, 64, 64)}
    from_state = gpt2_to_hfzoo(state, gpt2.config)
    from_model = gpt2_to_hfzoo(gpt2)
    assert all(torch.equal(from_state.state_dict()[k], v) for k, v in from_model.state_dict().items())
    assert torch.equal(gpt2_to_hfzoo(base).lm_head.weight, gpt2.lm_head.weight)
    from_hfzoo_config = gpt2_to_hfzoo(state, hfzoo_config_from_gpt2(gpt2.config))
    assert all(torch.equal(from_hfzoo_config.state_dict()[k], v) for k, v in from_model.state_dict().items())
    back = hfzoo_to_gpt2(from_model.state_dict(), from_model.config)
    assert all(torch.equal(back.state_dict()[k], v) for k, v in gpt2.state_dict().items())
    with pytest.raises(TypeError, match="needs its config"):
        gpt2_to_hfzoo(state)
    with pytest.raises(ValueError, match=r"missing \['h.1.mlp.c_fc.bias'\]"):
        gpt2_to_hfzoo({k: v for k, v in state.items() if k != "h.1.mlp.c_fc.bias"}, gpt2.config)
    with pytest.raises(ValueError, match=r"unexpected \['h.2.ln_1.weight'\]"):
        gpt2_to_hfzoo({**state, "h.2.ln_1.weight": state["h.1.ln_1.weight"]}, gpt2.config)
    with pytest.raises(ValueError, match="differs from 'wte.weight'"):
        gpt2_to_hfzoo({**state, "lm_head.weight": torch.zeros_like(state["wte.weight"])}, gpt2.config)
    with pytest.raises(ValueError, match="no 'lm_head.weight'"):
        gpt2_to_hfzoo(state, gpt2_config("h32-l2-a4", tie_word_embeddings=False))


@pytest.mark.parametrize("size", list(SIZES))
def test_config_round_trip(size):
    original = gpt2_config(
        size, layer_norm_epsilon=1e-6, activation_function="relu", resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.2
    )
    config = hfzoo_config_from_gpt2(original)
    assert isinstance(config, HfzooDecoderConfig)
    assert config.intermediate_size == (original.n_inner or 4 * original.n_embd)
    assert config.head_dim == original.n_embd // original.n_head
    back = gpt2_config_from_hfzoo(config)
    for gpt2_name, hfzoo_name in MAPPED_FIELDS:
        assert getattr(back, gpt2_name) == getattr(original, gpt2_name) == getattr(config, hfzoo_name), gpt2_name
    assert back.n_inner == original.n_inner
    assert back.to_diff_dict() == original.to_diff_dict()
    # GPT-2's own default config
    assert gpt2_config_from_hfzoo(hfzoo_config_from_gpt2(GPT2Config())).to_diff_dict() == GPT2Config().to_diff_dict()


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (dict(norm_position="post"), "norm_position"),
        (dict(norm_type="rms_norm"), "norm_type"),
        (dict(position_embedding_type="sinusoidal"), "position_embedding_type"),
        (dict(position_embedding_type="none"), "position_embedding_type"),
        (dict(head_dim=16), "head_dim"),
        (dict(attention_bias=False), "attention_bias"),
        (dict(mlp_bias=False), "mlp_bias"),
    ],
)
def test_hfzoo_settings_gpt2_cannot_express_are_refused(overrides, field):
    config = HfzooDecoderConfig(
        vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, **overrides
    )
    with pytest.raises(ValueError, match=f"^{field}="):
        gpt2_config_from_hfzoo(config)
    with pytest.raises(ValueError, match=f"^{field}="):
        hfzoo_to_gpt2(HfzooDecoderForCausalLM(config))


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (dict(add_cross_attention=True), "add_cross_attention"),
        (dict(scale_attn_weights=False), "scale_attn_weights"),
        (dict(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx"),
        (dict(embd_pdrop=0.1), "embd_pdrop"),
        (dict(bos_token_id=50256), "bos_token_id"),
    ],
)
def test_gpt2_settings_hfzoo_cannot_express_are_refused(overrides, field):
    with pytest.raises(ValueError, match=field):
        hfzoo_config_from_gpt2(gpt2_config("h32-l2-a4", **overrides))


@pytest.mark.compat
@pytest.mark.parametrize("head", ["ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering"])
def test_gpt2_task_heads_convert_to_the_hfzoo_heads_and_back_exactly(head):
    """GPT-2's classifiers and span head: the same logits and loss (the sequence classifier pools each row's last
    non-padding token), the label set and classifier dropout carried, the state dict back exactly, also from a
    state dict (its head read from its keys); the token classifier's `classifier` is hfzoo's `score`."""
    import transformers

    gpt2_class = getattr(transformers, f"GPT2{head}")
    torch.manual_seed(0)
    config = gpt2_config("h32-l2-a4", num_labels=3, id2label={0: "a", 1: "b", 2: "c"}, pad_token_id=96,
                         classifier_dropout=0.2)  # fmt: skip
    gpt2 = gpt2_class(config).eval()
    with torch.no_grad():
        for parameter in gpt2.parameters():
            parameter.normal_(0.0, 0.25)
    ids, mask = padded_batch(97, "right")
    targets = {
        "ForSequenceClassification": {"labels": torch.tensor([0, 2, 1, 1])},
        "ForTokenClassification": {"labels": torch.randint(0, 3, ids.shape).masked_fill(mask == 0, -100)},
        "ForQuestionAnswering": {"start_positions": torch.tensor([0, 2, 1, 0]), "end_positions": torch.tensor([5, 30, 3, 0])},
    }[head]  # fmt: skip
    model = gpt2_to_hfzoo(gpt2)
    assert type(model).__name__ == f"HfzooDecoder{head}"
    assert model.config.id2label == config.id2label and model.config.classifier_dropout == 0.2
    with torch.no_grad():
        expected, got = gpt2(ids, attention_mask=mask, **targets), model(ids, attention_mask=mask, **targets)
    for key in ("loss", "logits", "start_logits", "end_logits"):
        if key in expected:
            torch.testing.assert_close(got[key], expected[key], atol=TOLERANCE, rtol=TOLERANCE, msg=key)
    back = hfzoo_to_gpt2(model)
    assert type(back) is gpt2_class and back.config.to_diff_dict() == gpt2.config.to_diff_dict()
    assert list(back.state_dict()) == list(gpt2.state_dict())
    assert all(torch.equal(back.state_dict()[k], v) for k, v in gpt2.state_dict().items())
    assert type(gpt2_to_hfzoo(gpt2.state_dict(), config)) is type(model)
    assert type(hfzoo_to_gpt2(model.state_dict(), model.config)) is gpt2_class


def test_cli_converts_a_gpt2_token_classifier_folder_and_back(tmp_path):
    """`hfzoo-convert` reads the head from the folder's `architectures` (loading it as `GPT2LMHeadModel` would drop
    the classifier): the hfzoo folder loads with `AutoModelForTokenClassification` and converts back exactly."""
    from transformers import AutoModelForTokenClassification, GPT2ForTokenClassification

    from hfzoo.convert.cli import main

    torch.manual_seed(0)
    gpt2 = GPT2ForTokenClassification(gpt2_config("h32-l2-a4", num_labels=4)).eval()
    source, converted, again = tmp_path / "gpt2", tmp_path / "hfzoo", tmp_path / "again"
    gpt2.save_pretrained(source)
    main(["--model_name_or_path", str(source), "--output_dir", str(converted)])
    model = AutoModelForTokenClassification.from_pretrained(converted).eval()
    assert type(model).__name__ == "HfzooDecoderForTokenClassification"
    ids = torch.randint(0, 96, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, gpt2(ids).logits, atol=TOLERANCE, rtol=TOLERANCE)
    main(["--model_name_or_path", str(converted), "--output_dir", str(again)])
    back = AutoModelForTokenClassification.from_pretrained(again)
    assert type(back) is GPT2ForTokenClassification
    assert all(torch.equal(back.state_dict()[k], v) for k, v in gpt2.state_dict().items())


def test_wrong_config_and_model_types_are_refused():
    with pytest.raises(TypeError, match="GPT2Config"):
        hfzoo_config_from_gpt2(HfzooDecoderConfig())
    with pytest.raises(TypeError, match="HfzooDecoderConfig"):
        gpt2_config_from_hfzoo(GPT2Config())
    with pytest.raises(TypeError):
        gpt2_to_hfzoo(HfzooDecoderForCausalLM(HfzooDecoderConfig(vocab_size=11, hidden_size=8, num_attention_heads=2)))


def test_gpt2_preset_is_gpt2_small():
    preset = build_config("gpt2")
    converted = hfzoo_config_from_gpt2(GPT2Config())
    architecture = [
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "head_dim",
        "intermediate_size",
        "hidden_act",
        "max_position_embeddings",
        "position_embedding_type",
        "norm_type",
        "norm_position",
        "layer_norm_eps",
        "attention_bias",
        "mlp_bias",
        "tie_word_embeddings",
    ]
    for name in architecture:
        assert getattr(preset, name) == getattr(converted, name), name
    with torch.device("meta"):
        ours = HfzooDecoderForCausalLM(preset)
        theirs = GPT2LMHeadModel(GPT2Config())
    n_ours = sum(p.numel() for p in ours.parameters())  # parameters() counts tied weights once
    n_theirs = sum(p.numel() for p in theirs.parameters())
    print(f"\ngpt2 preset: {n_ours:,} parameters; GPT2LMHeadModel(GPT2Config()): {n_theirs:,}")
    assert n_ours == n_theirs == 124_439_808
