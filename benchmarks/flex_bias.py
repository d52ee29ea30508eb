"""Throughput and peak memory of T5's relative bias on FlexAttention vs SDPA with the materialized bias.

The encoder-decoder of the `t5-v1.0` preset (shared bucketed relative bias, Raffel et al. 2020 §2.1) is run
with `attn_implementation="sdpa"` (the bias folded into a dense `(batch, heads, q_len, kv_len)` float mask,
which rules out SDPA's flash kernel) and `"flex_attention"` (the bias added by a FlexAttention `score_mod`,
`hfzoo.modules.positions.RelativeScoreBias`; the padding / causal mask a `BlockMask`). Attention dropout is
set to 0 for both (FlexAttention has none). Each (backend, compiled) case runs in a fresh process:
`--warmup_steps` (which include compilation) then `--steps` timed steps on random tokens (all real, the
decoder a quarter of the source length, as `compare_transformers.py`), repeated `--repeats` times,
interleaved. The table gives the median tokens/s (source tokens per second) with the spread (min-max) and
the median peak memory the case added (CPU: resident memory over the process after imports, `ru_maxrss`;
CUDA: `torch.cuda.max_memory_allocated`).

`--mode train` times training steps (forward with labels, backward, AdamW); `--mode forward` times forward
passes with labels under `torch.no_grad()`. PyTorch 2.13 has no FlexAttention backward on the CPU, so the
CPU runs `--mode forward` (the default there); `--compile` also runs each backend compiled, `--compile_only`
only compiled: as the recipes' `--torch_compile`, each repeated block compiled once
(`hfzoo.training.compilation.compile_regions`), or with `--compile_scope model` the whole model
(`model.compile()`); uncompiled, transformers' flex path compiles `flex_attention` alone. On the CPU a
compiled model with `flex_attention` is skipped: inductor's CPU FlexAttention lowering fails inside a
compiled hfzoo model (PyTorch 2.13, with or without a score bias).

Usage (prints a markdown table):

    python benchmarks/flex_bias.py                                   # CPU, small size, forward
    python benchmarks/flex_bias.py --seq_len 128 --steps 3 --repeats 3 --compile
    python benchmarks/flex_bias.py --device cuda --size base --seq_len 1024 --batch_size 8 --mode train --compile
    python benchmarks/flex_bias.py --device cuda --size base --seq_len 1024 --batch_size 8 --compile_only
"""

from __future__ import annotations

import argparse
import itertools
import json
import resource
import statistics
import subprocess
import sys
import time

#: size -> overrides of the `t5-v1.0` preset (`base` keeps its own: hidden 768, 12 + 12 layers, 12 heads).
SIZES = {
    "small": "vocab_size=8192,hidden_size=256,num_hidden_layers=2,num_decoder_layers=2,num_attention_heads=4,"
    "head_dim=64,intermediate_size=1024",
    "base": "",
}
BACKENDS = ("sdpa", "flex_attention")


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def run_case(backend: str, compiled: bool, args: argparse.Namespace) -> dict:
    """Time `args.steps` steps of the `t5-v1.0` encoder-decoder with one attention backend, in this process.

    Args:
        backend: `"sdpa"` or `"flex_attention"`.
        compiled: compile the model: its repeated blocks (`compile_regions`) or, with `args.compile_scope ==
            "model"`, the whole model (`torch.nn.Module.compile`).
        args: the parsed command line (device, size, batch size, sequence length, steps, mode, compile scope,
            seed).

    Returns:
        `{"tokens_per_s", "peak_mib", "loss"}` (the loss of the last step, to check both backends agree).

    Raises:
        SystemExit: `--mode train` with `flex_attention` on the CPU (no FlexAttention backward there).
    """
    import torch
    import transformers

    import hfzoo  # noqa: F401  (registers the hfzoo classes with the Auto classes)
    from hfzoo.models.presets import build_config
    from hfzoo.training.compilation import compile_regions, separate_compile_caches_by_cpu_capability

    device = torch.device(args.device)
    if args.mode == "train" and backend == "flex_attention" and device.type == "cpu":
        raise SystemExit("PyTorch has no FlexAttention backward on the CPU: use --mode forward or --device cuda")
    torch.manual_seed(args.seed)
    baseline = _peak_rss_mib()
    overrides = ",".join(filter(None, [SIZES[args.size], "attention_probs_dropout_prob=0.0"]))
    config = build_config("t5-v1.0", overrides)
    model = transformers.AutoModelForSeq2SeqLM.from_config(config, attn_implementation=backend).to(device)
    model.train(args.mode == "train")
    if compiled:
        separate_compile_caches_by_cpu_capability()  # also for --compile_scope model
    if compiled and (args.compile_scope == "model" or not compile_regions(model)):
        model.compile()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4) if args.mode == "train" else None
    g = torch.Generator().manual_seed(args.seed)
    input_ids = torch.randint(5, config.vocab_size, (args.batch_size, args.seq_len), generator=g)
    labels = torch.randint(5, config.vocab_size, (args.batch_size, max(1, args.seq_len // 4)), generator=g)
    batch = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels}
    batch = {k: v.to(device) for k, v in batch.items()}

    def step() -> float:
        if optimizer is None:
            with torch.no_grad():
                return float(model(**batch).loss)
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss)

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(args.warmup_steps):
        step()
    synchronize()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(args.steps):
        loss = step()
    synchronize()
    elapsed = time.perf_counter() - start
    memory = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else _peak_rss_mib() - baseline
    return {"tokens_per_s": args.steps * args.batch_size * args.seq_len / elapsed, "peak_mib": memory, "loss": loss}


def build_parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--size", choices=tuple(SIZES), default="small")
    parser.add_argument("--batch_size", type=int, default=2)
    parser.add_argument("--seq_len", type=int, default=128, help="source tokens; the decoder gets a quarter")
    parser.add_argument("--mode", choices=("train", "forward"), help="default: train on cuda, forward on cpu")
    parser.add_argument("--compile", action="store_true", help="also run each backend compiled")
    parser.add_argument("--compile_only", action="store_true", help="run each backend compiled only")
    parser.add_argument(
        "--compile_scope",
        choices=("regions", "model"),
        default="regions",
        help="compiled cases: each repeated block compiled once (as --torch_compile) or the whole model",
    )
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument("--warmup_steps", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--case", nargs=2, metavar=("BACKEND", "COMPILED"), help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> list[dict]:
    """Run every case `--repeats` times, interleaved, each in a fresh subprocess; print the table; return the rows."""
    args = build_parser().parse_args(argv)
    args.mode = args.mode or ("train" if args.device == "cuda" else "forward")
    if args.case:
        print(json.dumps(run_case(args.case[0], args.case[1] == "1", args)))
        return []
    common = [
        f"--device={args.device}",
        f"--size={args.size}",
        f"--batch_size={args.batch_size}",
        f"--seq_len={args.seq_len}",
        f"--mode={args.mode}",
        f"--warmup_steps={args.warmup_steps}",
        f"--steps={args.steps}",
        f"--seed={args.seed}",
        f"--compile_scope={args.compile_scope}",
    ]
    compiled_options = [True] if args.compile_only else [False, True] if args.compile else [False]
    cases = list(itertools.product(args.backends, compiled_options))
    if args.device == "cpu" and ("flex_attention", True) in cases:
        # inductor's CPU FlexAttention lowering fails inside a compiled hfzoo model (with or without a score
        # bias: "not enough values to unpack" on the queries' layout, PyTorch 2.13)
        cases.remove(("flex_attention", True))
        print("skipped: flex_attention in a compiled model on the CPU (inductor lowering fails)", file=sys.stderr)
    results: dict[tuple, list[dict]] = {case: [] for case in cases}
    for repeat in range(args.repeats):
        for backend, compiled in cases:  # interleaved: A B C D, A B C D, ...
            case_start = time.perf_counter()
            out = subprocess.run(
                [sys.executable, __file__, "--case", backend, str(int(compiled)), *common],
                capture_output=True,
                text=True,
            )
            if out.returncode != 0:
                raise SystemExit(f"case {backend} compiled={compiled} failed:\n{out.stderr[-3000:]}")
            result = json.loads(out.stdout.strip().splitlines()[-1])
            results[(backend, compiled)].append(result)
            print(  # progress, so that a run stopped by a time limit still says where its time went
                f"case {backend} compiled={compiled}: {result['tokens_per_s']:,.0f} tokens/s, "
                f"{time.perf_counter() - case_start:.0f} s in all",
                file=sys.stderr,
                flush=True,
            )
        print(f"done: repetition {repeat + 1}/{args.repeats}", file=sys.stderr, flush=True)

    print(
        f"\nt5-v1.0 ({args.size}), {args.device}, {args.mode}, batch {args.batch_size} x {args.seq_len} source "
        f"tokens ({max(1, args.seq_len // 4)} decoder), compiled: {args.compile_scope}, "
        f"{args.steps} timed steps after {args.warmup_steps} warm-up, "
        f"{args.repeats} interleaved repetitions (median, min-max)\n"
    )
    print("| backend | score bias | compiled | tok/s median | min-max | peak MiB | loss |")
    print("|---|---|---|---:|---:|---:|---:|")
    rows = []
    for backend, compiled in cases:
        runs = results[(backend, compiled)]
        speeds = sorted(r["tokens_per_s"] for r in runs)
        row = {
            "backend": backend,
            "compiled": compiled,
            "tokens_per_s": speeds,
            "median": statistics.median(speeds),
            "peak_mib": statistics.median(r["peak_mib"] for r in runs),
            "loss": runs[-1]["loss"],
        }
        rows.append(row)
        bias = "score_mod" if backend == "flex_attention" else "dense mask"
        print(
            f"| {backend} | {bias} | {'yes' if compiled else 'no'} | {row['median']:.0f} | {speeds[0]:.0f}-"
            f"{speeds[-1]:.0f} | {row['peak_mib']:.0f} | {row['loss']:.4f} |"
        )
    return rows


if __name__ == "__main__":
    main()
