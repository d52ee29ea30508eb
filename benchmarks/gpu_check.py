"""One check of hfzoo's speed on a GPU, in one table: training, the recipe, generation, DeepSpeed, fused relative bias.

Sections (each a fresh set of processes; `--sections` picks some):

- `training`: training tokens/s, MFU, peak memory and first-step seconds of hfzoo vs transformers' reference
  model at the `gpt2` preset, eager and compiled (`benchmarks/compare_transformers.py`; compiled as the recipes'
  `--torch_compile`: each repeated layer compiled once). `compile s` is the compiled case's first step minus the
  eager case's.
- `recipe`: the pretraining recipe itself (`accelerate launch recipes/pretrain.py`, bf16, `--torch_compile`,
  `--streaming`: the data pipeline included) for `--recipe_steps` steps on a Gutenberg shard, with a tokenizer
  trained first; its own logged tokens/s and MFU of the optimizer steps (`all_results.json`), next to the
  benchmark's compiled MFU.
- `deepspeed`: the same recipe under DeepSpeed ZeRO-2 and ZeRO-3 (one process; NCCL on a GPU, gloo on the CPU),
  uncompiled; the held-out loss after `--recipe_steps` steps next to the plain (non-DeepSpeed) run's.
- `generation`: greedy generation tokens/s at batch 1 and 8, dynamic cache eager and static cache with a compiled
  decoding step (`CompileConfig(mode="reduce-overhead")`, CUDA graphs, on a GPU), hfzoo vs transformers
  (`benchmarks/generation.py`).
- `flex`: the encoder-decoder at the `t5-v1.0` preset with T5's relative bias applied inside FlexAttention
  (`attn_implementation="flex_attention"`) vs SDPA with the materialized bias (`benchmarks/flex_bias.py`).

A section that fails is reported as one `FAILED` row with the end of its error, and the other sections still
run; the command then exits with status 1. Each section's wall seconds are a row of their own.

Usage (prints one markdown table; `--output_json` also writes its rows; `--profile_dir DIR` also writes a
`torch.profiler` operator table of each training case to DIR):

    python benchmarks/gpu_check.py                          # one GPU: gpt2 at seq 1024, bf16 (minutes on one H100)
    python benchmarks/gpu_check.py --device cpu --tiny      # every section at a tiny size on the CPU

On a CPU every section trains in the precision of the recipes' `--mixed_precision auto`: bf16 where the CPU
computes it natively (AVX512-BF16, AMX), fp32 elsewhere.

Data: `--data_dir` (default `$HFZOO_DATA_DIR`, else `../shared/data` beside the checkout).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent
REPO = BENCHMARKS.parent
sys.path.insert(0, str(BENCHMARKS))

SECTIONS = ("training", "recipe", "deepspeed", "generation", "flex")

#: `--tiny` (any device) vs the full check (a GPU): the sizes each section runs at.
SCALES = {
    "full": {
        "size": "base",
        "seq_len": 1024,
        "batch_size": 16,
        "steps": 20,
        "warmup_steps": 3,
        "recipe_config": ("gpt2", "vocab_size=50257"),
        "generation": "--size base --new_tokens 128 --repeats 3".split(),
        "flex": "--size base --seq_len 1024 --batch_size 8 --steps 10 --repeats 1 --mode train --compile_only".split(),
        "tokenizer_characters": "20000000",
        "tokenizer_vocab": "8192",
    },
    "tiny": {
        "size": "small",
        "seq_len": 32,
        "batch_size": 2,
        "steps": 2,
        "warmup_steps": 1,
        "recipe_config": ("decoder-tiny", "max_position_embeddings=64"),
        "generation": "--size small --new_tokens 4 --repeats 1 --batch_sizes 1 2".split(),
        "flex": "--size small --seq_len 32 --batch_size 2 --steps 1 --warmup_steps 1 --repeats 1".split(),
        "tokenizer_characters": "300000",
        "tokenizer_vocab": "512",
    },
}


def _row(section: str, case: str, hfzoo: float, reference: float | None, unit: str, note: str = "") -> dict:
    """One table row: hfzoo's value, the reference's (transformers, or the plain run), and their ratio."""
    ratio = hfzoo / reference if reference not in (None, 0) and not math.isnan(reference) else math.nan
    return {
        "section": section,
        "case": case,
        "hfzoo": hfzoo,
        "reference": reference,
        "ratio": ratio,
        "unit": unit,
        "note": note,
    }


def training_rows(args: argparse.Namespace, scale: dict) -> list[dict]:
    """Compare hfzoo with transformers at the `gpt2` preset, eager and compiled (`compare_transformers.py`)."""
    import compare_transformers

    results = compare_transformers.main(
        [
            "--device",
            args.device,
            "--families",
            "decoder",
            "--sizes",
            scale["size"],
            "--precisions",
            args.precision,
            "--seq_len",
            str(scale["seq_len"]),
            "--batch_size",
            str(scale["batch_size"]),
            "--steps",
            str(scale["steps"]),
            "--warmup_steps",
            str(scale["warmup_steps"]),
            "--repeats",
            "1",
            "--compile_scope",
            "regions",  # as the recipe's --torch_compile (on the CPU too, where the benchmark's default is model)
            *(["--profile_dir", args.profile_dir] if args.profile_dir else []),
        ]
    )
    by_name = {r["implementation"]: r for r in results}
    rows = []
    for kind, hf, tr in (("eager", "hfzoo", "transformers"), ("compiled", "hfzoo-compiled", "transformers-compiled")):
        a, b = by_name[hf], by_name[tr]
        shape = f"gpt2 ({scale['size']}), {args.precision}, {scale['batch_size']} x {scale['seq_len']}"
        rows.append(_row("training", f"tokens/s, {kind}", a["median"], b["median"], "tokens/s", shape))
        rows.append(_row("training", f"MFU, {kind}", 100 * a["mfu"], 100 * b["mfu"], "%"))
        rows.append(_row("training", f"peak memory, {kind}", a["peak_mib"], b["peak_mib"], "MiB"))
    compile_s = {
        name: by_name[f"{name}-compiled"]["first_step_s"] - by_name[name]["first_step_s"]
        for name in ("hfzoo", "transformers")
    }
    rows.append(
        _row("training", "compile time (first step minus eager's)", compile_s["hfzoo"], compile_s["transformers"], "s")
    )
    return rows


def _launch(config: str, argv: list[str], env: dict[str, str]) -> dict:
    """`accelerate launch --config_file accelerate_configs/CONFIG recipes/pretrain.py ARGV`; its all_results.json."""
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               str(REPO / "accelerate_configs" / config), "--num_processes", "1",
               str(REPO / "recipes" / "pretrain.py"), *argv]  # fmt: skip
    proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{proc.stderr[-4000:]}")
    output_dir = Path(argv[argv.index("--output_dir") + 1])
    return json.loads((output_dir / "all_results.json").read_text())


def recipe_runs(args: argparse.Namespace, scale: dict, workdir: Path, deepspeed: bool) -> list[dict]:
    """The recipe's own speed, compiled; and DeepSpeed ZeRO-2/3 losses next to a plain run's."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    shard = Path(args.data_dir) / "gutenberg" / "pg_top100_en.00.jsonl.xz"
    tokenizer = workdir / "tokenizer"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "hfzoo.pretraining.tokenizer",
            "--train_file",
            str(shard),
            "--max_characters",
            scale["tokenizer_characters"],
            "--vocab_size",
            scale["tokenizer_vocab"],
            "--model_family",
            "decoder",
            "--output_dir",
            str(tokenizer),
        ],
        check=True,
        cwd=REPO,
        env=env,
        capture_output=True,
    )
    preset, overrides = scale["recipe_config"]
    block = str(scale["seq_len"])
    common = [
        "--train_file",
        str(shard),
        "--tokenizer_name",
        str(tokenizer),
        "--config_name",
        preset,
        "--config_overrides",
        overrides,
        "--block_size",
        block,
        "--streaming",
        "--per_device_train_batch_size",
        str(scale["batch_size"]),
        "--per_device_eval_batch_size",
        str(scale["batch_size"]),
        "--max_train_steps",
        str(args.recipe_steps),
        "--num_warmup_steps",
        str(max(1, args.recipe_steps // 10)),
        "--validation_split_percentage",
        "1",
        "--max_eval_samples",
        str(4 * scale["batch_size"]),
        "--mixed_precision",
        "bf16" if args.precision == "bf16" else "no",
        "--attn_implementation",
        "sdpa",
        "--logging_steps",
        "10",
        "--seed",
        "0",
    ]
    single = "single_gpu.yaml" if args.device == "cuda" else "cpu_single_process.yaml"
    rows = []
    compiled = _launch(single, [*common, "--torch_compile", "--output_dir", str(workdir / "compiled")], env)
    rows.append(
        _row(
            "recipe",
            f"tokens/s ({args.recipe_steps} steps, compiled)",
            compiled["train_step_tokens_per_second"],
            None,
            "tokens/s",
            f"{preset}, {args.precision}, streamed data",
        )
    )
    rows.append(_row("recipe", "MFU (compiled)", 100 * (compiled["train_mfu"] or math.nan), None, "%"))
    if deepspeed:
        plain = _launch(single, [*common, "--output_dir", str(workdir / "plain")], env)
        rows.append(
            _row(
                "deepspeed",
                f"eval loss after {args.recipe_steps} steps, plain",
                plain["eval_loss"],
                plain["eval_loss"],
                "nats",
            )
        )
        for stage in (2, 3):
            run = _launch(f"deepspeed_zero{stage}.yaml", [*common, "--output_dir", str(workdir / f"zero{stage}")], env)
            rows.append(
                _row(
                    "deepspeed",
                    f"eval loss after {args.recipe_steps} steps, ZeRO-{stage}",
                    run["eval_loss"],
                    plain["eval_loss"],
                    "nats",
                    "reference: the plain run",
                )
            )
    return rows


def generation_rows(args: argparse.Namespace, scale: dict) -> list[dict]:
    """Greedy generation, hfzoo vs transformers (`generation.py`)."""
    import generation

    results = generation.main(["--device", args.device, *scale["generation"]])
    rows = []
    for batch in sorted({r["batch_size"] for r in results}):
        for setup in generation.SETUPS:
            rate = {r["implementation"]: r for r in results if (r["batch_size"], r["setup"]) == (batch, setup)}
            same = all(r["same_tokens"] for r in rate.values())
            note = "same tokens as eager" if same else "TOKENS DIFFER"
            if setup == "static compiled" and not all(r["compiled"] for r in rate.values()):
                note += "; DECODING NOT COMPILED"
            rows.append(
                _row(
                    "generation",
                    f"tokens/s, batch {batch}, {setup}",
                    rate["hfzoo"]["tokens_per_s"],
                    rate["transformers"]["tokens_per_s"],
                    "tokens/s",
                    note,
                )
            )
        eager = next(
            r
            for r in results
            if (r["batch_size"], r["setup"], r["implementation"]) == (batch, "dynamic eager", "hfzoo")
        )
        static = next(
            r
            for r in results
            if (r["batch_size"], r["setup"], r["implementation"]) == (batch, "static compiled", "hfzoo")
        )
        rows.append(
            _row(
                "generation",
                f"hfzoo static compiled vs dynamic eager, batch {batch}",
                static["tokens_per_s"],
                eager["tokens_per_s"],
                "tokens/s",
                "reference: hfzoo dynamic eager",
            )
        )
    return rows


def flex_rows(args: argparse.Namespace, scale: dict) -> list[dict]:
    """T5 relative bias in FlexAttention vs SDPA with the materialized bias (`flex_bias.py`)."""
    import flex_bias

    results = flex_bias.main(["--device", args.device, *scale["flex"]])
    compiled = args.device == "cuda"  # inductor's CPU FlexAttention lowering fails inside a compiled model
    by_backend = {r["backend"]: r for r in results if r["compiled"] == compiled}
    flex, sdpa = by_backend["flex_attention"], by_backend["sdpa"]
    note = f"{'compiled (regions), training' if compiled else 'eager, forward'}; reference: SDPA + dense bias"
    return [
        _row("flex", "t5-v1.0 tokens/s, flex score_mod", flex["median"], sdpa["median"], "tokens/s", note),
        _row("flex", "t5-v1.0 peak memory, flex score_mod", flex["peak_mib"], sdpa["peak_mib"], "MiB"),
    ]


def print_table(rows: list[dict], header: str) -> None:
    """The rows as one markdown table."""
    print(f"\n{header}\n")
    print("| section | measurement | hfzoo | reference | ratio | unit | note |")
    print("|---|---|---:|---:|---:|---|---|")
    for r in rows:
        reference = "" if r["reference"] is None else f"{r['reference']:,.4g}"
        ratio = "" if math.isnan(r["ratio"]) else f"{r['ratio']:.2f}"
        value = f"{r['hfzoo']:,.4g}"
        print(f"| {r['section']} | {r['case']} | {value} | {reference} | {ratio} | {r['unit']} | {r['note']} |")


def main(argv: list[str] | None = None) -> list[dict]:
    """Run the sections, print the table, return its rows.

    Raises:
        SystemExit: an unknown section, no CUDA device for `--device cuda`, missing data, or a failed run.
    """
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="every section at a tiny size (a quick run anywhere)")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--recipe_steps", type=int, default=50, help="optimizer steps of the recipe runs")
    default_data = os.environ.get("HFZOO_DATA_DIR", str(REPO.parent / "shared" / "data"))
    parser.add_argument("--data_dir", default=default_data, help="the real data (gutenberg/)")
    parser.add_argument("--output_json", default=None, help="also write the rows here")
    parser.add_argument("--profile_dir", default=None, help="also profile each training case (operator tables)")
    args = parser.parse_args(argv)
    import torch

    from hfzoo.training.precision import resolve_mixed_precision

    # bf16 on a GPU; on a CPU the recipes' `--mixed_precision auto` (fp32 where bf16 is emulated, 100x slower)
    auto = resolve_mixed_precision("auto", device_type="cpu").mixed_precision if args.device == "cpu" else "bf16"
    args.precision = "bf16" if auto == "bf16" else "fp32"

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda: no CUDA device here (use --device cpu --tiny for a CPU run)")
    if {"recipe", "deepspeed"} & set(args.sections) and not (Path(args.data_dir) / "gutenberg").is_dir():
        raise SystemExit(f"error: --data_dir {args.data_dir}: no gutenberg/ folder (set HFZOO_DATA_DIR)")
    scale = SCALES["tiny" if args.tiny else "full"]
    start = time.perf_counter()
    rows: list[dict] = []
    failed = []

    def run_section(name: str, section: Callable[[], list[dict]]) -> None:
        section_start = time.perf_counter()
        try:
            rows.extend(section())
        except (Exception, SystemExit) as error:  # the other sections still run; the command exits 1 at the end
            message = " ".join(str(error).split())[-300:]
            print(f"section {name} FAILED: {error}", file=sys.stderr, flush=True)
            rows.append(_row(name, "FAILED", math.nan, None, "", message.replace("|", "/")))
            failed.append(name)
        rows.append(_row(name, "section wall time", time.perf_counter() - section_start, None, "s"))
        print(f"section {name}: {time.perf_counter() - section_start:.0f} s", file=sys.stderr, flush=True)

    if "training" in args.sections:
        run_section("training", lambda: training_rows(args, scale))
    if {"recipe", "deepspeed"} & set(args.sections):
        with tempfile.TemporaryDirectory(prefix="hfzoo-gpu-check-") as tmp:
            deepspeed = "deepspeed" in args.sections
            run_section("recipe", lambda: recipe_runs(args, scale, Path(tmp), deepspeed=deepspeed))
    if "generation" in args.sections:
        run_section("generation", lambda: generation_rows(args, scale))
    if "flex" in args.sections:
        run_section("flex", lambda: flex_rows(args, scale))
    device = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU ({os.cpu_count()} cores)"
    import transformers

    header = (
        f"{device}; torch {torch.__version__}, transformers {transformers.__version__}; "
        f"{'tiny' if args.tiny else 'full'} sizes; {time.perf_counter() - start:.0f} s in all"
    )
    print_table(rows, header)
    if args.output_json:
        Path(args.output_json).write_text(json.dumps({"header": header, "rows": rows}, indent=1) + "\n")
    if failed:
        raise SystemExit(f"error: sections failed: {', '.join(failed)} (their FAILED rows say why)")
    return rows


if __name__ == "__main__":
    main()
