#!/usr/bin/env python
"""Pretraining throughput and validation loss: `--mixed_precision bf16` vs fp32 (`no`), one process.

    python benchmarks/bf16_vs_fp32.py --data_dir /work/shared/data --work_dir /tmp/bf16_bench --steps 40

Trains a byte-level BPE tokenizer (8192 tokens) on Gutenberg shard 00, then runs `recipes/pretrain.py`
twice with the same seed and data: a decoder of hidden size 512, 4 layers, 8 heads, blocks of 256
tokens, batch 8, the same number of optimizer steps. Reports the training tokens/s of each run (the
median of its logging windows after the first, so start-up is excluded), their ratio, and the
validation losses after training with their relative difference. On CPUs with AMX (Sapphire Rapids
and later) bf16 matrix products run on the AMX tiles; accelerate's bf16 autocast keeps fp32 master
weights and optimizer state.
"""

from __future__ import annotations

import argparse
import json
import lzma
import statistics
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def train_tokenizer(data_dir: Path, path: Path, vocab_size: int) -> None:
    """Train and save a BPE tokenizer on the first shard's books (skipped when `path` exists)."""
    if (path / "tokenizer.json").is_file():
        return
    from hfzoo.data.loading import clean_text
    from hfzoo.tokenization import train_bpe_tokenizer

    with lzma.open(data_dir / "gutenberg" / "pg_top100_en.00.jsonl.xz", "rt", encoding="utf-8") as f:
        texts = [clean_text(json.loads(line)["text"]) for line in f]
    train_bpe_tokenizer([texts], vocab_size=vocab_size).save_pretrained(path)


def run(precision: str, args: argparse.Namespace, tokenizer: Path) -> dict:
    """Run the recipe with `--mixed_precision precision`; return its results and logged history."""
    out = args.work_dir / precision
    cmd = [
        sys.executable, str(REPO_ROOT / "recipes" / "pretrain.py"),
        "--train_file", str(args.data_dir / "gutenberg" / "pg_top100_en.00.jsonl.xz"),
        "--tokenizer_name", str(tokenizer),
        "--config_name", "decoder-small",
        "--config_overrides", "hidden_size=512,num_hidden_layers=4,num_attention_heads=8,intermediate_size=2048,"
        "max_position_embeddings=256",
        "--block_size", "256",
        "--attn_implementation", "eager",  # as the CPU recipe configs: SDPA's CPU backward is slow in bf16
        "--per_device_train_batch_size", "8",
        "--per_device_eval_batch_size", "8",
        "--max_train_steps", str(args.steps),
        "--max_eval_samples", str(args.eval_blocks),
        "--learning_rate", "1e-3",
        "--num_warmup_steps", str(max(1, args.steps // 10)),
        "--logging_steps", str(args.logging_steps),
        "--mixed_precision", precision,
        "--seed", "42",
        "--output_dir", str(out),
    ]  # fmt: skip
    subprocess.run(cmd, check=True)
    results = json.loads((out / "all_results.json").read_text())
    history = json.loads((out / "train_history.json").read_text())["log_history"]
    return {"results": results, "history": history}


def main() -> None:
    """Run both precisions and print one JSON summary line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_dir", type=Path, default=REPO_ROOT.parent / "shared" / "data")
    parser.add_argument("--work_dir", type=Path, default=Path("bf16_vs_fp32"))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--logging_steps", type=int, default=5)
    parser.add_argument("--eval_blocks", type=int, default=64)
    args = parser.parse_args()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = args.work_dir / "tokenizer"
    train_tokenizer(args.data_dir, tokenizer, 8192)
    summary = {}
    for precision in ("no", "bf16"):
        run_result = run(precision, args, tokenizer)
        windows = [r["tokens_per_second"] for r in run_result["history"][1:]] or [
            run_result["history"][0]["tokens_per_second"]
        ]
        summary[precision] = {
            "tokens_per_second": statistics.median(windows),
            "eval_loss": run_result["results"]["eval_loss"],
            "train_steps": run_result["results"]["train_steps"],
        }
    summary["bf16_speedup"] = summary["bf16"]["tokens_per_second"] / summary["no"]["tokens_per_second"]
    summary["eval_loss_relative_difference"] = (
        abs(summary["bf16"]["eval_loss"] - summary["no"]["eval_loss"]) / summary["no"]["eval_loss"]
    )
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
