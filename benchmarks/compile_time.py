"""Compile time of `--torch_compile`: whole-model vs regional compilation, with the losses of both and of eager.

For each preset, three cases run the recipes' training step (forward with labels and no KV cache, backward,
AdamW step) on one random batch, fp32, dropout off: `eager`, `model` (`--torch_compile_scope model`: the whole
model as one graph) and `regions` (`--torch_compile_scope regions`, the default: each layer compiled in place
once and its graph reused by every layer; PyTorch's regional compilation recipe). Both compiled cases go
through `hfzoo.training.compilation.compile_model`, as the recipes do. Each case runs in a fresh process with
an empty inductor cache directory, so every compilation is cold. The table gives the wall seconds of the
first forward + backward (where compilation happens; `compile s` is that minus the eager case's first
forward + backward), the median seconds of the later steps, the number of graphs dynamo compiled, and the
losses of the steps (compiled runs should give eager's, up to float rounding).

Usage (prints a markdown table):

    OMP_NUM_THREADS=2 python benchmarks/compile_time.py                       # gpt2 and decoder-small
    python benchmarks/compile_time.py --presets gpt2 --seq_len 128 --batch_size 2 --steps 4
    python benchmarks/compile_time.py --device cuda --seq_len 1024 --batch_size 8
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

SCOPES = ("eager", "model", "regions")


def run_case(preset: str, scope: str, args: argparse.Namespace) -> dict:
    """Train `args.steps` steps of one preset in this process, compiled as `scope`; time the first and later steps.

    Args:
        preset: an hfzoo decoder preset (`hfzoo.models.presets.PRESETS`).
        scope: "eager", or a `--torch_compile_scope` ("model", "regions").
        args: the parsed command line (device, batch size, sequence length, steps, backend, seed).

    Returns:
        `{"first_step_s": wall seconds of the first forward + backward, "step_s": median seconds of the later
        steps (forward, backward, optimizer), "losses": [per step], "graphs": graphs compiled, "params": count}`.
    """
    import torch
    from transformers import AutoModelForCausalLM

    import hfzoo  # noqa: F401  (registers the hfzoo classes with the Auto classes)
    from hfzoo.models.presets import build_config
    from hfzoo.training.compilation import compile_model, no_cache_kwargs

    class Accelerator:  # compile_model reads only the distributed type
        distributed_type = None

    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    config = build_config(preset, "hidden_dropout_prob=0.0,attention_probs_dropout_prob=0.0")
    model = AutoModelForCausalLM.from_config(config).to(device).train()
    if scope != "eager":
        compile_args = argparse.Namespace(
            torch_compile=True,
            torch_compile_mode=args.compile_mode,
            torch_compile_backend=args.backend,
            torch_compile_scope=scope,
        )
        assert compile_model(model, compile_args, Accelerator())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(args.seed)
    input_ids = torch.randint(5, config.vocab_size, (args.batch_size, args.seq_len), generator=g).to(device)
    batch = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": input_ids.clone()}
    batch.update(no_cache_kwargs(model))

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    losses, step_seconds, first_step_s = [], [], None
    for step in range(args.steps):
        start = time.perf_counter()
        loss = model(**batch).loss
        loss.backward()
        synchronize()
        if step == 0:
            first_step_s = time.perf_counter() - start
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize()
        step_seconds.append(time.perf_counter() - start)
        losses.append(loss.item())
    return {
        "first_step_s": first_step_s,
        "step_s": statistics.median(step_seconds[1:]) if len(step_seconds) > 1 else float("nan"),
        "losses": losses,
        "graphs": torch._dynamo.utils.counters["stats"]["unique_graphs"],
        "params": sum(p.numel() for p in model.parameters()),
    }


def main(argv: list[str] | None = None) -> list[dict]:
    """Run every (preset, scope) case in a child process with a cold inductor cache; print a markdown table.

    Args:
        argv: the command line (default `sys.argv[1:]`).

    Returns:
        One dict per case: `preset`, `scope` and `run_case`'s results.

    Raises:
        subprocess.CalledProcessError: a case failed (its output is shown).
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=["gpt2", "decoder-small"])
    parser.add_argument("--scopes", nargs="+", default=list(SCOPES), choices=SCOPES)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--batch_size", type=int, default=2)
    parser.add_argument("--seq_len", type=int, default=128)
    parser.add_argument("--steps", type=int, default=4, help="training steps per case (the first compiles)")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend")
    parser.add_argument("--compile_mode", default=None, help="torch.compile mode (default: torch's default)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--case", nargs=2, metavar=("PRESET", "SCOPE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case:
        print(json.dumps(run_case(*args.case, args)))
        return []

    import torch

    results = []
    for preset in args.presets:
        for scope in args.scopes:
            with tempfile.TemporaryDirectory() as cache:
                env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}  # cold compilation for every case
                command = [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:])]
                command += ["--case", preset, scope]
                done = subprocess.run(command, env=env, capture_output=True, text=True)
            if done.returncode:
                sys.stderr.write(done.stdout + done.stderr)
                done.check_returncode()
            result = json.loads(done.stdout.strip().splitlines()[-1])
            results.append({"preset": preset, "scope": scope, **result})
            print(f"{preset} {scope}: first step {result['first_step_s']:.1f} s", file=sys.stderr, flush=True)

    threads = os.environ.get("OMP_NUM_THREADS", str(torch.get_num_threads()))
    print(
        f"\n{args.device}, batch {args.batch_size} x {args.seq_len} tokens, fp32, backend {args.backend}, "
        f"{args.steps} steps (AdamW lr 1e-4, dropout off), {threads} threads; torch {torch.__version__}\n"
    )
    print("| preset | params | compile | first fwd+bwd s | compile s | vs model | later step s | graphs | losses |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---|")
    for r in results:
        eager = next((e for e in results if e["preset"] == r["preset"] and e["scope"] == "eager"), None)
        whole = next((e for e in results if e["preset"] == r["preset"] and e["scope"] == "model"), None)
        compile_s = r["first_step_s"] - eager["first_step_s"] if eager and r["scope"] != "eager" else None
        speedup = whole["first_step_s"] / r["first_step_s"] if whole and r["scope"] == "regions" else None
        losses = ", ".join(f"{loss:.6f}" for loss in r["losses"])
        print(
            f"| {r['preset']} | {r['params'] / 1e6:.1f}M | {r['scope']} | {r['first_step_s']:.1f} | "
            f"{'' if compile_s is None else f'{compile_s:.1f}'} | {'' if speedup is None else f'{speedup:.1f}x'} | "
            f"{r['step_s']:.2f} | {r['graphs']} | {losses} |"
        )
    for preset in args.presets:
        eager = next((r for r in results if r["preset"] == preset and r["scope"] == "eager"), None)
        for r in results:
            if eager and r["preset"] == preset and r["scope"] != "eager":
                worst = max(abs(a - b) / abs(b) for a, b in zip(r["losses"], eager["losses"]))
                print(f"\n{preset} {r['scope']}: largest relative loss difference to eager {worst:.1e}", end="")
    print()
    return results


if __name__ == "__main__":
    main()
