"""The fused query-key-value projection for inference (`fuse_qkv_projections`).

Every variant of the matrix checks that fusing changes no logits or generated tokens and that unfusing restores
the model (`helpers/variant_checks.py::check_fused_qkv_projections`); here: the fused weight's layout, grouped
key/value heads, gradients, adapters, and the one matrix product per layer it is for.
"""

from __future__ import annotations

import pytest
import torch
from helpers.variant_checks import TINY, make_batch, run

from hfzoo import HfzooDecoderConfig, HfzooDecoderForCausalLM


def _decoder(**overrides) -> HfzooDecoderForCausalLM:
    torch.manual_seed(0)
    config = HfzooDecoderConfig(**{**TINY, "attention_bias": True, **overrides})
    return HfzooDecoderForCausalLM(config).eval()


def test_the_fused_weight_stacks_the_query_key_and_value_rows_with_grouped_heads():
    model = _decoder(num_key_value_heads=2)  # 4 query heads of 8, 2 key/value heads
    attention = model.model.layers[0].self_attn
    q, k, v = (getattr(attention, name) for name in ("q_proj", "k_proj", "v_proj"))
    weights = [p.weight.detach().clone() for p in (q, k, v)]
    biases = [p.bias.detach().clone() for p in (q, k, v)]
    batch = make_batch("decoder")
    with torch.no_grad():
        before = run(model, batch).logits
    assert model.fuse_qkv_projections() == 2
    fused = attention.qkv_proj
    assert tuple(fused.weight.shape) == (32 + 16 + 16, 32)
    assert torch.equal(fused.weight, torch.cat(weights)) and torch.equal(fused.bias, torch.cat(biases))
    assert not hasattr(attention, "q_proj") and "q_proj" not in dict(model.named_modules())
    with torch.no_grad():
        torch.testing.assert_close(run(model, batch).logits, before, rtol=1e-5, atol=1e-5)
    model.unfuse_qkv_projections()
    for name, weight, bias in zip(("q_proj", "k_proj", "v_proj"), weights, biases):
        assert torch.equal(getattr(attention, name).weight, weight) and torch.equal(getattr(attention, name).bias, bias)


def test_the_fused_projection_is_one_matrix_product_per_layer():
    model = _decoder()
    ids = make_batch("decoder").input_ids

    def products() -> int:
        with torch.no_grad(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            model(ids)
        return sum(e.count for e in prof.key_averages() if e.key in ("aten::addmm", "aten::mm", "aten::bmm"))

    separate = products()
    model.fuse_qkv_projections()
    assert separate - products() == 2 * TINY["num_hidden_layers"]  # three products per layer became one


def test_a_fused_model_trains_its_fused_weight_and_keeps_requires_grad():
    model = _decoder().train()
    model.model.layers[1].self_attn.k_proj.weight.requires_grad_(False)  # layer 1's projections frozen together
    model.model.layers[1].self_attn.q_proj.weight.requires_grad_(False)
    model.model.layers[1].self_attn.v_proj.weight.requires_grad_(False)
    model.fuse_qkv_projections()
    batch = make_batch("decoder")
    run(model, batch, labels=batch.labels).loss.backward()
    trained, frozen = model.model.layers[0].self_attn.qkv_proj, model.model.layers[1].self_attn.qkv_proj
    assert trained.weight.grad is not None and trained.weight.grad.abs().sum() > 0
    assert not frozen.weight.requires_grad and frozen.weight.grad is None


def test_projections_wrapped_by_an_adapter_are_refused_until_merged():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(_decoder(), peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    with pytest.raises(
        ValueError,
        match=r"cannot fuse .* layer 0: they must be plain nn.Linear, got \['peft\.tuners\.lora\.layer\.Linear', ",
    ):
        model.base_model.model.fuse_qkv_projections()
    merged = model.merge_and_unload()
    assert merged.fuse_qkv_projections() == 2


def test_a_fused_model_is_refused_by_the_converters_until_unfused():
    from hfzoo.convert import hfzoo_to_gpt2

    model = _decoder()
    model.fuse_qkv_projections()
    with pytest.raises(ValueError, match=r"hfzoo_to_gpt2: .* fused \(fuse_qkv_projections\): call model\.unfuse"):
        hfzoo_to_gpt2(model)
    model.unfuse_qkv_projections()
    assert hfzoo_to_gpt2(model) is not None
