#!/usr/bin/env python
"""Evaluate a saved causal LM on text files and print a generated sample, in a fresh process.

    python recipes/evaluate_lm.py --model_name_or_path outputs/model \
        --validation_file ../shared/data/wikitext-2/wiki.valid.tokens --prompt "The history of"

Loads the checkpoint with `AutoModelForCausalLM.from_pretrained` / `AutoTokenizer.from_pretrained`
(after `import hfzoo`, which registers the hfzoo model types), packs each file into blocks exactly as
pretraining does, reports loss and perplexity per file, and greedily continues `--prompt`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import datasets
import torch
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM, AutoTokenizer, default_data_collator

import hfzoo  # noqa: F401  (registers the hfzoo Auto classes)
from hfzoo.data.loading import load_local_files
from hfzoo.data.packing import tokenize_and_pack
from hfzoo.integrity import check_weight_files
from hfzoo.training.arguments import OneLineErrorParser, positive_int
from hfzoo.training.evaluation import evaluate_lm


def parse_args(argv=None) -> argparse.Namespace:
    p = OneLineErrorParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model_name_or_path", required=True, help="Checkpoint folder (or hub id).")
    p.add_argument("--validation_file", nargs="+", action="extend", default=[], help="Text/JSONL/parquet files.")
    p.add_argument("--text_column_name", default="text")
    p.add_argument("--block_size", type=positive_int, default=None, help="Default: the block size of pretraining.")
    p.add_argument("--per_device_eval_batch_size", type=positive_int, default=16)
    p.add_argument("--max_eval_samples", type=positive_int, default=None, help="At most this many blocks per file.")
    p.add_argument("--prompt", default=None, help="Text to continue greedily.")
    p.add_argument("--max_new_tokens", type=positive_int, default=32)
    p.add_argument("--output_file", default=None, help="Write the metrics as JSON here.")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse_args(argv)
    try:
        if Path(args.model_name_or_path).is_dir():
            check_weight_files(args.model_name_or_path)  # names a truncated or corrupt weight file
        tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
        model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path).eval()
    except (OSError, ValueError) as err:
        raise SystemExit(f"error: --model_name_or_path {args.model_name_or_path}: {str(err).splitlines()[0]}") from None
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device)
    block_size = args.block_size
    results_file = Path(args.model_name_or_path) / "all_results.json"
    if block_size is None and results_file.is_file():
        block_size = json.loads(results_file.read_text()).get("block_size")
    block_size = block_size or min(1024, model.config.max_position_embeddings)
    print(
        f"loaded {type(model).__name__} ({sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters) "
        f"from {args.model_name_or_path}"
    )
    results = {}
    for file in args.validation_file:
        try:
            raw = datasets.DatasetDict(validation=load_local_files([file], "--validation_file", sample_by="document"))
            packed = tokenize_and_pack(raw, tokenizer, args.text_column_name, block_size)["validation"]
        except (ValueError, FileNotFoundError) as err:
            raise SystemExit(f"error: {err}") from None
        if args.max_eval_samples:
            packed = packed.select(range(min(args.max_eval_samples, len(packed))))
        loader = DataLoader(
            packed.with_format("torch", device=device),
            batch_size=args.per_device_eval_batch_size,
            collate_fn=default_data_collator,
        )
        metrics = evaluate_lm(model, loader)
        metrics["blocks"] = len(packed)
        metrics["block_size"] = block_size
        results[Path(file).name] = metrics
        print(
            f"{Path(file).name}: {len(packed)} blocks of {block_size} tokens, "
            f"eval_loss {metrics['eval_loss']:.4f}, perplexity {metrics['perplexity']:.2f}"
        )
    if args.prompt:
        inputs = tokenizer(args.prompt, return_tensors="pt").to(device)
        with torch.no_grad():
            output = model.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False)
        sample = tokenizer.decode(output[0], skip_special_tokens=True)
        results["sample"] = {"prompt": args.prompt, "text": sample}
        print(f"sample (greedy, {args.max_new_tokens} new tokens): {sample!r}")
    if args.output_file:
        Path(args.output_file).write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
