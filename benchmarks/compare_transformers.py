"""Training throughput, MFU and peak memory of hfzoo vs transformers' reference model of the same architecture.

For each family, an hfzoo model is built from a parity preset (`gpt2`, `bert`, `t5-v1.0`) at one of the
sizes below, and transformers' own model (`GPT2LMHeadModel`, `BertForMaskedLM`,
`T5ForConditionalGeneration`) from the converted config (`hfzoo.convert.*_config_from_hfzoo`), so both
have the same architecture and parameter count. Implementations: `hfzoo` (eager), `hfzoo-compiled`
(`--compile_scope regions`, as the recipes' `--torch_compile` does by default: each block of the repeated
layer list compiled in place, its graph reused, and one chunk of hfzoo's chunked loss as a region of its own,
`hfzoo.training.compilation.compile_regions`; `--compile_scope model`: the whole model as one graph, as
`--torch_compile_scope model` does), `transformers` (eager, the attention of `--attn_implementation`, SDPA by
default) and `transformers-compiled` (compiled the same way: regionally its `GPT2Block`, `BertLayer` or
`T5Block` lists, while its loss, computed outside its head by plain code, stays eager; or whole). The default
scope is `regions` on a GPU, where compiling a 12-layer model whole takes minutes, and `model` on the CPU, where
the small sizes compile whole in seconds and whole-model graphs give both implementations their
best steady-state speed. Each (size, family, precision,
implementation) case runs in a fresh process:
`--warmup_steps` (which include compilation; the first step's wall seconds are reported as `first step s`) then
`--steps` timed training steps (forward with labels and no KV cache, backward, AdamW step) on random tokens,
fp32 or bf16 autocast, without an attention mask (packed blocks, as the pretraining recipe trains on; hfzoo's
forwards as the recipe runs them: the batch's ids checked once on the CPU, the forwards inside
`caller_checked_ids()`, so that they read nothing back from the device);
then the loss on a held-out random batch (`eval loss`: compiled and eager runs of one implementation should
agree). The cases are repeated `--repeats` times, interleaved (A B C D A B C D ...), so that a change in the
machine's load hits every case alike; the table gives the median tokens/s (input tokens per second) with
the spread (min-max) over the repetitions, the MFU of the median (model FLOPs per token of
`hfzoo.models.flops` x tokens/s / peak of `hfzoo.training.throughput.resolve_peak_tflops`: this CPU's
measured matmul peak, or the GPU's datasheet peak, or `--peak_tflops`), and the peak memory the case added
(CPU: resident memory over the process after imports, `ru_maxrss`; CUDA: `torch.cuda.max_memory_allocated`).

Usage (prints a markdown table; `--sizes base` are the presets' own 768-wide sizes):

    python benchmarks/compare_transformers.py                      # small sizes, 5 interleaved repeats
    python benchmarks/compare_transformers.py --sizes small base --repeats 5
    python benchmarks/compare_transformers.py --device cuda --sizes base --seq_len 1024 --batch_size 8
    python benchmarks/compare_transformers.py --families decoder --precisions bf16 --steps 2 --repeats 1
    python benchmarks/compare_transformers.py --device cuda --sizes base --profile_dir profiles  # + where time goes

`--profile_dir` profiles `--profile_steps` more steps of each case after its timed ones (`torch.profiler`) and
writes the wall time per step, on CUDA the kernel time per step, the host-device synchronizations per step, and
two operator tables (by device time, by host time), one file per case.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import math
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

#: family -> (hfzoo preset, hfzoo Auto class, name of the config converter in hfzoo.convert, transformers class).
#: T5 v1.0 rather than v1.1: transformers 5.23 builds `T5ForConditionalGeneration` with a tied output layer even
#: for v1.1 configs, so only the tied v1.0 gives both sides the same parameters.
FAMILIES = {
    "decoder": ("gpt2", "AutoModelForCausalLM", "gpt2_config_from_hfzoo", "GPT2LMHeadModel"),
    "encoder": ("bert", "AutoModelForMaskedLM", "bert_config_from_hfzoo", "BertForMaskedLM"),
    "encoder-decoder": ("t5-v1.0", "AutoModelForSeq2SeqLM", "t5_config_from_hfzoo", "T5ForConditionalGeneration"),
}

#: size -> family -> overrides of the preset. `small` is small enough for a CPU run (the presets' other fields:
#: norms, activations, positions, ties, stay); `base` keeps the presets' own sizes (hidden 768, 12 layers).
SIZES = {
    "small": {
        "decoder": "vocab_size=8192,hidden_size=256,num_hidden_layers=4,num_attention_heads=4,intermediate_size=1024",
        "encoder": "vocab_size=8192,hidden_size=256,num_hidden_layers=4,num_attention_heads=4,intermediate_size=1024",
        "encoder-decoder": "vocab_size=8192,hidden_size=256,num_hidden_layers=2,num_decoder_layers=2,"
        "num_attention_heads=4,head_dim=64,intermediate_size=1024",
    },
    "base": {"decoder": None, "encoder": None, "encoder-decoder": None},
}

IMPLEMENTATIONS = ("hfzoo", "hfzoo-compiled", "transformers", "transformers-compiled")


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def run_case(size: str, family: str, implementation: str, precision: str, args: argparse.Namespace) -> dict:
    """Time `args.steps` training steps of one model in this process; return tokens/s, MFU inputs and peak memory.

    Args:
        size: a key of `SIZES`.
        family: a key of `FAMILIES`.
        implementation: one of `IMPLEMENTATIONS`.
        precision: "fp32" or "bf16" (autocast).
        args: the parsed command line (device, batch size, sequence length, steps, seed, attention backend).

    Returns:
        `{"tokens_per_s", "peak_mib", "params", "flops_per_token", "peak_tflops", "eval_loss"}`.
    """
    import torch
    import transformers

    import hfzoo  # noqa: F401  (registers the hfzoo classes with the Auto classes)
    from hfzoo import convert
    from hfzoo.models.flops import count_training_flops
    from hfzoo.models.presets import build_config
    from hfzoo.modules.embeddings import caller_checked_ids, check_batch_ids
    from hfzoo.training.compilation import compile_regions, no_cache_kwargs, separate_compile_caches_by_cpu_capability
    from hfzoo.training.throughput import Throughput, resolve_peak_tflops

    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    baseline = _peak_rss_mib()
    preset, auto_name, converter, reference_name = FAMILIES[family]
    config = build_config(preset, SIZES[size][family])
    is_hfzoo = implementation.startswith("hfzoo")
    if is_hfzoo:
        model = getattr(transformers, auto_name).from_config(config, attn_implementation=args.attn_implementation)
    else:
        reference_config = getattr(convert, converter)(config)
        model_class = getattr(transformers, reference_name)
        model = model_class._from_config(reference_config, attn_implementation=args.attn_implementation)
    model.to(device).train()
    if implementation.endswith("-compiled"):
        options = {"mode": args.compile_mode} if args.compile_mode else {}
        separate_compile_caches_by_cpu_capability()  # also for --compile_scope model
        if args.compile_scope == "model" or not compile_regions(model, **options):
            model.compile(**options)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    g = torch.Generator().manual_seed(args.seed)
    target_len = args.seq_len // 4

    def random_batch() -> dict:
        input_ids = torch.randint(5, config.vocab_size, (args.batch_size, args.seq_len), generator=g)
        # no attention mask: packed blocks, as the pretraining recipe trains on (`without_full_attention_mask`)
        batch = {"input_ids": input_ids, "labels": input_ids.clone()}
        if family == "encoder-decoder":
            batch["labels"] = torch.randint(5, config.vocab_size, (args.batch_size, target_len), generator=g)
        if is_hfzoo:  # checked here on the CPU, as the recipes check theirs; the forwards then skip their own checks
            check_batch_ids(batch, config.vocab_size)
        return {k: v.to(device) for k, v in batch.items()}

    batch, eval_batch = random_batch(), random_batch()
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
    no_cache = no_cache_kwargs(model)  # training builds no KV cache (as the recipes)

    def step() -> None:
        with autocast, caller_checked_ids() if is_hfzoo else contextlib.nullcontext():
            loss = model(**batch, **no_cache).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def synchronize() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    first_step_s = math.nan
    for warmup in range(args.warmup_steps):
        start = time.perf_counter()
        step()
        synchronize()
        if warmup == 0:
            first_step_s = time.perf_counter() - start
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    synchronize()
    elapsed = time.perf_counter() - start
    if args.profile_dir:
        name = f"{size}-{family}-{precision}-{implementation}.txt"
        (Path(args.profile_dir) / name).write_text(profile_steps(step, synchronize, device, args.profile_steps))
    with torch.no_grad(), autocast:
        eval_loss = float(model(**eval_batch, **no_cache).loss)
    decoder_len = target_len if family == "encoder-decoder" else None
    flops = count_training_flops(config, args.seq_len, decoder_len).total  # one sequence, forward + backward
    tokens = args.steps * args.batch_size * args.seq_len
    throughput = Throughput(resolve_peak_tflops(device, "bf16" if precision == "bf16" else "no", args.peak_tflops))
    throughput.metrics(tokens, tokens * flops / args.seq_len, elapsed)  # a CPU peak below this rate: measured again
    peak = throughput.peak
    memory = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else _peak_rss_mib() - baseline
    return {
        "tokens_per_s": tokens / elapsed,
        "flops_per_token": flops / args.seq_len,  # per input token, the unit of tokens_per_s
        "peak_tflops": peak.tflops,
        "peak_source": peak.source,
        "peak_mib": memory,
        "params": sum(p.numel() for p in model.parameters()),
        "eval_loss": eval_loss,
        "first_step_s": first_step_s,
    }


def profile_steps(step: Callable[[], None], synchronize: Callable[[], None], device, steps: int) -> str:
    """Run `steps` more training steps under `torch.profiler`; say where their time went, as text.

    Args:
        step: one training step (forward, backward, optimizer step).
        synchronize: waits for the device (a no-op on the CPU).
        device: the `torch.device` the model is on.
        steps: how many steps to profile.

    Returns:
        The wall milliseconds per step; on CUDA also the summed self device (kernel) milliseconds per step (wall
        minus that: time the GPU waited for the host); the values read back from the device per step
        (`aten::_local_scalar_dense` calls: on a GPU each is a host-device synchronization, after which the GPU
        idles until the host launches again); then the profiler's operator table sorted by self device time
        (CUDA, 40 rows, then the 25 rows of most self host time) or self CPU time (40 rows).
    """
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    synchronize()
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            step()
        synchronize()
        wall_ms = 1e3 * (time.perf_counter() - start) / steps
    events = prof.key_averages()
    lines = [f"profiled steps: {steps}; wall per step: {wall_ms:.2f} ms (profiler overhead included)"]
    if cuda:  # kernels only (an operator's self device time repeats its kernels')
        kernels = [e for e in events if e.device_type == DeviceType.CUDA]
        kernel_ms = sum(e.self_device_time_total for e in kernels) / steps / 1e3
        lines.append(f"device (kernel) time per step: {kernel_ms:.2f} ms ({100 * kernel_ms / wall_ms:.0f}% of wall)")
    reads = sum(e.count for e in events if e.key == "aten::_local_scalar_dense") / steps
    lines.append(f"values read back from the device per step (aten::_local_scalar_dense): {reads:g}")
    lines.append(events.table(sort_by="self_cuda_time_total" if cuda else "self_cpu_time_total", row_limit=40))
    if cuda:
        lines.append(events.table(sort_by="self_cpu_time_total", row_limit=25))
    return "\n".join(lines)


def _median_and_spread(values: list[float]) -> tuple[float, float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[0], ordered[-1]


def main(argv: list[str] | None = None) -> list[dict]:
    """Run every case `--repeats` times, interleaved, each in a fresh subprocess; print the table; return the rows."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--sizes", nargs="+", default=["small"], choices=list(SIZES))
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--implementations", nargs="+", default=list(IMPLEMENTATIONS), choices=IMPLEMENTATIONS)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--seq_len", type=int, default=128)
    parser.add_argument("--warmup_steps", type=int, default=3, help="untimed steps first (compilation included)")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repetitions of every case")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--attn_implementation", default="sdpa", choices=["eager", "sdpa", "flash_attention_2"])
    parser.add_argument("--compile_mode", default=None, help="torch.compile mode (default: torch's default)")
    parser.add_argument(
        "--compile_scope",
        default=None,
        choices=["regions", "model"],
        help="compiled cases: each repeated layer compiled once (regions, as --torch_compile) or the whole model "
        "(default: regions on cuda, model on cpu)",
    )
    parser.add_argument("--peak_tflops", type=float, default=None, help="peak TFLOP/s of the device for the MFU")
    parser.add_argument(
        "--profile_dir",
        default=None,
        help="after the timed steps, profile --profile_steps more of every case (torch.profiler) and write each "
        "case's operator table to SIZE-FAMILY-PRECISION-IMPLEMENTATION.txt in this folder",
    )
    parser.add_argument("--profile_steps", type=int, default=3)
    parser.add_argument("--case", nargs=4, metavar=("SIZE", "FAMILY", "IMPL", "PRECISION"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.compile_scope is None:
        args.compile_scope = "regions" if args.device == "cuda" else "model"
    if args.profile_dir:
        Path(args.profile_dir).mkdir(parents=True, exist_ok=True)
    if args.case:  # child process: one measurement, JSON on stdout
        print(json.dumps(run_case(*args.case, args)))
        return []

    common = [
        f"--device={args.device}",
        f"--batch_size={args.batch_size}",
        f"--seq_len={args.seq_len}",
        f"--warmup_steps={args.warmup_steps}",
        f"--steps={args.steps}",
        f"--seed={args.seed}",
        f"--attn_implementation={args.attn_implementation}",
        *([f"--compile_mode={args.compile_mode}"] if args.compile_mode else []),
        f"--compile_scope={args.compile_scope}",
        *([f"--peak_tflops={args.peak_tflops}"] if args.peak_tflops else []),
        *([f"--profile_dir={args.profile_dir}", f"--profile_steps={args.profile_steps}"] if args.profile_dir else []),
    ]
    cases = list(itertools.product(args.sizes, args.families, args.precisions, args.implementations))
    results: dict[tuple, list[dict]] = {case: [] for case in cases}
    for repeat in range(args.repeats):
        for size, family, precision, implementation in cases:  # A B C D, A B C D, ...: interleaved
            case_start = time.perf_counter()
            out = subprocess.run(
                [sys.executable, __file__, "--case", size, family, implementation, precision, *common],
                capture_output=True,
                text=True,
            )
            if out.returncode != 0:
                raise SystemExit(f"case {size} {family} {implementation} {precision} failed:\n{out.stderr[-3000:]}")
            result = json.loads(out.stdout.strip().splitlines()[-1])
            results[(size, family, precision, implementation)].append(result)
            print(  # progress, so that a run stopped by a time limit still says where its time went
                f"case {size} {family} {implementation} {precision}: {result['tokens_per_s']:,.0f} tokens/s, "
                f"first step {result['first_step_s']:.1f} s, {time.perf_counter() - case_start:.0f} s in all",
                file=sys.stderr,
                flush=True,
            )
        print(f"done: repetition {repeat + 1}/{args.repeats}", file=sys.stderr, flush=True)

    first = next(iter(results.values()))[0]
    print(
        f"\n{args.device}, batch {args.batch_size} x {args.seq_len} tokens, {args.steps} timed steps after "
        f"{args.warmup_steps} warm-up, AdamW, attention {args.attn_implementation}, compile mode "
        f"{args.compile_mode or 'default'} ({args.compile_scope}), {args.repeats} interleaved repetitions "
        "(median, min-max); "
        f"peak: {first['peak_source']}\n"
    )
    print(
        "| size | family (preset) | precision | params | implementation | tok/s median | min-max | vs transformers "
        "| MFU | eval loss | peak MiB | first step s |"
    )
    print("|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for size, family, precision, implementation in cases:
        runs = results[(size, family, precision, implementation)]
        median, low, high = _median_and_spread([r["tokens_per_s"] for r in runs])
        reference = results.get((size, family, precision, "transformers"))
        ratio = median / statistics.median(r["tokens_per_s"] for r in reference) if reference else math.nan
        # one peak per precision, the highest any case saw (a case measures it again when it ran faster)
        peak = max(r["peak_tflops"] or 0.0 for key, rs in results.items() if key[2] == precision for r in rs)
        mfu = median * runs[0]["flops_per_token"] / (peak * 1e12) if peak else math.nan
        row = {
            "size": size,
            "family": family,
            "precision": precision,
            "implementation": implementation,
            "tokens_per_s": [r["tokens_per_s"] for r in runs],
            "median": median,
            "ratio_to_transformers": ratio,
            "mfu": mfu,
            "eval_loss": statistics.median(r["eval_loss"] for r in runs),
            "peak_mib": statistics.median(r["peak_mib"] for r in runs),
            "params": runs[0]["params"],
            "first_step_s": statistics.median(r["first_step_s"] for r in runs),
        }
        rows.append(row)
        print(
            f"| {size} | {family} ({FAMILIES[family][0]}) | {precision} | {row['params'] / 1e6:.2f}M "
            f"| {implementation} | {median:,.0f} | {low:,.0f}-{high:,.0f} | {ratio:.2f} | {100 * mfu:.1f}% "
            f"| {row['eval_loss']:.4f} | {row['peak_mib']:,.0f} | {row['first_step_s']:.1f} |"
        )
    for size, family, precision in itertools.product(args.sizes, args.families, args.precisions):
        params = {r["params"] for r in rows if (r["size"], r["family"], r["precision"]) == (size, family, precision)}
        if len(params) > 1:
            print(f"\nWARNING: parameter counts differ for {size} {family} {precision}: {params}", file=sys.stderr)
    return rows


if __name__ == "__main__":
    main()
