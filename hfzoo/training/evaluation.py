"""Language-model evaluation: validation loss, perplexity, the unigram baseline, and the `hfzoo-evaluate-lm` CLI.

`hfzoo-evaluate-lm` (also `python -m hfzoo.training.evaluation` or `python recipes/evaluate_lm.py`)
evaluates a saved causal LM on text files and prints a generated sample, in a fresh process:

    hfzoo-evaluate-lm --model_name_or_path outputs/model \
        --validation_file ../shared/data/wikitext-2/wiki.valid.tokens --prompt "The history of"

It loads the checkpoint with `AutoModelForCausalLM.from_pretrained` / `AutoTokenizer.from_pretrained`
(the hfzoo package, imported with this module, registers its model types), packs each file into blocks exactly as
pretraining does, reports loss and perplexity per file, and greedily continues `--prompt`.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import datasets
import numpy as np
import torch
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM, AutoTokenizer, default_data_collator

from ..data.loading import load_local_files
from ..data.packing import tokenize_and_pack
from .arguments import OneLineErrorParser, positive_int


@torch.no_grad()
def evaluate_lm(model, dataloader, accelerator=None, seed: int | None = None) -> dict[str, float]:
    """Mean loss and perplexity of `model` over `dataloader` (all processes gathered), for any objective.

    The loss of each batch is the model's mean over predicted tokens (next tokens, masked tokens or
    span targets); the mean of batch losses weighted by batch size is reported (exactly the per-token
    mean for packed causal-LM blocks, which all predict the same number of tokens).

    Args:
        model: a model returning `.loss` for the batches (causal LM, masked LM, seq2seq LM).
        dataloader: batches of model inputs with `labels` (collated on the fly for mlm / span).
        accelerator: an `accelerate.Accelerator` to gather losses across processes, or None.
        seed: when given, the random masking/corruption of the collator is drawn from torch's RNG
            seeded with it, so every evaluation sees the same masks; the caller's RNG state is restored.

    Returns:
        `{"eval_loss": nats per token, "perplexity": exp(eval_loss)}` (perplexity is `inf` on overflow).
    """
    was_training = model.training
    model.eval()
    losses = []
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        for batch in dataloader:
            loss = model(**batch).loss.detach().float()
            losses_batch = loss.repeat(batch["input_ids"].shape[0])
            if accelerator is not None:
                losses_batch = accelerator.gather_for_metrics(losses_batch)
            losses.append(losses_batch.cpu())
    model.train(was_training)
    eval_loss = torch.cat(losses).mean().item()
    try:
        perplexity = math.exp(eval_loss)
    except OverflowError:
        perplexity = float("inf")
    return {"eval_loss": eval_loss, "perplexity": perplexity}


def unigram_perplexity(train_counts: np.ndarray, eval_tokens: np.ndarray) -> float:
    """Perplexity of an add-one-smoothed unigram model (Laplace smoothing) on `eval_tokens`.

    `p(w) = (count(w) + 1) / (N + V)` with N training tokens and V = `len(train_counts)`;
    perplexity = `exp(-mean(log p(w)))` over the evaluated tokens.

    Args:
        train_counts: int array `(vocab_size,)` of training-token counts.
        eval_tokens: int array of the evaluated token ids (any shape).

    Returns:
        The perplexity (float, per token).

    Raises:
        ValueError: an evaluated id outside `[0, vocab_size)`, or no evaluated token.
    """
    eval_tokens = np.asarray(eval_tokens).ravel()
    if eval_tokens.size == 0:
        raise ValueError("no tokens to evaluate")
    if eval_tokens.min() < 0 or eval_tokens.max() >= len(train_counts):
        raise ValueError(f"token ids must be in [0, {len(train_counts)})")
    log_probs = np.log(train_counts.astype(np.float64) + 1.0) - math.log(train_counts.sum() + len(train_counts))
    return float(math.exp(-log_probs[eval_tokens].mean()))


def parse_evaluate_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse the arguments of `hfzoo-evaluate-lm` (see `--help`).

    Raises:
        SystemExit: an argparse error (one line).
    """
    p = OneLineErrorParser(
        prog="hfzoo-evaluate-lm",
        description="Evaluate a saved causal LM on text files and print a generated sample.",
    )
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


def main(argv: list[str] | None = None) -> dict:
    """Entry point of `hfzoo-evaluate-lm` and `recipes/evaluate_lm.py`.

    Args:
        argv: arguments without the program name (default: `sys.argv[1:]`).

    Returns:
        `{file name: {"eval_loss", "perplexity", "blocks", "block_size"}}`, plus `sample` (prompt and
        text) with `--prompt`; also written to `--output_file`.

    Raises:
        SystemExit: bad input (one-line `error: ...`).
    """
    args = parse_evaluate_args(argv)
    try:
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


def cli() -> None:
    """Console script `hfzoo-evaluate-lm` (returns None: setuptools exits with what its function returns)."""
    main()


if __name__ == "__main__":
    main()
