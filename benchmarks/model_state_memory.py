#!/usr/bin/env python
"""Per-process memory of the model states (parameters + gradients + optimizer state): DDP vs DeepSpeed ZeRO.

Launch it with the accelerate config to measure, then compare the two result files:

    accelerate launch --config_file accelerate_configs/ddp.yaml benchmarks/model_state_memory.py --output ddp.json
    accelerate launch --config_file accelerate_configs/deepspeed_zero3.yaml \
        benchmarks/model_state_memory.py --output zero3.json
    python benchmarks/model_state_memory.py --compare ddp.json zero3.json

FSDP2 (`torch.distributed.fsdp.fully_shard` on every decoder layer and the root, applied here directly; the
accelerate config only starts the processes):

    accelerate launch --config_file accelerate_configs/ddp.yaml benchmarks/model_state_memory.py --fsdp2 \
        --output fsdp2.json

`--project RESULT.json ...` (results at 1 and 2 processes of each engine) fits each engine's replicated and
sharded bytes per parameter (bytes(N) = replicated + sharded / N), prints them beside the standard accounting
(`FORMULA_BYTES_PER_PARAMETER`) and the model-state bytes per process of the `gpt2` and `gpt3-xl` presets at
1, 2, 8 and 64 processes, with the communication volume per step (`COMMUNICATION_PSI`).

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


def measure(
    output: str, hidden_size: int, layers: int, vocab_size: int, mixed_precision: str, fsdp2: bool = False
) -> None:
    """Train two steps and write `{"mode", "num_processes", "parameters", "model_state_bytes": [per rank], ...}`.

    For DDP, `ddp_bucket_bytes` adds the size of DDP's gradient buckets as reported by DDP's own logging
    data (C++ tensors that `gc` cannot see; a private torch API, so best effort, 0 when unavailable).
    With `fsdp2`, the model is sharded with `torch.distributed.fsdp.fully_shard` (each decoder layer, then the
    root; Zhao et al. 2023, "PyTorch FSDP", full sharding) before the optimizer is built, instead of
    `accelerator.prepare` wrapping it in DDP; the sharded parameters are DTensors, whose local shards are counted.
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
    data = torch.randint(0, vocab_size, (16, 64))
    loader = torch.utils.data.DataLoader(data, batch_size=2)
    deepspeed = accelerator.distributed_type == DistributedType.DEEPSPEED
    if fsdp2:
        from torch.distributed.fsdp import fully_shard

        if accelerator.num_processes == 1 and not torch.distributed.is_initialized():  # a world of one
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", "29533")
            torch.distributed.init_process_group("gloo", rank=0, world_size=1)
        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        loader = accelerator.prepare(loader)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    mode = f"zero{accelerator.state.deepspeed_plugin.zero_stage}" if deepspeed else "fsdp2" if fsdp2 else "ddp"
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
    if not deepspeed and not fsdp2 and hasattr(model, "_get_ddp_logging_data"):
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
    # Free the (sharded) model and optimizer while the process group is alive: FSDP2's state torn down only at
    # interpreter exit, after the group is gone, aborted the process ("terminate called without an active
    # exception") in about half of the 2-process gloo runs.
    del model, optimizer, loader, batch, loss
    gc.collect()
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


#: Bytes per parameter of the model states with fp32 AdamW (4 B weights + 4 B gradients + 8 B moments), as
#: (replicated on every process, divided among the N processes): Rajbhandari et al. 2020, "ZeRO", §5 (ZeRO-1:
#: optimizer states partitioned; ZeRO-2: + gradients; ZeRO-3: + parameters); FSDP's full sharding (Zhao et al.
#: 2023, §3) partitions all three like ZeRO-3.
FORMULA_BYTES_PER_PARAMETER = {
    "ddp": (16.0, 0.0),
    "zero1": (8.0, 8.0),
    "zero2": (4.0, 12.0),
    "zero3": (0.0, 16.0),
    "fsdp2": (0.0, 16.0),
}
#: Communication volume per optimizer step and process, in units of the parameter bytes Psi: an all-reduce of
#: the gradients (reduce-scatter + all-gather) moves 2 Psi (ZeRO §7.1: DDP, ZeRO-1, ZeRO-2); ZeRO-3 adds an
#: all-gather of the parameters in the forward and another in the backward pass and reduce-scatters the
#: gradients: 3 Psi (ZeRO §7.2.2; FSDP, Zhao et al. 2023 §3.2, the same with full sharding). Ring
#: collectives send (N - 1) / N of that volume per process.
COMMUNICATION_PSI = {"ddp": 2, "zero1": 2, "zero2": 2, "zero3": 3, "fsdp2": 3}


def fit_bytes_per_parameter(results: list[dict]) -> dict[str, tuple[float, float]]:
    """Each engine's (replicated, sharded) bytes per parameter from its results at 1 and 2 processes.

    bytes(N) / parameters = replicated + sharded / N, so sharded = 2 (b1 - b2) and replicated = b1 - sharded
    (b1, b2: the largest per-process bytes per parameter at 1 and 2 processes). DDP's gradient buckets
    (`ddp_bucket_bytes`, not visible to `gc`) are added to its measurement.

    Raises:
        ValueError: an engine lacks a result at 1 or at 2 processes.
    """
    by_mode: dict[str, dict[int, float]] = {}
    for r in results:
        per_param = (max(r["model_state_bytes"]) + r.get("ddp_bucket_bytes", 0)) / r["parameters"]
        by_mode.setdefault(r["mode"], {})[r["num_processes"]] = per_param
    fitted = {}
    for mode, points in by_mode.items():
        if not {1, 2} <= set(points):
            raise ValueError(f"{mode}: results at 1 and 2 processes are needed, got {sorted(points)}")
        sharded = 2 * (points[1] - points[2])
        fitted[mode] = (points[1] - sharded, sharded)
    return fitted


def preset_parameters(name: str) -> int:
    """The parameter count of a preset (built on the meta device: no memory), tied weights counted once."""
    from transformers import AutoModelForCausalLM

    from hfzoo.models.presets import build_config

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(build_config(name))
    return sum(p.numel() for p in model.parameters())


def project(files: list[str], presets: tuple[str, ...] = ("gpt2", "gpt3-xl"), worlds=(1, 2, 8, 64)) -> None:
    """Print the fitted bytes per parameter and the model-state GiB per process of `presets` at `worlds`."""
    results = [json.loads(Path(f).read_text()) for f in files]
    fitted = fit_bytes_per_parameter(results)
    print("engine | measured replicated + sharded/N B/param | standard accounting | measured N=1, N=2 B/param")
    for mode, (rep, shard) in fitted.items():
        f_rep, f_shard = FORMULA_BYTES_PER_PARAMETER[mode]
        print(
            f"{mode} | {rep:.2f} + {shard:.2f}/N | {f_rep:g} + {f_shard:g}/N | {rep + shard:.2f}, {rep + shard / 2:.2f}"
        )
    for name in presets:
        n = preset_parameters(name)
        psi = 4 * n  # fp32 parameter bytes
        print(f"\n{name}: {n / 1e6:.1f}M parameters, Psi = {psi / 2**30:.2f} GiB (fp32)")
        print("engine | " + " | ".join(f"N={w} GiB" for w in worlds) + " | communication per step and process")
        for mode, (rep, shard) in fitted.items():
            cells = " | ".join(f"{n * (rep + shard / w) / 2**30:.2f}" for w in worlds)
            volume = COMMUNICATION_PSI[mode]
            print(f"{mode} | {cells} | {volume} Psi (N-1)/N = {volume * psi / 2**30:.2f} GiB x (N-1)/N")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="model_state_memory.json", help="Result file (JSON).")
    parser.add_argument("--hidden_size", type=int, default=512)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--vocab_size", type=int, default=8192)
    parser.add_argument("--mixed_precision", choices=("no", "bf16", "fp16"), default="no")
    parser.add_argument("--compare", nargs=2, metavar=("BASELINE", "OTHER"), help="Compare two result files.")
    parser.add_argument("--fsdp2", action="store_true", help="Shard with FSDP2 (fully_shard) instead of DDP.")
    parser.add_argument(
        "--project", nargs="+", metavar="RESULT", help="Fit bytes per parameter from results at 1 and 2 processes."
    )
    args = parser.parse_args()
    if args.compare:
        compare(*args.compare)
    elif args.project:
        project(args.project)
    else:
        measure(args.output, args.hidden_size, args.layers, args.vocab_size, args.mixed_precision, args.fsdp2)
