"""Training throughput and peak memory of hfzoo vs transformers' reference model of the same architecture.

For each family, an hfzoo model is built from a parity preset (`gpt2`, `bert`, `t5-v1.0`) with the
sizes below, and transformers' own model (`GPT2LMHeadModel`, `BertForMaskedLM`,
`T5ForConditionalGeneration`) from the converted config (`hfzoo.convert.*_config_from_hfzoo`), so both
have the same architecture and parameter count. Each (family, implementation, precision) case runs in a
fresh process: `--warmup_steps` then `--steps` timed training steps (forward with labels, backward,
AdamW step) on random tokens, fp32 or bf16 autocast. Reported: tokens/s (input tokens per second) and
the peak resident memory the case added over the process after imports (MiB, `ru_maxrss`).

Usage (prints a markdown table; about 5 minutes on 2 CPU cores):

    python benchmarks/compare_transformers.py
    python benchmarks/compare_transformers.py --families decoder --precisions bf16 --steps 5
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

#: family -> (hfzoo preset, hfzoo Auto class, name of the config converter in hfzoo.convert, transformers class).
#: T5 v1.0 rather than v1.1: transformers 5.23 builds `T5ForConditionalGeneration` with a tied output layer even
#: for v1.1 configs, so only the tied v1.0 gives both sides the same parameters.
FAMILIES = {
    "decoder": ("gpt2", "AutoModelForCausalLM", "gpt2_config_from_hfzoo", "GPT2LMHeadModel"),
    "encoder": ("bert", "AutoModelForMaskedLM", "bert_config_from_hfzoo", "BertForMaskedLM"),
    "encoder-decoder": ("t5-v1.0", "AutoModelForSeq2SeqLM", "t5_config_from_hfzoo", "T5ForConditionalGeneration"),
}

#: Sizes small enough for a CPU run (the presets' other fields: norms, activations, positions, ties, stay).
SIZES = {
    "decoder": "vocab_size=8192,hidden_size=256,num_hidden_layers=4,num_attention_heads=4,intermediate_size=1024",
    "encoder": "vocab_size=8192,hidden_size=256,num_hidden_layers=4,num_attention_heads=4,intermediate_size=1024",
    "encoder-decoder": "vocab_size=8192,hidden_size=256,num_hidden_layers=2,num_decoder_layers=2,"
    "num_attention_heads=4,head_dim=64,intermediate_size=1024",
}


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def run_case(family: str, implementation: str, precision: str, args: argparse.Namespace) -> dict:
    """Time `args.steps` training steps of one model in this process; return tokens/s and peak memory.

    Args:
        family: a key of `FAMILIES`.
        implementation: "hfzoo" or "transformers".
        precision: "fp32" or "bf16" (CPU autocast).
        args: the parsed command line (batch size, sequence length, steps, seed, attention backend).

    Returns:
        `{"tokens_per_s", "peak_mib", "params"}`.
    """
    import torch
    import transformers

    import hfzoo  # noqa: F401  (registers the hfzoo classes with the Auto classes)
    from hfzoo import convert
    from hfzoo.models.presets import build_config

    torch.manual_seed(args.seed)
    baseline = _peak_rss_mib()
    preset, auto_name, converter, reference_name = FAMILIES[family]
    config = build_config(preset, SIZES[family])
    if implementation == "hfzoo":
        model = getattr(transformers, auto_name).from_config(config, attn_implementation=args.attn_implementation)
    else:
        reference_config = getattr(convert, converter)(config)
        model_class = getattr(transformers, reference_name)
        model = model_class._from_config(reference_config, attn_implementation=args.attn_implementation)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(args.seed)
    shape = (args.batch_size, args.seq_len)
    input_ids = torch.randint(5, config.vocab_size, shape, generator=g)
    batch = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": input_ids.clone()}
    if family == "encoder-decoder":
        batch["labels"] = torch.randint(5, config.vocab_size, (args.batch_size, args.seq_len // 4), generator=g)

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(args.warmup_steps):
        step()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    elapsed = time.perf_counter() - start
    return {
        "tokens_per_s": args.steps * args.batch_size * args.seq_len / elapsed,
        "peak_mib": _peak_rss_mib() - baseline,
        "params": sum(p.numel() for p in model.parameters()),
    }


def main(argv: list[str] | None = None) -> list[dict]:
    """Run every case in a fresh subprocess and print the markdown table; return the rows."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--seq_len", type=int, default=128)
    parser.add_argument("--warmup_steps", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--attn_implementation", default="sdpa", choices=["eager", "sdpa"])
    parser.add_argument("--case", nargs=3, metavar=("FAMILY", "IMPLEMENTATION", "PRECISION"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case:  # child process: one measurement, JSON on stdout
        print(json.dumps(run_case(*args.case, args)))
        return []

    common = [
        f"--batch_size={args.batch_size}",
        f"--seq_len={args.seq_len}",
        f"--warmup_steps={args.warmup_steps}",
        f"--steps={args.steps}",
        f"--seed={args.seed}",
        f"--attn_implementation={args.attn_implementation}",
    ]
    rows = []
    for family in args.families:
        for precision in args.precisions:
            result = {}
            for implementation in ("hfzoo", "transformers"):
                out = subprocess.run(
                    [sys.executable, __file__, "--case", family, implementation, precision, *common],
                    check=True,
                    capture_output=True,
                    text=True,
                )
                result[implementation] = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append({"family": family, "precision": precision, **result})
            print(f"done: {family} {precision}", file=sys.stderr, flush=True)

    print(
        f"\nbatch {args.batch_size} x {args.seq_len} tokens, {args.steps} timed steps after {args.warmup_steps} "
        f"warm-up, AdamW, attention {args.attn_implementation}, torch threads: default\n"
    )
    print(
        "| family (preset) | precision | params | hfzoo tok/s | transformers tok/s | ratio | hfzoo peak MiB "
        "| transformers peak MiB | ratio |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        h, t = row["hfzoo"], row["transformers"]
        print(
            f"| {row['family']} ({FAMILIES[row['family']][0]}) | {row['precision']} | {h['params'] / 1e6:.2f}M "
            f"| {h['tokens_per_s']:,.0f} | {t['tokens_per_s']:,.0f} | {h['tokens_per_s'] / t['tokens_per_s']:.2f} "
            f"| {h['peak_mib']:,.0f} | {t['peak_mib']:,.0f} | {h['peak_mib'] / max(t['peak_mib'], 1e-9):.2f} |"
        )
    if any(row["hfzoo"]["params"] != row["transformers"]["params"] for row in rows):
        print("\nWARNING: parameter counts differ between hfzoo and transformers for some rows", file=sys.stderr)
    return rows


if __name__ == "__main__":
    main()
