#!/usr/bin/env python
"""CPU time of one pretraining step of each variant of a `hfzoo-study` study file, at the study's scale.

    OMP_NUM_THREADS=1 python benchmarks/study_step_cost.py --study recipes/studies/narang_small.yaml \
        --tokenizer_name outputs/study/tokenizer --variants "Vanilla Transformer" SwiGLU --steps 10

For each variant: the study's model for that row (`hfzoo.study.runner.build_variant_config`), trained for
`--steps` optimizer steps (after 2 warm-up steps) with the study's attention implementation
(`--attn_implementation` overrides it, `--mixed_precision` the precision) on random token ids shaped like the
study's batches (`train_batch_tokens / block_size` sequences of `block_size` input tokens; an
encoder-decoder's targets of span corruption's target length, a decoder's or encoder's labels as long as the
input; `--family` as the study's), the optimizer the study's run of that row builds (`create_optimizer` with
the run's pretraining arguments: AdamW, or Muon + AdamW for the Muon rows), bf16 autocast when the study's
`mixed_precision` is `bf16`, or `auto` on a CPU with native bf16 (`hfzoo.training.precision`). Prints the
process CPU seconds per step (`time.process_time`, which on a machine shared with other jobs is far less
disturbed than the wall time), the wall seconds per step, the training FLOPs per step (`hfzoo.models.flops`)
and the CPU time the study's `max_train_steps` would take. With `OMP_NUM_THREADS=1` the CPU time per step is
the single-thread wall time of a step on an otherwise idle core. Pretraining only: evaluation, data
preparation and GLUE finetuning are not included.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from hfzoo.models.flops import count_training_flops
from hfzoo.pretraining import parse_pretrain_args
from hfzoo.study.runner import (
    _tokenizer_fields,
    build_variant_config,
    load_settings,
    pretrain_argv,
    pretraining_model_class,
    target_length,
)
from hfzoo.training.arguments import muon_settings
from hfzoo.training.optimization import create_optimizer
from hfzoo.training.precision import resolve_mixed_precision


def step_cost(settings, variant: str, tokenizer, tokenizer_name: str, steps: int) -> dict:
    """Time `steps` training steps of `variant`'s model; CPU and wall seconds per step, FLOPs per step."""
    config = build_variant_config(settings, variant, _tokenizer_fields(tokenizer))
    torch.manual_seed(0)
    model = pretraining_model_class(config).from_config(config, attn_implementation=settings.attn_implementation)
    model.train()
    scratch = Path("/nonexistent-step-cost")  # the run's arguments, for its optimizer only
    args = parse_pretrain_args(pretrain_argv(settings, tokenizer_name, scratch / "c.json", 0, scratch, 1, variant))
    optimizer = create_optimizer(
        model,
        learning_rate=args.learning_rate,
        weight_decay=args.weight_decay,
        betas=(args.adam_beta1, args.adam_beta2),
        fused=False,
        muon=muon_settings(args),
    )
    # T5's arithmetic for an encoder-decoder: raw blocks long enough that the corrupted input is `block_size`
    # tokens, targets of the spans' length; one stack predicts (at most) every input position
    targets = target_length(settings)
    input_length = settings.block_size
    batch = settings.train_batch_tokens // settings.block_size
    generator = torch.Generator().manual_seed(0)
    vocab = min(config.vocab_size, len(tokenizer))
    inputs = torch.randint(3, vocab, (batch, input_length), generator=generator)
    labels = torch.randint(3, vocab, (batch, targets or input_length), generator=generator)
    bf16 = resolve_mixed_precision(settings.mixed_precision, device_type="cpu").mixed_precision == "bf16"

    def train_step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=inputs, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(2):
        train_step()
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(steps):
        train_step()
    cpu, wall = (time.process_time() - cpu) / steps, (time.perf_counter() - wall) / steps
    flops = count_training_flops(config, input_length, targets).total * batch
    return {"cpu": cpu, "wall": wall, "flops": flops, "params": sum(p.numel() for p in model.parameters())}


def main() -> None:
    """Parse the arguments and print one table row per variant."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", required=True, help="YAML study file")
    parser.add_argument("--tokenizer_name", required=True, help="the study's tokenizer folder")
    parser.add_argument("--variants", nargs="+", default=None, help="rows (default: the study file's)")
    parser.add_argument("--steps", type=int, default=10, help="timed optimizer steps per variant")
    parser.add_argument("--family", default=None, help="encoder-decoder, decoder or encoder (default: the study's)")
    parser.add_argument("--attn_implementation", default=None, help="eager, sdpa, ... (default: the study's)")
    parser.add_argument("--mixed_precision", default=None, help="auto, no or bf16 (default: the study's)")
    args = parser.parse_args()
    overrides = {key: getattr(args, key) for key in ("family", "attn_implementation", "mixed_precision")}
    settings = load_settings(args.study, overrides)
    choice = resolve_mixed_precision(settings.mixed_precision, device_type="cpu")
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer_name)
    print(f"torch threads: {torch.get_num_threads()}; {settings.max_train_steps} steps of "
          f"{settings.train_batch_tokens} tokens per run; {settings.family}, attention {settings.attn_implementation}, "
          f"{'fp32' if choice.mixed_precision == 'no' else choice.mixed_precision} ({choice.reason})")  # fmt: skip
    print("| variant | params | GFLOP/step | CPU s/step | wall s/step | CPU min per run (pretraining) |")
    print("|---|---:|---:|---:|---:|---:|")
    for variant in args.variants or settings.variants:
        r = step_cost(settings, variant, tokenizer, args.tokenizer_name, args.steps)
        print(f"| {variant} | {r['params'] / 1e6:.2f}M | {r['flops'] / 1e9:.1f} | {r['cpu']:.3f} | {r['wall']:.3f} "
              f"| {r['cpu'] * settings.max_train_steps / 60:.1f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
