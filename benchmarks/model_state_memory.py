#!/usr/bin/env python
"""Per-process memory of the model states (parameters + gradients + optimizer state): DDP vs DeepSpeed ZeRO.

Launch it with the accelerate config to measure, then compare the two result files:

    accelerate launch --config_file accelerate_configs/ddp.yaml benchmarks/model_state_memory.py --output ddp.json
    accelerate launch --config_file accelerate_configs/deepspeed_zero3.yaml \
        benchmarks/model_state_memory.py --output zero3.json
    python benchmarks/model_state_memory.py --compare ddp.json zero3.json

The model is an hfzoo decoder of about 23M parameters (hidden 512, 6 layers, vocabulary 8192) trained
with AdamW in fp32 on random tokens (memory does not depend on the data). At the second optimizer
step, after the backward pass and before the update (gradients and optimizer state both exist), every
tensor reachable from Python is listed (`gc`), and the bytes of their distinct storages are summed
on each process. DeepSpeed's bucket sizes are set from the model as in the recipe
(`size_buckets_from_model`). This counts the parameter, gradient and optimizer-state tensors of both DDP and
DeepSpeed (whose partitions and flat buffers are Python attributes); DDP's gradient buckets live in
C++ and are not counted, so the DDP figure is a lower bound and the ZeRO/DDP ratio an upper bound.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
from pathlib import Path

import torch


def live_tensor_bytes(model: torch.nn.Module) -> int:
    """Bytes of the distinct storages of every tensor reachable from Python, gradients included (int)."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]  # give them Python objects  # noqa: F841
    gc.collect()
    storages: dict[int, int] = {}
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor) and obj.device.type in ("cpu", "cuda"):
                storage = obj.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
        except (RuntimeError, ReferenceError):  # meta tensors, freed weak proxies
            continue
    return sum(storages.values())


def measure(output: str, hidden_size: int, layers: int, vocab_size: int, mixed_precision: str) -> None:
    """Train two steps and write `{"mode", "num_processes", "parameters", "model_state_bytes": [per rank], ...}`.

    For DDP, `ddp_bucket_bytes` adds the size of DDP's gradient buckets as reported by DDP's own logging
    data (C++ tensors that `gc` cannot see; a private torch API, so best effort, 0 when unavailable).
    """
    from accelerate import Accelerator
    from accelerate.utils import DistributedType, InitProcessGroupKwargs
    from transformers import AutoModelForCausalLM

    from hfzoo.models.presets import build_config
    from hfzoo.training.accelerator import size_buckets_from_model

    on_gpu = torch.cuda.is_available()
    use_deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"
    accelerator = Accelerator(
        mixed_precision=mixed_precision,
        cpu=not on_gpu and not use_deepspeed,
        kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")] if use_deepspeed and not on_gpu else [],
    )
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        size_buckets_from_model(accelerator.state.deepspeed_plugin.deepspeed_config)  # as the recipe does
    config = build_config(
        "decoder-small",
        f"hidden_size={hidden_size},num_hidden_layers={layers},num_attention_heads=8,"
        f"intermediate_size={4 * hidden_size},max_position_embeddings=128,vocab_size={vocab_size}",
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    n_params = sum(
        int(torch.Size(getattr(p, "ds_shape", p.shape)).numel())
        for p in {id(p): p for p in model.parameters()}.values()
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = torch.randint(0, vocab_size, (16, 64))
    loader = torch.utils.data.DataLoader(data, batch_size=2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    deepspeed = accelerator.distributed_type == DistributedType.DEEPSPEED
    mode = f"zero{accelerator.state.deepspeed_plugin.zero_stage}" if deepspeed else "ddp"
    measured = None
    for step, batch in enumerate(loader):
        loss = model(input_ids=batch, labels=batch).loss
        if deepspeed:
            model.backward(loss)  # the engine: reduce (and partition) the gradients, no update yet
            if step == 1:
                measured = live_tensor_bytes(model)
            model.step()
        else:
            accelerator.backward(loss)
            if step == 1:
                measured = live_tensor_bytes(model)
            optimizer.step()
            optimizer.zero_grad()
        if step == 1:
            break
    per_rank = accelerator.gather(torch.tensor([measured], dtype=torch.float64)).tolist()
    bucket_bytes = 0
    if not deepspeed and hasattr(model, "_get_ddp_logging_data"):
        sizes = str(model._get_ddp_logging_data().get("bucket_sizes", ""))
        bucket_bytes = sum(int(x) for x in sizes.split(",") if x.strip().isdigit())
    if accelerator.is_main_process:
        result = {
            "mode": mode,
            "mixed_precision": accelerator.mixed_precision,
            "num_processes": accelerator.num_processes,
            "parameters": n_params,
            "model_state_bytes": per_rank,
            "bytes_per_parameter": [b / n_params for b in per_rank],
            "ddp_bucket_bytes": bucket_bytes,
        }
        Path(output).write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result))
    accelerator.end_training()


def compare(baseline: str, other: str) -> None:
    """Print the per-process model-state memory of `other` as a fraction of `baseline` (max over processes)."""
    a, b = (json.loads(Path(f).read_text()) for f in (baseline, other))
    ratio = max(b["model_state_bytes"]) / max(a["model_state_bytes"])
    for r in (a, b):
        print(
            f"{r['mode']:>6} x{r['num_processes']} ({r.get('mixed_precision')}): {r['parameters'] / 1e6:.1f}M "
            "parameters, per process "
            + ", ".join(f"{x / 2**20:.1f} MiB ({x / r['parameters']:.1f} B/param)" for x in r["model_state_bytes"])
            + (f" + DDP gradient buckets {r['ddp_bucket_bytes'] / 2**20:.1f} MiB" if r.get("ddp_bucket_bytes") else "")
        )
    print(f"{b['mode']} / {a['mode']} per-process model-state memory (tensors seen by gc): {100 * ratio:.1f}%")
    if a.get("ddp_bucket_bytes"):
        with_buckets = max(b["model_state_bytes"]) / (max(a["model_state_bytes"]) + a["ddp_bucket_bytes"])
        print(f"{b['mode']} / {a['mode']} including DDP's gradient buckets: {100 * with_buckets:.1f}%")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="model_state_memory.json", help="Result file (JSON).")
    parser.add_argument("--hidden_size", type=int, default=512)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--vocab_size", type=int, default=8192)
    parser.add_argument("--mixed_precision", choices=("no", "bf16", "fp16"), default="no")
    parser.add_argument("--compare", nargs=2, metavar=("BASELINE", "OTHER"), help="Compare two result files.")
    args = parser.parse_args()
    if args.compare:
        compare(*args.compare)
    else:
        measure(args.output, args.hidden_size, args.layers, args.vocab_size, args.mixed_precision)
