#!/usr/bin/env python
"""What the range checks of token ids and language-modelling labels cost in eager mode.

    python benchmarks/token_id_check.py --repeats 7

`TokenEmbedding.forward` refuses ids outside `[0, vocab_size)` with a `ValueError`, and the heads' loss
(`check_lm_labels`) labels outside `[0, vocab_size)` other than -100 (each one min/max pass and one host sync;
skipped under `torch.compile`). This script times a training step (forward + backward, labels checked too) and an
inference forward (ids only) of a decoder (hidden 512, 4 layers, vocabulary 8192, batch 8 x 256 tokens, eager
attention) with the checks and without them, interleaved A B A B ... in one process, and prints the median time
of each, their ratio, and the time of each check alone on the same ids. `--device cuda` runs it on a GPU (where
the sync is what a check costs).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

import hfzoo  # noqa: F401  (registers the hfzoo Auto classes)
from hfzoo import modeling_utils
from hfzoo.models.presets import build_config
from hfzoo.modules.embeddings import TokenEmbedding, check_lm_labels

CHECKED = TokenEmbedding.forward


def unchecked(self, input_ids: torch.Tensor) -> torch.Tensor:
    """`TokenEmbedding.forward` without the range check."""
    embeddings = torch.nn.Embedding.forward(self, input_ids)
    if self.embed_proj is not None:
        embeddings = self.embed_proj(embeddings)
    return embeddings * self.scale if self.scale != 1.0 else embeddings


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA); nothing on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_call(fn, device: torch.device, iterations: int) -> float:
    """Seconds per call (mean over `iterations` calls)."""
    sync(device)
    start = time.perf_counter()
    for _ in range(iterations):
        fn()
    sync(device)
    return (time.perf_counter() - start) / iterations


def main() -> None:
    """Time both variants and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="Interleaved repetitions of each variant.")
    parser.add_argument("--iterations", type=int, default=5, help="Calls per timing.")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.manual_seed(0)
    config = build_config(
        "decoder-small",
        "hidden_size=512,num_hidden_layers=4,num_attention_heads=8,intermediate_size=2048,"
        "max_position_embeddings=256,vocab_size=8192",
    )
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").to(device)
    ids = torch.randint(0, config.vocab_size, (8, 256), device=device)

    def train_step():
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()

    @torch.no_grad()
    def forward():
        model(input_ids=ids)

    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.repeats):
        for variant, method, label_check in (
            ("checked", CHECKED, check_lm_labels),
            ("unchecked", unchecked, lambda *args: None),
        ):
            TokenEmbedding.forward = method
            modeling_utils.check_lm_labels = label_check
            model.train()
            times.setdefault(("train step", variant), []).append(time_call(train_step, device, args.iterations))
            model.eval()
            times.setdefault(("forward", variant), []).append(time_call(forward, device, args.iterations))
    TokenEmbedding.forward = CHECKED
    modeling_utils.check_lm_labels = check_lm_labels

    def check_only():
        low, high = torch.aminmax(ids)
        bool((low < 0) | (high >= config.vocab_size))

    def label_check_only():
        check_lm_labels(ids, ids.shape, config.vocab_size)

    alone = statistics.median(time_call(check_only, device, 100) for _ in range(args.repeats))
    labels_alone = statistics.median(time_call(label_check_only, device, 100) for _ in range(args.repeats))
    repetitions = f"{args.repeats} interleaved repetitions x {args.iterations} calls"
    print(f"device {device}, torch {torch.__version__}, {repetitions}")
    print(f"| {'measure':<10} | checked (ms) | unchecked (ms) | checked / unchecked |")
    print("|---|---:|---:|---:|")
    for measure in ("train step", "forward"):
        a, b = statistics.median(times[(measure, "checked")]), statistics.median(times[(measure, "unchecked")])
        print(f"| {measure:<10} | {1e3 * a:.2f} | {1e3 * b:.2f} | {a / b:.4f} |")
    print(f"the token-id check alone on these 8 x 256 ids: {1e6 * alone:.1f} us")
    print(f"the label check alone on the same ids as labels: {1e6 * labels_alone:.1f} us")


if __name__ == "__main__":
    main()
