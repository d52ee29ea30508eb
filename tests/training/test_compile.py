"""torch.compile: the default model of each family and the parity presets compile without graph breaks.

Training: `torch._dynamo.explain` counts the graph breaks of a forward pass with labels (the loss); a
`fullgraph=True` compile (backend `aot_eager`: dynamo and AOT autograd without inductor's slow C++ code
generation) then runs forward and backward and must give the eager loss and gradients. Generation: greedy
decoding with `cache_implementation="static"` compiles the decoding step with `fullgraph=True` (any graph
break is an error) and must produce the eager tokens, which equal those of the dynamic cache. The recipes'
`--torch_compile` keeps the eager state-dict keys (no `_orig_mod.` prefix; tests/pretraining/test_pretrain_recipe.py).
Regional compilation (`compile_model`'s default scope): every layer reuses the first layer's graph (dynamo's
`unique_graphs` counter), later training steps and a second `generate` compile nothing, the losses are eager's.
"""

from __future__ import annotations

import argparse
import logging

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSeq2SeqLM
from transformers.generation.configuration_utils import CompileConfig

import hfzoo  # noqa: F401
from hfzoo.models.presets import build_config
from hfzoo.training import compilation

TINY = "vocab_size=128,hidden_size=32,num_hidden_layers=2,num_attention_heads=2,intermediate_size=64"
SEQ2SEQ_IDS = "pad_token_id=0,decoder_start_token_id=0,eos_token_id=1"
#: name -> (preset, overrides, Auto class): each family's default and its parity preset at a tiny size.
CASES = {
    "decoder-tiny": ("decoder-tiny", "vocab_size=128", AutoModelForCausalLM),
    "encoder-tiny": ("encoder-tiny", "vocab_size=128", AutoModelForMaskedLM),
    "encoder-decoder-tiny": ("encoder-decoder-tiny", f"vocab_size=128,{SEQ2SEQ_IDS}", AutoModelForSeq2SeqLM),
    "gpt2": ("gpt2", TINY, AutoModelForCausalLM),
    "bert": ("bert", TINY, AutoModelForMaskedLM),
    "t5-v1.0": ("t5-v1.0", f"{TINY},num_decoder_layers=2,head_dim=16", AutoModelForSeq2SeqLM),
}
SLOW = {"encoder-decoder-tiny", "t5-v1.0", "bert", "encoder-tiny"}  # a few seconds each on a quiet machine


def build(name: str, dropout: bool = True):
    preset, overrides, auto = CASES[name]
    if not dropout:
        overrides += ",hidden_dropout_prob=0.0,attention_probs_dropout_prob=0.0"
    torch.manual_seed(0)
    return auto.from_config(build_config(preset, overrides))


def batch_for(model) -> dict[str, torch.Tensor]:
    ids = torch.randint(5, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}
    if model.config.is_encoder_decoder:
        batch["labels"] = ids[:, :6].clone()
    return batch


def cases(names, slow=SLOW):
    return [pytest.param(n, marks=pytest.mark.slow) if n in slow else n for n in names]


@pytest.mark.parametrize("name", cases(CASES))
def test_training_forward_has_no_graph_break(name):
    model = build(name).train()
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(lambda batch: model(**batch).loss)(batch_for(model))
    assert explanation.graph_break_count == 0, [r.reason for r in explanation.break_reasons]
    assert explanation.graph_count == 1


@pytest.mark.parametrize("name", cases(["decoder-tiny", "t5-v1.0"], slow={"t5-v1.0"}))
def test_fullgraph_training_step_matches_eager(name):
    eager, compiled = build(name, dropout=False).train(), build(name, dropout=False).train()
    batch = batch_for(eager)
    eager(**batch).loss.backward()
    torch._dynamo.reset()
    compiled.compile(fullgraph=True, backend="aot_eager")
    loss = compiled(**batch).loss
    loss.backward()
    torch.testing.assert_close(loss, eager(**batch).loss.detach(), rtol=1e-5, atol=1e-6)
    grads = {n: p.grad for n, p in eager.named_parameters() if p.grad is not None}
    for n, p in compiled.named_parameters():
        if n in grads:
            torch.testing.assert_close(p.grad, grads[n], rtol=1e-4, atol=1e-6, msg=n)
    assert list(compiled.state_dict()) == list(eager.state_dict())  # compiled in place: no `_orig_mod.` prefix


@pytest.mark.compat
@pytest.mark.parametrize("name", cases(["decoder-tiny", "encoder-decoder-tiny", "gpt2", "t5-v1.0"]))
def test_static_cache_greedy_generation_compiles_fullgraph(name):
    model = build(name).eval()
    prompt = torch.randint(5, 128, (2, 7), generator=torch.Generator().manual_seed(1))
    options = dict(max_new_tokens=8, do_sample=False, pad_token_id=0, eos_token_id=None)
    dynamic = model.generate(prompt, **options, disable_compile=True)
    static = model.generate(prompt, **options, cache_implementation="static", disable_compile=True)
    assert torch.equal(static, dynamic)  # the static cache's score bias and positions cover its slots
    compile_config = CompileConfig(fullgraph=True, backend="aot_eager", mode=None)
    compile_config._compile_all_devices = True  # transformers compiles generation on GPUs only by default
    torch._dynamo.reset()
    compiled = model.generate(prompt, **options, cache_implementation="static", compile_config=compile_config)
    assert getattr(model, "_compiled_call", None) is not None  # the decoding steps did run compiled
    assert torch.equal(compiled, static)


class Accelerator:
    distributed_type = None


def compile_args(scope: str | None = "regions", backend: str = "aot_eager") -> argparse.Namespace:
    return argparse.Namespace(
        torch_compile=True, torch_compile_mode=None, torch_compile_backend=backend, torch_compile_scope=scope
    )


def compiled_modules(model) -> list[str]:
    return [name for name, module in model.named_modules() if module._compiled_call_impl is not None]


def test_compile_model_compiles_in_place_or_falls_back_with_a_warning(monkeypatch, caplog):
    class Args:
        torch_compile, torch_compile_mode, torch_compile_backend = True, None, "aot_eager"

    model = build("decoder-tiny")
    keys = list(model.state_dict())
    assert compilation.compile_model(model, compile_args("model"), Accelerator())
    assert compiled_modules(model) == [""] and list(model.state_dict()) == keys
    model = build("decoder-tiny")
    assert compilation.compile_model(model, Args(), Accelerator())  # regions by default
    layers = [f"model.layers.{i}" for i in range(model.config.num_hidden_layers)]
    assert compiled_modules(model) == layers and model.lm_head.chunk_fn is not None  # the layers, then the loss
    assert list(model.state_dict()) == keys
    with pytest.raises(ValueError, match="torch_compile_scope='layers': expected one of"):
        compilation.compile_model(build("decoder-tiny"), compile_args("layers"), Accelerator())
    monkeypatch.setitem(
        compilation.COMPILE_BLOCKERS, "hidden_size", (lambda value: value == 64, "a reason for the test")
    )
    with caplog.at_level(logging.WARNING, logger=compilation.__name__):
        assert not compilation.compile_model(build("decoder-tiny"), Args(), Accelerator())
    assert "running eagerly (hidden_size=64: a reason for the test)" in caplog.text
    Args.torch_compile, Args.torch_compile_backend = False, None
    assert not compilation.compile_requested(Args())
    Args.torch_compile_mode = "max-autotune"  # a mode implies compilation, as in transformers
    assert compilation.compile_requested(Args())


@pytest.mark.slow
def test_listed_blockers_do_break_the_graph():
    """Each COMPILE_BLOCKERS entry is real: a model with it has graph breaks (when one is fixed, drop the entry)."""
    config = build_config("decoder-tiny", "vocab_size=128,num_experts=4")
    assert compilation.compile_blocker(config).startswith("num_experts=4: mixture-of-experts")
    assert compilation.compile_blocker(build_config("decoder-tiny", "vocab_size=128")) is None
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).train()
    torch._dynamo.reset()
    batch = batch_for(model)
    assert torch._dynamo.explain(lambda b: model(**b).loss)(batch).graph_break_count > 0


def train(model, steps: int = 4) -> tuple[list[float], list[int]]:
    """Losses of `steps` AdamW steps on one fixed batch without a KV cache (as the recipes train), and the
    number of graphs dynamo has compiled after each step."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch = batch_for(model)
    losses, graphs = [], []
    for _ in range(steps):
        loss = model(**batch, **compilation.no_cache_kwargs(model)).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        graphs.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])
    return losses, graphs


def test_regional_compile_trains_like_eager_with_one_graph_for_all_layers(tmp_path):
    """Regional compilation: every layer runs the first layer's graph, the head (and loss) one of its own, no step
    recompiles, the losses are eager's."""
    eager = build("gpt2", dropout=False).train()  # 2 layers
    eager_losses, _ = train(eager)
    model = build("gpt2", dropout=False).train()
    keys = list(model.state_dict())
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    assert compilation.compile_model(model, compile_args(), Accelerator())
    assert compiled_modules(model) == ["model.layers.0", "model.layers.1"] and model.lm_head.chunk_fn is not None
    losses, graphs = train(model)
    assert graphs == [2, 2, 2, 2]  # the layers' graph (layer 1 reuses layer 0's) and the loss's; then nothing
    torch.testing.assert_close(losses, eager_losses, rtol=1e-5, atol=0)
    assert len(set(losses)) == len(losses)  # the parameters did change
    assert list(model.state_dict()) == keys
    model.save_pretrained(tmp_path / "compiled")
    eager.save_pretrained(tmp_path / "eager")
    saved = list(load_file(tmp_path / "compiled" / "model.safetensors"))
    assert saved == list(load_file(tmp_path / "eager" / "model.safetensors"))
    assert not any("_orig_mod" in key for key in saved)


def test_regional_compile_of_a_deep_stack_compiles_one_layer():
    """12 layers (the gpt2 preset's depth), one graph for them (and one for the head): compiling does not grow
    with the depth."""
    preset, overrides, auto = CASES["gpt2"]
    torch.manual_seed(0)
    model = auto.from_config(build_config(preset, overrides.replace("num_hidden_layers=2", "num_hidden_layers=12")))
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    assert compilation.compile_model(model, compile_args(backend="eager"), Accelerator())
    model.train()
    for _ in range(2):
        model(**batch_for(model), **compilation.no_cache_kwargs(model)).loss.backward()
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 2


def test_regional_compile_generates_the_eager_tokens_and_compiles_once():
    """A second `generate` on a regionally compiled decoder compiles nothing new (the first compiles its graphs)."""
    model = build("decoder-tiny").eval()
    prompt = torch.randint(5, 128, (2, 7), generator=torch.Generator().manual_seed(1))
    options = dict(max_new_tokens=8, do_sample=False, pad_token_id=0, eos_token_id=None)
    expected = model.generate(prompt, **options)
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    assert compilation.compile_model(model, compile_args(), Accelerator())
    assert torch.equal(model.generate(prompt, **options), expected)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    frames = torch._dynamo.utils.counters["frames"]
    # compiled (each layer's cache slots specialize its graph), below the recompile limit: no frame fell back to
    # eager execution (a code object past the limit counts as a frame that did not compile)
    assert graphs > 0 and frames["ok"] == frames["total"] > 0
    assert torch.equal(model.generate(prompt, **options), expected)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs


def test_a_cpu_capability_cap_gets_compile_caches_of_its_own(monkeypatch):
    # torch's config module restores itself (monkeypatch's undo would delete, i.e. hide, the config entry)
    before = torch.compiler.config.cache_key_tag
    with torch.compiler.config.patch(cache_key_tag=""):
        monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
        assert compilation.separate_compile_caches_by_cpu_capability() is None
        assert torch.compiler.config.cache_key_tag == ""
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", " AVX2 ")
        assert compilation.separate_compile_caches_by_cpu_capability() == "ATEN_CPU_CAPABILITY=avx2"
        torch.compiler.config.cache_key_tag = "mine"
        compilation.separate_compile_caches_by_cpu_capability()
        assert compilation.separate_compile_caches_by_cpu_capability() == "mine;ATEN_CPU_CAPABILITY=avx2"  # once
    assert torch.compiler.config.cache_key_tag == before


#: One compiled training forward of a 16-wide decoder (one compiled graph for its layers) next to the eager one.
CAPPED_COMPILE_SCRIPT = """
import json, torch, transformers, hfzoo
from hfzoo.models.presets import build_config
from hfzoo.training.compilation import compile_repeated_blocks
torch.manual_seed(0)
config = build_config("decoder-small", "hidden_size=16,num_attention_heads=2,intermediate_size=64,vocab_size=512")
model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").train()
ids = torch.randint(0, 512, (16, 128))
eager = model(ids, labels=ids, use_cache=False).loss.item()
compile_repeated_blocks(model)
print("RESULT", json.dumps({"eager": eager, "compiled": model(ids, labels=ids, use_cache=False).loss.item()}))
"""


@pytest.mark.slow
def test_compiled_runs_with_and_without_an_avx2_cap_share_no_kernels(tmp_path):
    """Uncapped, capped to AVX2, uncapped again, on one inductor cache: each run computes the eager loss.

    Without `separate_compile_caches_by_cpu_capability`, on an AVX-512 host, the capped run loaded the 16-lane
    kernels (a wrong loss) and the last run the 8-lane ones (heap corruption, the process aborted). On an
    AVX2-only host the cap changes nothing, so the three runs would agree anyway: skipped there.
    """
    import json
    import os
    import subprocess
    import sys

    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "DEFAULT"):
        pytest.skip("this CPU has no vector ISA above AVX2: the cap changes nothing here")

    env = {k: v for k, v in os.environ.items() if k not in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA")}
    env.update(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"), TOKENIZERS_PARALLELISM="false")
    capped = {**env, "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    for name, run_env in (("uncapped", env), ("capped", capped), ("uncapped again", env)):
        done = subprocess.run(
            [sys.executable, "-c", CAPPED_COMPILE_SCRIPT], env=run_env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, f"{name}: exit {done.returncode}\n{done.stderr[-2000:]}"
        result = json.loads(done.stdout.split("RESULT", 1)[1])
        assert result["compiled"] == pytest.approx(result["eager"], rel=1e-5), name
