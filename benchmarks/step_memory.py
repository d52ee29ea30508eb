#!/usr/bin/env python
"""Memory a training step adds above the model states: hfzoo's `gpt2` preset vs transformers' GPT2LMHeadModel.

A training step of a language model holds, besides its parameters, gradients and optimizer state, the
activations saved for the backward pass and the temporaries of the backward pass and optimizer step. With
a vocabulary of 50,257 at 1,024 tokens, the float32 logits alone are 196 MiB per sequence, and a plain
cross-entropy keeps them, their log-softmax and their gradient alive at once. This benchmark measures, for
one sequence of `--seq_len` tokens:

- "step adds (tensors)": the peak bytes of tensors alive during a training step (forward with labels,
  backward, AdamW step) above the model states (parameters + gradients + AdamW's two moments), counted
  by torch's `MemTracker` (a `TorchDispatchMode` that sees every tensor the step creates; allocator- and
  machine-independent);
- "step adds (RSS)": the rise of the process's peak resident memory during the step over its resident
  memory before it (`VmHWM` reset through `/proc/self/clear_refs`; includes the allocator's own behaviour).

Each case runs in a fresh process; the model states exist before the measured step (one warm-up step
with `zero_grad(set_to_none=False)` keeps the gradients and AdamW state allocated). Cases:

- `transformers`: `GPT2LMHeadModel` with the same architecture (`hfzoo.convert.gpt2_config_from_hfzoo`);
- `hfzoo`: `HfzooDecoderForCausalLM` from the `gpt2` preset, as it trains by default: with labels in
  training mode the loss is computed from the hidden states in chunks of tokens and no logits are returned;
- `hfzoo-logits`: the same model asked for its logits (`skip_logits=False`): logits of the whole sequence
  and a cross-entropy over them, as before the chunked loss existed.

Usage (prints a markdown table; a few minutes on 2 CPU cores):

    python benchmarks/step_memory.py
    python benchmarks/step_memory.py --seq_len 512 --precision bf16
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CASES = ("transformers", "hfzoo", "hfzoo-logits")
MIB = 2**20


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not found in /proc/self/status")


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")  # resets VmHWM to the current resident size (Linux >= 4.0)
        return True
    except OSError:
        return False


def _storage_bytes(tensors) -> int:
    storages = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def run_case(case: str, args: argparse.Namespace) -> dict:
    """Measure one training step of one model in this process.

    Args:
        case: one of `CASES`.
        args: the parsed command line (`seq_len`, `batch_size`, `precision`, `seed`).

    Returns:
        `{"case", "params", "states_mib", "step_tensors_mib", "step_rss_mib", "step_s", "loss"}`: the model
        states (parameters + gradients + optimizer state) in MiB, the peak of live tensors above them during
        the measured step (MiB), the peak resident memory added by the step (MiB, None where it cannot be
        reset), the step's wall time (s, under `MemTracker`, so slower than a plain step) and its loss.
    """
    import torch
    from torch.distributed._tools.mem_tracker import MemTracker
    from transformers import GPT2LMHeadModel

    import hfzoo  # noqa: F401  (registers the hfzoo classes with the Auto classes)
    from hfzoo.convert import gpt2_config_from_hfzoo
    from hfzoo.models.decoder import HfzooDecoderForCausalLM
    from hfzoo.models.presets import build_config

    torch.manual_seed(args.seed)
    config = build_config("gpt2")
    if case == "transformers":
        model = GPT2LMHeadModel._from_config(gpt2_config_from_hfzoo(config), attn_implementation="sdpa")
    else:
        model = HfzooDecoderForCausalLM._from_config(config, attn_implementation="sdpa")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(args.seed)
    input_ids = torch.randint(0, config.vocab_size, (args.batch_size, args.seq_len), generator=g)
    batch = {"input_ids": input_ids, "labels": input_ids.clone()}
    if case == "hfzoo-logits":
        batch["skip_logits"] = False

    def step() -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        return loss.detach()

    step()  # allocates the gradients and AdamW's state
    params = {id(p): p for p in model.parameters()}.values()
    states = (
        list(params)
        + [p.grad for p in params]
        + [value for state in optimizer.state.values() for value in state.values() if torch.is_tensor(value)]
    )
    states_bytes = _storage_bytes(states)

    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    rss_reset = _reset_peak_rss()
    rss_before = _status_kib("VmRSS")
    start = time.perf_counter()
    with tracker:
        loss = step()
    elapsed = time.perf_counter() - start
    rss_added = (_status_kib("VmHWM") - rss_before) / 1024 if rss_reset else None
    peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    return {
        "case": case,
        "params": sum(p.numel() for p in params),
        "states_mib": states_bytes / MIB,
        "step_tensors_mib": (peak - states_bytes) / MIB,
        "step_rss_mib": rss_added,
        "step_s": elapsed,
        "loss": float(loss),
    }


def main(argv: list[str] | None = None) -> list[dict]:
    """Run every case in a fresh subprocess and print the markdown table; return the rows."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=CASES)
    parser.add_argument("--seq_len", type=int, default=1024)
    parser.add_argument("--batch_size", type=int, default=1)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.case:  # child process: one measurement, JSON on stdout
        print(json.dumps(run_case(args.case, args)))
        return []

    common = [f"--seq_len={args.seq_len}", f"--batch_size={args.batch_size}", f"--precision={args.precision}"]
    rows = []
    for case in args.cases:
        out = subprocess.run(
            [sys.executable, __file__, "--case", case, *common, f"--seed={args.seed}"],
            check=True,
            capture_output=True,
            text=True,
            env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
        )
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    reference = next((row for row in rows if row["case"] == "transformers"), None)
    print(f"gpt2 architecture, batch {args.batch_size} x {args.seq_len} tokens, {args.precision}, AdamW, CPU")
    print()
    print(
        "| model | parameters | model states (MiB) | step adds, tensors (MiB) | vs transformers "
        "| step adds, RSS (MiB) | loss |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        ratio = f"{row['step_tensors_mib'] / reference['step_tensors_mib']:.2f}x" if reference else "-"
        rss = "-" if row["step_rss_mib"] is None else f"{row['step_rss_mib']:.0f}"
        print(
            f"| {row['case']} | {row['params'] / 1e6:.1f}M | {row['states_mib']:.0f} | "
            f"{row['step_tensors_mib']:.0f} | {ratio} | {rss} | {row['loss']:.4f} |"
        )
    return rows


if __name__ == "__main__":
    main()
