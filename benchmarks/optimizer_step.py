"""Time of one `optimizer.step()`: fused AdamW, foreach AdamW and Muon + AdamW (`--optim muon`).

Builds a preset's decoder (causal LM), gives every parameter a random gradient, and steps the three
optimizers of `hfzoo.training.optimization.create_optimizer` interleaved (`--warmup_steps` untimed, then
`--steps` timed steps each), so machine load affects the three alike. Muon's step orthogonalises each hidden
matrix's momentum with `ns_steps` Newton-Schulz iterations of 3 matrix products (`torch.optim.Muon`, in
bfloat16), which AdamW's elementwise update does not need. Prints a markdown table of the median step time
(milliseconds) and its spread (min-max).

Usage:

    python benchmarks/optimizer_step.py                          # decoder-tiny, vocabulary 2048
    python benchmarks/optimizer_step.py --config_name decoder-small --steps 20
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

from hfzoo.models.presets import build_config
from hfzoo.training.optimization import MuonSettings, create_optimizer


def main(argv: list[str] | None = None) -> None:
    """Parse the flags, time the three optimizers and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config_name", default="decoder-tiny", help="a decoder preset (hfzoo.models.presets)")
    parser.add_argument("--vocab_size", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=100, help="timed steps per optimizer")
    parser.add_argument("--warmup_steps", type=int, default=5)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup_steps < 0 or args.vocab_size < 1:
        parser.error(f"--steps >= 1, --warmup_steps >= 0 and --vocab_size >= 1 expected, got {vars(args)}")

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(build_config(args.config_name, vocab_size=args.vocab_size))
    for param in model.parameters():
        param.grad = torch.randn_like(param) * 1e-3
    common = {"learning_rate": 1e-4, "weight_decay": 0.01}
    optimizers = {
        "adamw_torch_fused": create_optimizer(model, **common, fused=True),
        "adamw_torch": create_optimizer(model, **common),
        "muon": create_optimizer(model, **common, muon=MuonSettings(learning_rate=1e-4)),
    }
    times: dict[str, list[float]] = {name: [] for name in optimizers}
    for step in range(args.warmup_steps + args.steps):
        for name, optimizer in optimizers.items():
            start = time.perf_counter()
            optimizer.step()
            if step >= args.warmup_steps:
                times[name].append(time.perf_counter() - start)
    params = sum(p.numel() for p in model.parameters())
    print(f"{args.config_name}, {params / 1e6:.2f}M parameters, torch {torch.__version__}, {args.steps} steps each\n")
    print("| --optim | step time, median (ms) | min-max (ms) |")
    print("|---|---:|---:|")
    for name, values in times.items():
        ms = [v * 1e3 for v in values]
        print(f"| {name} | {statistics.median(ms):.2f} | {min(ms):.2f}-{max(ms):.2f} |")


if __name__ == "__main__":
    main()
