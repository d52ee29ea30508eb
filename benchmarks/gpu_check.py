"""One check of hfzoo's speed on a GPU, in one table: training, the recipe, generation, DeepSpeed, fused relative bias.

Sections (each a fresh set of processes; `--sections` picks some):

- `training`: training tokens/s, MFU, peak memory and first-step seconds of hfzoo vs transformers' reference
  model at the `gpt2` preset, eager and compiled (`benchmarks/compare_transformers.py`; compiled as the recipes'
  `--torch_compile`: each repeated layer compiled once). `compile s` is the compiled case's first step minus the
  eager case's.
- `recipe`: the pretraining recipe itself (`accelerate launch recipes/pretrain.py`, bf16, `--torch_compile`,
  `--streaming`: the data pipeline included) for `--recipe_steps` steps on a Gutenberg shard, with a tokenizer
  trained first; its own logged tokens/s and MFU (`train_history.json`) over the windows after its first (the
  first holds compilation and warm-up; comparable with the training section's compiled MFU), and over all its
  steps (`all_results.json`).
- `deepspeed`: the same recipe under DeepSpeed ZeRO-2 and ZeRO-3 (one process each; NCCL on a GPU, gloo on the
  CPU), uncompiled; the held-out loss after `--recipe_steps` steps next to the plain (non-DeepSpeed) run's. The
  three runs are launched at once (their losses are compared, not their speed).
- `generation`: greedy generation tokens/s at batch 1 and 8, dynamic cache eager and static cache with a compiled
  decoding step (`CompileConfig(mode="reduce-overhead")`, CUDA graphs, on a GPU), hfzoo vs transformers
  (`benchmarks/generation.py`).
- `flex`: the encoder-decoder at the `t5-v1.0` preset with T5's relative bias applied inside FlexAttention
  (`attn_implementation="flex_attention"`) vs SDPA with the materialized bias (`benchmarks/flex_bias.py`).

A section that fails is reported as one `FAILED` row with the end of its error, and the other sections still
run; the command then exits with status 1. Each section's wall seconds are a row of their own.

Usage (prints one markdown table; `--output_json` also writes its rows; `--profile_dir DIR` also writes a
`torch.profiler` operator table of each training and generation case to DIR; `--log_dir DIR` keeps each recipe
launch's output there; progress, with each launch's wall seconds, goes to standard error):

    python benchmarks/gpu_check.py                          # one GPU: gpt2 at seq 1024, bf16 (minutes on one H100)
    python benchmarks/gpu_check.py --device cpu --tiny      # every section at a tiny size on the CPU

On a CPU every section trains in the precision of the recipes' `--mixed_precision auto`: bf16 where the CPU
computes it natively (AVX512-BF16, AMX), fp32 elsewhere.

Data: `--data_dir` (default `$HFZOO_DATA_DIR`, else `../shared/data` beside the checkout).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
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
        "tokenizer_characters": "4000000",
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


@dataclass
class Launch:
    """One running `accelerate launch ... recipes/pretrain.py` (`start_launch`), its output going to `log`."""

    name: str
    command: list[str]
    output_dir: Path
    log: Path
    process: subprocess.Popen
    started: float


def start_launch(name: str, config: str, argv: list[str], env: dict[str, str], log_dir: Path) -> Launch:
    """Start `accelerate launch --config_file accelerate_configs/CONFIG recipes/pretrain.py ARGV` (one process).

    Its output goes to `log_dir/recipe-NAME.txt`; it gets a rendezvous port of its own, so that several can run at
    once. `ARGV` must hold `--output_dir`.
    """
    from accelerate.utils.other import get_free_port

    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               str(REPO / "accelerate_configs" / config), "--num_processes", "1",
               "--main_process_port", str(get_free_port()), str(REPO / "recipes" / "pretrain.py"), *argv]  # fmt: skip
    log = log_dir / f"recipe-{name}.txt"
    with open(log, "w") as handle:  # the child keeps its own descriptor
        process = subprocess.Popen(command, cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT)
    print(f"recipe launch {name}: started (output in {log})", file=sys.stderr, flush=True)
    output_dir = Path(argv[argv.index("--output_dir") + 1])
    return Launch(name, command, output_dir, log, process, time.perf_counter())


def finish_launch(launch: Launch) -> dict:
    """Wait for a launch; its `all_results.json`, with `launch_seconds` (wall) and `log_history` (its records).

    Raises:
        SystemExit: the launch failed (the end of its output is in the message).
    """
    returncode = launch.process.wait()
    seconds = time.perf_counter() - launch.started
    print(f"recipe launch {launch.name}: exit {returncode} after {seconds:.0f} s", file=sys.stderr, flush=True)
    if returncode != 0:
        tail = launch.log.read_text(errors="replace")[-4000:]
        raise SystemExit(f"{' '.join(launch.command)} failed:\n{tail}")
    results = json.loads((launch.output_dir / "all_results.json").read_text())
    results["launch_seconds"] = seconds
    results["log_history"] = json.loads((launch.output_dir / "train_history.json").read_text())["log_history"]
    tokens_per_s, mfu, steps = steady_rate(results["log_history"])
    print(  # already in the log should a later launch run out of time
        f"recipe launch {launch.name}: eval loss {results['eval_loss']:.4f}; steps {steps or '-'}: "
        f"{tokens_per_s:,.0f} tokens/s, MFU {100 * mfu:.2f}%",
        file=sys.stderr,
        flush=True,
    )
    return results


def steady_rate(log_history: list[dict]) -> tuple[float, float, str]:
    """Tokens/s and MFU (fraction) of a run's logged windows after its first (which holds compilation and warm-up).

    Args:
        log_history: the run's training records (`train_history.json`), each with `step`, `step_seconds` (the
            window's optimizer-step seconds), `tokens_per_second` and, where a peak is known, `mfu`.

    Returns:
        `(tokens_per_second, mfu, steps)`: the windows' total tokens over their total seconds, their
        time-weighted MFU (NaN without one), and which steps they cover (e.g. "11-50"); NaNs and "" when the
        run logged a single window.
    """
    first, rest = log_history[:1], log_history[1:]
    seconds = sum(r["step_seconds"] for r in rest)
    if not first or not rest or seconds <= 0:
        return math.nan, math.nan, ""
    tokens = sum(r["tokens_per_second"] * r["step_seconds"] for r in rest)
    mfu = sum(r["mfu"] * r["step_seconds"] for r in rest) / seconds if all("mfu" in r for r in rest) else math.nan
    return tokens / seconds, mfu, f"{first[0]['step'] + 1}-{rest[-1]['step']}"


@dataclass
class RecipeSetup:
    """What the recipe and DeepSpeed launches share: a tokenizer trained once, their common arguments."""

    common: list[str]
    env: dict[str, str]
    log_dir: Path
    workdir: Path
    single: str  # the one-process accelerate config of this device
    shape: str  # the note of the recipe rows


def recipe_setup(args: argparse.Namespace, scale: dict, workdir: Path) -> RecipeSetup:
    """Train the recipes' tokenizer on a Gutenberg shard and assemble the launches' common arguments.

    Each launch's output is kept in `args.log_dir` (default: `workdir`).

    Raises:
        subprocess.CalledProcessError: the tokenizer training failed.
    """
    env = dict(os.environ)  # the tokenizer on every core, as in a user's run (streamed data is tokenized as it trains)
    log_dir = Path(args.log_dir) if args.log_dir else workdir
    log_dir.mkdir(parents=True, exist_ok=True)
    shard = Path(args.data_dir) / "gutenberg" / "pg_top100_en.00.jsonl.xz"
    tokenizer = workdir / "tokenizer"
    start = time.perf_counter()
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
    print(f"recipe: tokenizer trained in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    preset, overrides = scale["recipe_config"]
    block = str(scale["seq_len"])
    logging_steps = max(1, args.recipe_steps // 5)  # the first record holds compilation; the others are timed
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
        str(logging_steps),
        "--seed",
        "0",
    ]
    single = "single_gpu.yaml" if args.device == "cuda" else "cpu_single_process.yaml"
    shape = f"{preset}, {args.precision}, {scale['batch_size']} x {block}, streamed data"
    return RecipeSetup(common, env, log_dir, workdir, single, shape)


def recipe_rows(args: argparse.Namespace, setup: RecipeSetup) -> list[dict]:
    """The recipe's own speed, compiled (one launch, alone, since it is timed)."""
    rows = []
    argv = [*setup.common, "--torch_compile", "--output_dir", str(setup.workdir / "compiled")]
    compiled = finish_launch(start_launch("compiled", setup.single, argv, setup.env, setup.log_dir))
    tokens_per_s, mfu, steps = steady_rate(compiled["log_history"])
    rows.append(_row("recipe", f"tokens/s, compiled, steps {steps}", tokens_per_s, None, "tokens/s", setup.shape))
    note = "compare: training, MFU, compiled"
    rows.append(_row("recipe", f"MFU, compiled, steps {steps}", 100 * mfu, None, "%", note))
    rows.append(
        _row(
            "recipe",
            f"tokens/s, compiled, all {args.recipe_steps} steps",
            compiled["train_step_tokens_per_second"],
            None,
            "tokens/s",
            "the first window's compilation and warm-up included",
        )
    )
    rows.append(_row("recipe", "launch wall time, compiled", compiled["launch_seconds"], None, "s"))
    return rows


def deepspeed_rows(args: argparse.Namespace, setup: RecipeSetup) -> list[dict]:
    """DeepSpeed ZeRO-2/3 losses next to a plain run's: the three launched at once (their speed is not compared).

    Raises:
        SystemExit: DeepSpeed does not import here, or a launch failed (the end of its output is in the message).
    """
    probe = subprocess.run([sys.executable, "-c", "import deepspeed"], capture_output=True, text=True, env=setup.env)
    if probe.returncode != 0:  # say so once, not in each launch's traceback
        raise SystemExit(f"deepspeed does not import here: {probe.stderr.strip().splitlines()[-1:]}")
    rows = []
    common, env, log_dir, single, workdir = setup.common, setup.env, setup.log_dir, setup.single, setup.workdir
    launches = [start_launch("plain", single, [*common, "--output_dir", str(workdir / "plain")], env, log_dir)]
    for stage in (2, 3):
        argv = [*common, "--output_dir", str(workdir / f"zero{stage}")]
        launches.append(start_launch(f"zero{stage}", f"deepspeed_zero{stage}.yaml", argv, env, log_dir))
    failures = []
    results = {}
    for launch in launches:  # wait for all of them, even after a failure
        try:
            results[launch.name] = finish_launch(launch)
        except SystemExit as error:
            failures.append(str(error))
    if failures:
        raise SystemExit("\n".join(failures))
    plain = results["plain"]
    rows.append(
        _row(
            "deepspeed",
            f"eval loss after {args.recipe_steps} steps, plain",
            plain["eval_loss"],
            plain["eval_loss"],
            "nats",
            "uncompiled; plain, ZeRO-2 and ZeRO-3 launched at once",
        )
    )
    for stage in (2, 3):
        rows.append(
            _row(
                "deepspeed",
                f"eval loss after {args.recipe_steps} steps, ZeRO-{stage}",
                results[f"zero{stage}"]["eval_loss"],
                plain["eval_loss"],
                "nats",
                "reference: the plain run",
            )
        )
    wall = max(r["launch_seconds"] for r in results.values())
    rows.append(_row("deepspeed", "launch wall time, the three at once", wall, None, "s"))
    return rows


def generation_rows(args: argparse.Namespace, scale: dict) -> list[dict]:
    """Greedy generation, hfzoo vs transformers (`generation.py`)."""
    import generation

    profile = ["--profile_dir", args.profile_dir] if args.profile_dir else []
    results = generation.main(["--device", args.device, *scale["generation"], *profile])
    rows = []
    for batch in sorted({r["batch_size"] for r in results}):
        for setup in generation.SETUPS:
            rate = {r["implementation"]: r for r in results if (r["batch_size"], r["setup"]) == (batch, setup)}
            same = all(r["same_tokens"] for r in rate.values())
            note = ("same tokens as eager" if same else "TOKENS DIFFER") + "; hfzoo's q/k/v fused"
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
    parser.add_argument(
        "--profile_dir", default=None, help="also profile each training and generation case (operator tables)"
    )
    parser.add_argument("--log_dir", default=None, help="keep each recipe launch's output here (recipe-NAME.txt)")
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
    if {"recipe", "deepspeed"} & set(args.sections):  # one tokenizer for both; a DeepSpeed failure keeps the recipe's
        with tempfile.TemporaryDirectory(prefix="hfzoo-gpu-check-") as tmp:
            setup = functools.cache(lambda: recipe_setup(args, scale, Path(tmp)))
            if "recipe" in args.sections:
                run_section("recipe", lambda: recipe_rows(args, setup()))
            if "deepspeed" in args.sections:
                run_section("deepspeed", lambda: deepspeed_rows(args, setup()))
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
