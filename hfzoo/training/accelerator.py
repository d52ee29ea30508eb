"""The `Accelerator` of every recipe (pretraining and GLUE): one process, DDP, DeepSpeed or FSDP2, on CPU or GPU.

`create_accelerator(args)` applies the process-wide runtime settings (`hfzoo.training.runtime`), builds
the `Accelerator` for whatever `accelerate launch` started, refuses launches that would silently run
alone, and fills DeepSpeed's `"auto"` values from the recipe's arguments (`reconcile_deepspeed_config`).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch
from accelerate import Accelerator, DataLoaderConfiguration, FullyShardedDataParallelPlugin, PartialState
from accelerate.utils import DistributedType, GradientAccumulationPlugin, InitProcessGroupKwargs, parse_flag_from_env
from torch.distributed.fsdp import CPUOffloadPolicy

from . import faults
from .arguments import report_to_trackers
from .launch_config import check_launch
from .precision import PrecisionChoice, resolve_mixed_precision
from .runtime import disable_cudnn_sdpa, tune_glibc_malloc


def run_device_type() -> str:
    """`"cuda"` when a run trains on a GPU (one is visible, the launcher did not ask for the CPU), else `"cpu"`."""
    return "cuda" if torch.cuda.is_available() and not parse_flag_from_env("ACCELERATE_USE_CPU") else "cpu"


def choose_mixed_precision(args: argparse.Namespace) -> PrecisionChoice:
    """The run's precision: `hfzoo.training.precision.resolve_mixed_precision` for `args.mixed_precision`.

    The device is `run_device_type()`; under `accelerate launch`, the accelerate config's `mixed_precision`
    (`ACCELERATE_MIXED_PRECISION`) counts as an explicit choice when it names bf16 or fp16 and the recipe
    says `auto`.

    Args:
        args: the recipe's arguments (`mixed_precision`: `auto`, `no`, `bf16`, `fp16`, or None for `auto`).

    Returns:
        The `PrecisionChoice` (the same one on every call in a process).
    """
    return resolve_mixed_precision(
        getattr(args, "mixed_precision", None),
        device_type=run_device_type(),
        launcher=os.environ.get("ACCELERATE_MIXED_PRECISION"),
    )


def check_device_arguments(args: argparse.Namespace) -> None:
    """Refuse the recipe arguments that the run's device cannot train with, before any data or model.

    Called by `create_accelerator`, and by `hfzoo-study` on every run's arguments before the study starts.
    The device is `run_device_type()`.

    Args:
        args: the recipe's arguments (`mixed_precision`, `attn_implementation`; either may be absent).

    Raises:
        ValueError: `fp16` mixed precision (from `--mixed_precision` or the accelerate config) without a GPU
            (bf16 or fp32 are the CPU's), `--attn_implementation flex_attention` without a GPU (PyTorch's
            FlexAttention has no backward pass on the CPU), or a FlashAttention implementation
            (`flash_attention_2`, `paged|flash_attention_3`, ...: CUDA kernels) without a GPU.
    """
    precision = choose_mixed_precision(args)
    if precision.mixed_precision == "fp16" and precision.device_type == "cpu":
        given = (
            "--mixed_precision fp16"
            if precision.requested == "fp16"
            else "mixed_precision fp16 (from the accelerate config)"
        )
        raise ValueError(f"{given} needs a GPU; on CPU use bf16 or no (or auto)")
    if precision.device_type == "cpu" and getattr(args, "attn_implementation", None) == "flex_attention":
        raise ValueError(
            "--attn_implementation flex_attention cannot train on the CPU: PyTorch's FlexAttention has no backward "
            "pass there; use sdpa or eager on the CPU (flex_attention trains on a GPU)"
        )
    attention = getattr(args, "attn_implementation", None) or ""
    if precision.device_type == "cpu" and "flash_attention" in attention:
        raise ValueError(
            f"--attn_implementation {attention} needs a GPU (FlashAttention's kernels run on CUDA); use sdpa or eager "
            "on the CPU"
        )


def create_accelerator(args: argparse.Namespace, *, sync_with_dataloader: bool = False) -> Accelerator:
    """Create the run's `Accelerator` for whatever `accelerate launch` started (one process, DDP or DeepSpeed).

    On a machine without a GPU, several processes need help to form a process group: DDP runs with
    `cpu=True` (accelerate's `MULTI_CPU`, gloo backend) and DeepSpeed with an explicit gloo process
    group. FSDP2 (accelerate's `fsdp_version: 2`) runs as `MULTI_CPU` switched to FSDP (`_enable_fsdp_on_cpu`).
    A launch that started several processes (`WORLD_SIZE` > 1) but produced a world of one
    process is refused, so a "distributed" run never silently runs alone. Under DeepSpeed, the
    config's `"auto"` batch, accumulation and clipping values are filled from `args`
    (`reconcile_deepspeed_config`). Samplers are seedable, so that a resumed run draws the same
    shuffled order (`DataLoaderConfiguration(use_seedable_sampler=True)`). With `args.ddp_timeout`
    (seconds), collectives wait at most that long for the other processes.

    Args:
        args: the recipe's arguments: `mixed_precision` (`auto` or None: `choose_mixed_precision`),
            `gradient_accumulation_steps`, `per_device_train_batch_size`, `max_grad_norm`,
            `with_tracking`, `report_to`, `output_dir`, optionally `ddp_timeout`.
        sync_with_dataloader: let accelerate end an accumulation window at the end of each epoch (the
            GLUE loop); False when the loop feeds whole windows itself (pretraining,
            `hfzoo.pretraining.loop.accumulation_step`).

    Returns:
        The `Accelerator`.

    Raises:
        ValueError: arguments the device cannot train with (`check_device_arguments`: fp16 or
            `--attn_implementation flex_attention` without a GPU), a multi-process launch that yields one
            process, a DeepSpeed config that contradicts the recipe's arguments, or a launch config with keys or
            values its engine would ignore or refuse (`hfzoo.training.launch_config.check_launch`, checked first).
    """
    check_launch()  # the launch config against its engine, before the engine starts (and before any data)
    check_device_arguments(args)
    tune_glibc_malloc()
    disable_cudnn_sdpa()
    on_gpu = torch.cuda.is_available()
    precision = choose_mixed_precision(args)
    use_deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() in ("1", "true", "yes")
    use_fsdp = os.environ.get("ACCELERATE_USE_FSDP", "false").lower() in ("1", "true", "yes")
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    backend = "gloo" if use_deepspeed and not on_gpu else None  # None: accelerate's choice
    timeout = faults.collective_timeout(args.ddp_timeout) if getattr(args, "ddp_timeout", None) else None
    kwargs_handlers = [InitProcessGroupKwargs(backend=backend, timeout=timeout)] if backend or timeout else []
    accelerator = Accelerator(
        cpu=not on_gpu and not use_deepspeed,  # FSDP on CPU: MULTI_CPU, then `_enable_fsdp_on_cpu`
        mixed_precision=precision.mixed_precision,
        gradient_accumulation_plugin=GradientAccumulationPlugin(
            num_steps=args.gradient_accumulation_steps, sync_with_dataloader=sync_with_dataloader
        ),
        log_with=report_to_trackers(args.report_to) if args.with_tracking else None,
        project_dir=args.output_dir,
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
        kwargs_handlers=kwargs_handlers,
    )
    if use_fsdp and accelerator.distributed_type == DistributedType.MULTI_CPU:
        _enable_fsdp_on_cpu(accelerator)
    if launched > 1 and accelerator.num_processes == 1:
        raise ValueError(
            f"the launcher started WORLD_SIZE={launched} processes but this one runs alone "
            f"(distributed_type {accelerator.distributed_type.value}); see accelerate_configs/ for working configs"
        )
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        reconcile_deepspeed_config(
            accelerator.state.deepspeed_plugin.deepspeed_config,
            args,
            accelerator.num_processes,
            precision.mixed_precision,
        )
    if accelerator.num_processes > 1:
        faults.record_peers(accelerator)  # so that a lost process is named by rank, node and host
    return accelerator


def _enable_fsdp_on_cpu(accelerator: Accelerator) -> None:
    """Turn a multi-process CPU `Accelerator` (gloo) into an FSDP one with the launcher's FSDP settings.

    accelerate selects FSDP only on accelerator devices; `torch.distributed.fsdp.fully_shard` itself runs
    on CPU tensors over gloo, so on a machine without a GPU the state is switched to FSDP after the process
    group is formed, with the `FullyShardedDataParallelPlugin` the launcher's `FSDP_*` variables describe
    (as accelerate builds it on a GPU). Only FSDP2 (`fsdp_version: 2`) is supported there.

    Raises:
        ValueError: the accelerate config asks for FSDP1 (`fsdp_version: 1`) or for offloading
            (`fsdp_offload_params: true`, which needs a GPU to offload from).
    """
    plugin = FullyShardedDataParallelPlugin()
    if plugin.fsdp_version != 2:
        raise ValueError(
            f"fsdp_version {plugin.fsdp_version} on a machine without a GPU: only FSDP2 runs on CPU "
            "(use accelerate_configs/fsdp2.yaml)"
        )
    if isinstance(plugin.cpu_offload, CPUOffloadPolicy):
        raise ValueError(
            "fsdp_offload_params: true needs a GPU (without one the parameters are already in CPU memory); "
            "use accelerate_configs/fsdp2.yaml"
        )
    if accelerator.mixed_precision != "no":
        plugin.set_mixed_precision(accelerator.mixed_precision)
    # AcceleratorState copies PartialState's fields each time it is created (e.g. during `prepare`): set both.
    PartialState().distributed_type = DistributedType.FSDP
    accelerator.state.distributed_type = DistributedType.FSDP
    accelerator.state.fsdp_plugin = plugin


def size_buckets_from_model(ds_config: dict[str, Any]) -> None:
    """Let accelerate size DeepSpeed's communication buckets from the model's hidden size, in place.

    Bucket sizes not set in the config become `"auto"`, which `accelerator.prepare` fills with
    hidden_size-based values (as transformers' DeepSpeed examples do). DeepSpeed's own defaults ignore
    the model size: the ZeRO-3 gradient bucket alone is 5e8 elements (2 GB in fp32) per process.

    Args:
        ds_config: the DeepSpeed config dict (`accelerator.state.deepspeed_plugin.deepspeed_config`).
    """
    zero = ds_config.setdefault("zero_optimization", {})
    zero.setdefault("reduce_bucket_size", "auto")
    if zero.get("stage") == 3:
        zero.setdefault("stage3_prefetch_bucket_size", "auto")
        zero.setdefault("stage3_param_persistence_threshold", "auto")


def reconcile_deepspeed_config(
    ds_config: dict[str, Any], args: argparse.Namespace, num_processes: int, mixed_precision: str | None = None
) -> None:
    """Fill DeepSpeed's `"auto"` batch, accumulation and clipping values from the recipe, in place.

    Values already written in the DeepSpeed config must agree with the recipe (no settings to keep in
    sync by hand): global batch = `num_processes x per_device_train_batch_size x gradient_accumulation_steps`.
    Precision (`bf16`/`fp16` sections) is filled by accelerate from `--mixed_precision`; an explicit
    `enabled: true` that contradicts it is refused here.

    Args:
        ds_config: the DeepSpeed config dict (`accelerator.state.deepspeed_plugin.deepspeed_config`).
        args: the recipe's arguments.
        num_processes: the world size.
        mixed_precision: the run's resolved precision (`choose_mixed_precision`; None: `args.mixed_precision`).

    Raises:
        ValueError: a value in the DeepSpeed config contradicts the recipe (one line naming both).
    """
    per_device, accumulation = args.per_device_train_batch_size, args.gradient_accumulation_steps
    wanted = {
        "train_micro_batch_size_per_gpu": (per_device, f"--per_device_train_batch_size {per_device}"),
        "gradient_accumulation_steps": (accumulation, f"--gradient_accumulation_steps {accumulation}"),
        "train_batch_size": (
            per_device * accumulation * num_processes,
            f"{num_processes} processes x {per_device} per device x {accumulation} accumulation",
        ),
        "gradient_clipping": (args.max_grad_norm, f"--max_grad_norm {args.max_grad_norm}"),
    }
    for key, (value, source) in wanted.items():
        current = ds_config.get(key, "auto")
        if current == "auto":
            ds_config[key] = value
        elif float(current) != float(value):
            raise ValueError(f'the DeepSpeed config sets {key}={current}, which contradicts {source}; set it to "auto"')
    size_buckets_from_model(ds_config)
    requested = getattr(args, "mixed_precision", None)
    precision = mixed_precision or requested
    given = (
        f"--mixed_precision {precision}"
        if requested in (None, precision)
        else f"--mixed_precision {requested} (here: {precision})"
    )
    for section in ("bf16", "fp16"):
        enabled = ds_config.get(section, {}).get("enabled", "auto")
        if enabled is True and precision not in (None, "auto") and precision != section:
            raise ValueError(
                f'the DeepSpeed config enables {section}, which contradicts {given}; set its "enabled" to "auto"'
            )
