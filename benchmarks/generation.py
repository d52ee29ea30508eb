"""Greedy generation speed: hfzoo's decoder vs transformers' `GPT2LMHeadModel` with the same weights.

The hfzoo model is the `gpt2` parity preset (at `--size small` a CPU-sized one, at `base` the preset's own 768-wide
12 layers, at `narrow` the base's 12 layers 64 wide: too little arithmetic to matter, so that the time per token is
the framework's overhead, the part CUDA graphs do not remove), transformers' model its conversion
(`hfzoo.convert.hfzoo_to_gpt2`: the same weights, the same logits). hfzoo's query, key and value projections are
then fused for inference (`model.fuse_qkv_projections()`: one product per layer, as GPT-2's `c_attn`; `--qkv
separate` keeps the three of training).
Each is timed in two set-ups:

- `dynamic eager`: `generate` with the default dynamic cache, no compilation;
- `static compiled`: `generate(..., cache_implementation="static", compile_config=CompileConfig(mode=...))`,
  transformers' own compiled generation: the prefill runs eagerly (it allocates the static cache outside any
  graph) and `generate` compiles the decoding step; on CUDA `mode="reduce-overhead"` (CUDA graphs, the
  `CompileConfig` default), on CPU the default mode (inductor's C++ code; there are no CUDA graphs; transformers
  compiles on GPUs only unless told, so the CPU run sets `CompileConfig._compile_all_devices`, as transformers'
  tests do). `model.forward = torch.compile(model.forward, mode="reduce-overhead")` also compiles the prefill,
  and `GPT2LMHeadModel` then allocates its static cache inside a CUDA graph and fails on the next call
  ("accessing tensor output of CUDAGraphs that has been overwritten"; transformers 5.24, torch 2.11, one H200).

For each batch size (`--batch_sizes`, default 1 and 8), a random prompt of `--prompt_len` tokens, `--new_tokens`
greedy tokens (`min_new_tokens` too, no end-of-sequence); two untimed calls of each implementation first (they
compile), then `--repeats` rounds in which each generates once, in turn (a host that changes speed during the run
changes every implementation's rate alike); the table gives the median generated tokens per second (batch x new
tokens / time) with the spread, and whether the tokens equal those of hfzoo's dynamic-cache eager run.
`--qkv both` adds hfzoo with its three separate projections as one more implementation.

`--profile_dir DIR` also profiles one more call of each case (`torch.profiler`, as `compare_transformers.py
--profile_dir` profiles a training step: wall and kernel milliseconds per call, values read back from the device,
operator tables) into `DIR/generation-b{batch}-{set-up}-{implementation}.txt` (characters other than letters and
digits as `-`).

Usage (prints a markdown table):

    python benchmarks/generation.py                                   # CPU, small size
    python benchmarks/generation.py --size narrow --batch_sizes 1     # CPU, per-token overhead
    python benchmarks/generation.py --device cuda --size base --new_tokens 128
"""

from __future__ import annotations

import argparse
import copy
import re
import statistics
import time
from pathlib import Path

import torch
import transformers
from transformers import CompileConfig

import hfzoo  # noqa: F401  (registers the Auto classes)
from hfzoo.convert import hfzoo_to_gpt2
from hfzoo.models.presets import build_config
from hfzoo.training.compilation import separate_compile_caches_by_cpu_capability

SIZES = {
    "small": "vocab_size=8192,hidden_size=256,num_hidden_layers=4,num_attention_heads=4,intermediate_size=1024",
    "base": None,
    "narrow": "vocab_size=512,hidden_size=64,num_attention_heads=2,intermediate_size=256",
}
SETUPS = ("dynamic eager", "static compiled")
SEPARATE = "hfzoo, q/k/v separate"  # the implementation name of `--qkv both`'s unfused hfzoo model


def build_models(size: str, device: torch.device, qkv: str = "fused") -> dict[str, torch.nn.Module]:
    """The hfzoo `gpt2` preset at `size` and its `GPT2LMHeadModel` conversion, in eval mode on `device`.

    With `qkv="fused"`, hfzoo's query, key and value projections are then fused (`fuse_qkv_projections`: one
    matrix product per layer, as GPT-2's own `c_attn`), the way to run an hfzoo model for inference; `"separate"`
    keeps the three of training; `"both"` gives the fused model and a copy with the separate ones (`SEPARATE`).

    Returns:
        `{"hfzoo": ..., "transformers": ...}`, and `SEPARATE` for `"both"`.
    """
    torch.manual_seed(0)
    config = build_config("gpt2", SIZES[size])
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").to(device).eval()
    models = {"hfzoo": model, "transformers": hfzoo_to_gpt2(model, attn_implementation="sdpa").to(device).eval()}
    if qkv == "both":
        models[SEPARATE] = copy.deepcopy(model)
    if qkv != "separate":
        model.fuse_qkv_projections()
    return models


def static_compiled_options(device: torch.device) -> dict:
    """`generate` options of the `static compiled` set-up: a static cache and a compiled decoding step.

    Returns:
        `{"cache_implementation": "static", "compile_config": ...}`: CUDA graphs (`mode="reduce-overhead"`) on a GPU,
        inductor's default mode elsewhere (compiled on the CPU too).
    """
    if device.type == "cuda":
        return {"cache_implementation": "static", "compile_config": CompileConfig(mode="reduce-overhead")}
    separate_compile_caches_by_cpu_capability()  # inductor's C++ for this CPU's vector width
    compile_config = CompileConfig(mode="default")
    compile_config._compile_all_devices = True  # transformers compiles generation on GPUs only unless told
    return {"cache_implementation": "static", "compile_config": compile_config}


def greedy_options(new_tokens: int, **generate_options) -> dict:
    """`generate` options of every call: exactly `new_tokens` greedy tokens (no end of sequence), then the set-up's."""
    options = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, eos_token_id=None)
    return {**options, "pad_token_id": 0, **generate_options}


def time_generation(
    models: dict[str, torch.nn.Module], prompt: torch.Tensor, new_tokens: int, repeats: int, **generate_options
) -> dict[str, tuple[list[float], torch.Tensor]]:
    """Two untimed `generate` calls of each model (compilation), then `repeats` rounds of one timed call each.

    The models take turns within every round, so that a change of the host's speed during the run (other work,
    clock changes) reaches every model alike instead of the one timed then.

    Args:
        models: `{name: causal LM with generate}`.
        prompt: `(batch, prompt_len)` int64 token ids on the models' device.
        new_tokens: greedy tokens generated per call (no end of sequence).
        repeats: timed calls of each model.
        generate_options: more `generate` options (the set-up's cache and compilation).

    Returns:
        `{name: (seconds of each timed call, the generated tokens)}`.
    """
    options = greedy_options(new_tokens, **generate_options)
    synchronize = torch.cuda.synchronize if prompt.device.type == "cuda" else (lambda: None)
    times: dict[str, list[float]] = {name: [] for name in models}
    tokens: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for name, model in models.items():
            for _ in range(2):
                tokens[name] = model.generate(prompt, attention_mask=torch.ones_like(prompt), **options)
        for _ in range(repeats):
            for name, model in models.items():
                synchronize()
                start = time.perf_counter()
                tokens[name] = model.generate(prompt, attention_mask=torch.ones_like(prompt), **options)
                synchronize()
                times[name].append(time.perf_counter() - start)
    return {name: (times[name], tokens[name]) for name in models}


def profile_generation(
    model, prompt: torch.Tensor, new_tokens: int, profile_dir: str, name: str, setup: str, **generate_options
) -> Path:
    """Profile one more `generate` call (after `time_generation`'s, so compiled) into `profile_dir`.

    Args:
        model: a causal LM with `generate`.
        prompt: `(batch, prompt_len)` int64 token ids on the model's device.
        new_tokens: greedy tokens generated by the call.
        profile_dir: the folder of the profile files (created).
        name: the implementation (`hfzoo`, `transformers`), part of the file name.
        setup: the set-up (one of `SETUPS`), part of the file name.
        generate_options: the set-up's `generate` options.

    Returns:
        The file written: `generation-b{batch}-{setup}-{name}.txt` (`compare_transformers.profile_steps`' text, one
        step being one call of `new_tokens` tokens).
    """
    from compare_transformers import profile_steps

    options = greedy_options(new_tokens, **generate_options)
    synchronize = torch.cuda.synchronize if prompt.device.type == "cuda" else (lambda: None)

    def call() -> None:
        with torch.no_grad():
            model.generate(prompt, attention_mask=torch.ones_like(prompt), **options)

    text = profile_steps(call, synchronize, prompt.device, 1)
    case = "-".join(re.sub(r"[^A-Za-z0-9]+", "-", part).strip("-") for part in (setup, name))
    path = Path(profile_dir) / f"generation-b{prompt.shape[0]}-{case}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"one step: one generate call of {new_tokens} new tokens, batch {prompt.shape[0]}\n{text}\n")
    return path


def main(argv: list[str] | None = None) -> list[dict]:
    """Run every (implementation, set-up, batch size) case and print the markdown table.

    Args:
        argv: command-line arguments (default: `sys.argv[1:]`).

    Returns:
        One dict per case: `implementation`, `setup`, `batch_size`, `tokens_per_s`, `low`, `high`, `same_tokens`,
        `compiled` (whether `generate` ran a compiled decoding step).
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--size", choices=tuple(SIZES), default="small")
    parser.add_argument("--batch_sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt_len", type=int, default=32)
    parser.add_argument("--new_tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile_dir", default=None, help="also profile one more call of each case (operator tables)")
    parser.add_argument(
        "--qkv",
        choices=("fused", "separate", "both"),
        default="fused",
        help="hfzoo's query, key and value projections: fused for inference (fuse_qkv_projections; default), as "
        "trained (three products per layer), or both (one more implementation, 'hfzoo, q/k/v separate')",
    )
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    rows = []
    for batch_size in args.batch_sizes:
        vocab_size = build_config("gpt2", SIZES[args.size]).vocab_size
        prompt = torch.randint(5, vocab_size, (batch_size, args.prompt_len))
        prompt = prompt.to(device)
        reference = None
        for setup in SETUPS:
            models = build_models(args.size, device, args.qkv)
            torch._dynamo.reset()
            options = static_compiled_options(device) if setup == "static compiled" else {}
            timed = time_generation(models, prompt, args.new_tokens, args.repeats, **options)
            for name, model in models.items():
                if args.profile_dir:
                    profile_generation(model, prompt, args.new_tokens, args.profile_dir, name, setup, **options)
                times, tokens = timed[name]
                if reference is None:
                    reference = tokens
                rate = [batch_size * args.new_tokens / t for t in times]
                rows.append(
                    dict(
                        implementation=name,
                        setup=setup,
                        batch_size=batch_size,
                        tokens_per_s=statistics.median(rate),
                        low=min(rate),
                        high=max(rate),
                        same_tokens=bool(torch.equal(tokens, reference)),
                        compiled=getattr(model, "_compiled_call", None) is not None,  # generate compiled decoding
                    )
                )
                print(rows[-1], flush=True)
    print("\n| batch | implementation | set-up | compiled | tokens/s (min-max) | tokens = hfzoo dynamic eager |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        spread = f"{row['tokens_per_s']:.0f} ({row['low']:.0f}-{row['high']:.0f})"
        same = "yes" if row["same_tokens"] else "no"
        compiled = "yes" if row["compiled"] else "no"
        print(f"| {row['batch_size']} | {row['implementation']} | {row['setup']} | {compiled} | {spread} | {same} |")
    return rows


if __name__ == "__main__":
    main()
