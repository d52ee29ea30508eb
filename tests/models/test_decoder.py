"""Decoder family: causality, cache, backends, save/load, variants, config validation."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
from huggingface_hub.errors import StrictDataclassClassValidationError
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, PreTrainedModel

from hfzoo import HfzooDecoderConfig, HfzooDecoderForCausalLM, HfzooDecoderModel
from hfzoo.compat import output_cache
from hfzoo.modules.stack import HfzooStack

TINY = dict(
    vocab_size=97,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
)


def tiny_model(attn_implementation: str = "sdpa", seed: int = 0, **overrides) -> HfzooDecoderForCausalLM:
    torch.manual_seed(seed)
    config = HfzooDecoderConfig(**{**TINY, **overrides})
    model = HfzooDecoderForCausalLM(config)
    model.set_attn_implementation(attn_implementation)
    return model.eval()


def test_auto_classes_resolve_hfzoo_decoder():
    config = AutoConfig.for_model("hfzoo_decoder", **TINY)
    assert type(config) is HfzooDecoderConfig
    assert type(AutoModelForCausalLM.from_config(config)) is HfzooDecoderForCausalLM
    assert type(AutoModel.from_config(config)) is HfzooDecoderModel


def test_model_type_is_not_a_transformers_one():
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    assert "hfzoo_decoder" not in CONFIG_MAPPING_NAMES


def test_changing_future_tokens_never_changes_past_logits():
    model = tiny_model()
    torch.manual_seed(1)
    ids = torch.randint(0, TINY["vocab_size"], (3, 20))
    base = model(ids).logits
    for t in (0, 7, 18):
        changed = ids.clone()
        changed[:, t + 1 :] = torch.randint(0, TINY["vocab_size"], changed[:, t + 1 :].shape)
        assert not torch.equal(changed, ids)
        out = model(changed).logits
        torch.testing.assert_close(out[:, : t + 1], base[:, : t + 1], rtol=0, atol=1e-6)
        assert not torch.allclose(out[:, t + 1 :], base[:, t + 1 :])


@pytest.mark.parametrize("overrides", [{}, {"norm_position": "post", "norm_type": "rms_norm"}])
def test_eager_and_sdpa_agree(overrides):
    torch.manual_seed(2)
    ids = torch.randint(0, TINY["vocab_size"], (2, 17))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # left padding in one row
    eager = tiny_model("eager", **overrides)
    sdpa = tiny_model("sdpa", **overrides)
    assert eager.config._attn_implementation == "eager" and sdpa.config._attn_implementation == "sdpa"
    for kwargs in ({}, {"attention_mask": mask}):
        a = eager(ids, **kwargs).logits
        b = sdpa(ids, **kwargs).logits
        valid = mask.bool() if kwargs else torch.ones_like(mask, dtype=torch.bool)
        assert (a[valid] - b[valid]).abs().max() < 1e-5


@pytest.mark.compat
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_greedy_generation_same_with_and_without_cache(attn_implementation):
    model = tiny_model(attn_implementation, seed=3)
    torch.manual_seed(3)
    prompt = torch.randint(0, TINY["vocab_size"], (2, 5))
    # At init greedy decoding repeats the last token whatever position the cache gives it: no token twice,
    # and the logits of every step compared.
    kwargs = dict(max_new_tokens=32, min_new_tokens=32, do_sample=False, pad_token_id=0, no_repeat_ngram_size=1)
    kwargs.update(output_logits=True, return_dict_in_generate=True)
    with_cache = model.generate(prompt, use_cache=True, **kwargs)
    without_cache = model.generate(prompt, use_cache=False, **kwargs)
    assert with_cache.sequences.shape == (2, 37)
    assert torch.equal(with_cache.sequences, without_cache.sequences)
    torch.testing.assert_close(torch.stack(with_cache.logits), torch.stack(without_cache.logits), rtol=1e-4, atol=1e-5)


def test_incremental_decoding_matches_full_forward():
    model = tiny_model()
    ids = torch.randint(0, TINY["vocab_size"], (2, 12))
    full = model(ids).logits
    out = model(ids[:, :8], use_cache=True)
    step = model(ids[:, 8:], cache=output_cache(out), use_cache=True)
    torch.testing.assert_close(step.logits, full[:, 8:], rtol=1e-5, atol=1e-5)


def test_left_padded_batch_matches_unpadded_rows():
    model = tiny_model()
    torch.manual_seed(4)
    long, short = torch.randint(1, TINY["vocab_size"], (10,)), torch.randint(1, TINY["vocab_size"], (6,))
    ids = torch.stack([long, torch.cat([torch.zeros(4, dtype=torch.long), short])])
    mask = torch.stack([torch.ones(10), torch.cat([torch.zeros(4), torch.ones(6)])]).long()
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    batched = model(ids, attention_mask=mask, position_ids=position_ids).logits
    torch.testing.assert_close(batched[0], model(long[None]).logits[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(batched[1, 4:], model(short[None]).logits[0], rtol=1e-5, atol=1e-5)


def test_loss_is_mean_next_token_cross_entropy():
    model = tiny_model()
    ids = torch.randint(0, TINY["vocab_size"], (2, 9))
    out = model(ids, labels=ids)
    expected = torch.nn.functional.cross_entropy(
        out.logits[:, :-1].reshape(-1, TINY["vocab_size"]), ids[:, 1:].reshape(-1)
    )
    torch.testing.assert_close(out.loss, expected)


@pytest.mark.compat
def test_save_and_load_gives_exactly_the_saved_weights(tmp_path):
    model = tiny_model(seed=5)
    model.save_pretrained(tmp_path)
    stored = load_file(tmp_path / "model.safetensors")
    assert "lm_head.weight" not in stored  # tied: stored once
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(reloaded) is HfzooDecoderForCausalLM
    state = reloaded.state_dict()
    for name, tensor in stored.items():
        assert torch.equal(state[name], tensor), name
    assert reloaded.lm_head.weight.data_ptr() == reloaded.model.embed_tokens.weight.data_ptr()
    ids = torch.randint(0, TINY["vocab_size"], (2, 9))
    assert torch.equal(reloaded.eval()(ids).logits, model(ids).logits)


def test_untied_embeddings_are_saved_separately(tmp_path):
    model = tiny_model(tie_word_embeddings=False)
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    model.save_pretrained(tmp_path)
    assert "lm_head.weight" in load_file(tmp_path / "model.safetensors")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert torch.equal(reloaded.lm_head.weight, model.lm_head.weight)


def test_fresh_process_loads_checkpoint_after_import_hfzoo(tmp_path):
    model = tiny_model(seed=6)
    model.save_pretrained(tmp_path)
    ids = torch.arange(10)[None]
    expected = model(ids).logits[0, -1].tolist()
    code = (
        "import sys, json, torch, hfzoo\n"
        "from transformers import AutoModelForCausalLM\n"
        f"m = AutoModelForCausalLM.from_pretrained({str(tmp_path)!r}).eval()\n"
        "print(json.dumps(m(torch.arange(10)[None]).logits[0, -1].tolist()))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    import json

    assert json.loads(out.stdout.strip().splitlines()[-1]) == pytest.approx(expected, abs=1e-6)


VARIANTS = [
    {"norm_type": "layer_norm", "norm_position": "pre"},
    {"norm_type": "rms_norm", "norm_position": "pre"},
    {"norm_type": "layer_norm", "norm_position": "post"},
    {"norm_type": "rms_norm", "norm_position": "post"},
    {"position_embedding_type": "none"},
    {"position_embedding_type": "learned"},
    {"position_embedding_type": "sinusoidal"},
    {"hidden_act": "relu"},
    {"hidden_act": "gelu_new"},
    {"hidden_act": "silu"},
    {"head_dim": 16},
    {"attention_bias": False, "mlp_bias": False},
    {"tie_word_embeddings": False},
    {"hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1},
]


@pytest.mark.parametrize("overrides", VARIANTS, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_variant_trains_and_round_trips(overrides, tmp_path):
    model = tiny_model(**overrides).train()
    ids = torch.randint(0, TINY["vocab_size"], (2, 16))
    loss = model(ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    model.eval().save_pretrained(tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    for name, value in overrides.items():
        assert getattr(reloaded.config, name) == value
    torch.testing.assert_close(reloaded(ids).logits, model(ids).logits, rtol=0, atol=0)


def test_variants_change_the_architecture():
    """Each switch must be read: a model built with it differs from the default one."""
    ids = torch.randint(0, TINY["vocab_size"], (1, 8))
    base = tiny_model()(ids).logits
    for overrides in VARIANTS:
        if overrides in (
            {"norm_type": "layer_norm", "norm_position": "pre"},
            {"position_embedding_type": "learned"},
            {"position_embedding_type": "sinusoidal"},
        ):
            continue
        if "hidden_dropout_prob" in overrides:
            continue  # dropout only acts in training mode
        assert not torch.allclose(tiny_model(**overrides)(ids).logits, base), overrides


def test_bf16_forward_and_backward_is_finite():
    model = tiny_model().train()
    ids = torch.randint(0, TINY["vocab_size"], (2, 16))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(ids, labels=ids).loss
    loss.backward()
    assert torch.isfinite(loss)


def test_gradient_checkpointing_gives_same_gradients():
    ids = torch.randint(0, TINY["vocab_size"], (2, 16))
    grads = []
    for checkpointing in (False, True):
        model = tiny_model(seed=7).train()
        if checkpointing:
            model.activation_checkpointing_enable()
        model(ids, labels=ids).loss.backward()
        grads.append(model.model.layers[0].mlp.up_proj.weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])


def test_the_module_walk_of_gradient_checkpointing_is_asked_only_where_it_decides_the_cache(monkeypatch):
    """`is_activation_checkpointing` walks every submodule; a training step without a cache must not pay for it."""
    asked = []
    walk = PreTrainedModel.is_activation_checkpointing.fget

    def counted(self):
        if isinstance(self, HfzooStack):
            asked.append(1)
        return walk(self)

    monkeypatch.setattr(PreTrainedModel, "is_activation_checkpointing", property(counted))
    ids = torch.randint(0, TINY["vocab_size"], (2, 8))
    for checkpointing in (False, True):
        model = tiny_model(seed=7).train()
        if checkpointing:
            model.activation_checkpointing_enable()
        assert model(ids, labels=ids, use_cache=False).past_key_values is None and not asked
        # Where a cache would be created, the walk decides: none under checkpointing, a new one otherwise.
        assert (model(ids, labels=ids).past_key_values is None) is checkpointing and asked
        asked.clear()


def test_hidden_states_and_attentions_are_returned():
    model = tiny_model("eager")
    out = model(torch.randint(0, TINY["vocab_size"], (1, 6)), output_hidden_states=True, output_attentions=True)
    assert len(out.hidden_states) == TINY["num_hidden_layers"] + 1
    assert out.attentions[0].shape == (1, TINY["num_attention_heads"], 6, 6)
    torch.testing.assert_close(out.attentions[0].sum(-1), torch.ones(1, TINY["num_attention_heads"], 6))


def test_too_long_sequence_is_refused():
    model = tiny_model()
    with pytest.raises(ValueError, match="max_position_embeddings=64"):
        model(torch.zeros(1, 65, dtype=torch.long))


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"hidden_act": "nope"}, "hidden_act"),
        ({"norm_type": "batch_norm"}, "norm_type"),
        ({"norm_position": "sandwichh"}, "norm_position"),
        ({"position_embedding_type": "absolute_learned"}, "position_embedding_type"),
        ({"num_hidden_layers": 0}, "num_hidden_layers"),
        ({"hidden_dropout_prob": 1.5}, "hidden_dropout_prob"),
        ({"pad_token_id": 500}, "pad_token_id"),
    ],
)
def test_invalid_config_is_refused_naming_the_field(bad, field):
    with pytest.raises(StrictDataclassClassValidationError, match=field):
        HfzooDecoderConfig(**{**TINY, **bad})


def test_heads_must_divide_hidden_size_without_head_dim():
    with pytest.raises(ValueError, match="num_attention_heads"):
        HfzooDecoderConfig(**{**TINY, "num_attention_heads": 5})
    assert HfzooDecoderConfig(**{**TINY, "num_attention_heads": 5, "head_dim": 8}).head_dim == 8


def test_sinusoidal_positions_match_vaswani_formula():
    from hfzoo.modules.positions import SinusoidalPositionalEmbedding

    config = HfzooDecoderConfig(**{**TINY, "hidden_size": 6, "num_attention_heads": 2})
    encoding = SinusoidalPositionalEmbedding(config)(torch.tensor([[0, 1, 7]]))[0]
    for pos in (0, 1, 7):
        for i in range(3):
            angle = pos / 10000 ** (2 * i / 6)
            assert encoding[[0, 1, 7].index(pos), 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert encoding[[0, 1, 7].index(pos), 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)
    assert list(SinusoidalPositionalEmbedding(config).parameters()) == []
