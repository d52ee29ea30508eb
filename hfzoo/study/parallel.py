"""`--parallel_runs auto`: how many study processes one machine runs at once, and with how many threads each.

Models this small leave a GPU (and a CPU core) mostly idle in one process; several processes sharing the
device keep it busy. `auto` sizes the count from the device's free memory and an *estimate* of one run's
peak memory (not a measurement: no run is made first), capped by the CPU cores, so that every process has a
core of its own:

* per-run peak = a fixed per-process cost (`CUDA_PROCESS_BYTES`: the CUDA context, cuBLAS workspaces and
  the caching allocator's slack; `CPU_PROCESS_BYTES`: Python with torch, transformers and datasets
  imported) + 16 bytes per parameter (fp32 weights, gradients and AdamW's two moments) + the activations
  kept for the backward pass, Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
  Transformer Models", §4.1, Eq. 1): `s b h (34 + 5 a s / h)` bytes per layer with 16-bit activations
  (doubled for fp32), for the encoder's layers at the input length and the decoder's at the target length,
  plus the output logits and their gradient in fp32 (`3 x 4 b s_dec V` bytes);
* on CUDA: `floor(0.9 x free GPU memory / per-run peak)`, at most the CPU cores; each process gets
  `cores // n` threads;
* on CPU: one process per core (`OMP_NUM_THREADS=1` each), at most `floor(0.8 x available RAM / per-run peak)`.

The largest model of the study (over its variants) sets the per-run peak.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch

from ..training.precision import resolve_mixed_precision
from .arguments import sequences_per_device
from .configs import build_variant_config, count_parameters, target_length
from .protocol import BASELINE
from .settings import StudySettings

#: Per-process memory besides the model on a GPU: the CUDA context, library workspaces and allocator slack.
CUDA_PROCESS_BYTES = 1 << 30
#: Per-process memory besides the model on the CPU: the interpreter with torch, transformers and datasets.
CPU_PROCESS_BYTES = 1 << 30
#: Shares of the free memory `auto` plans to use (the rest is headroom for fragmentation and other programs).
GPU_MEMORY_SHARE = 0.9
CPU_MEMORY_SHARE = 0.8


@dataclasses.dataclass(frozen=True)
class ParallelPlan:
    """What `--parallel_runs auto` resolved to.

    Attributes:
        processes: study processes to run at once (>= 1).
        threads: torch / OpenMP threads per process (`OMP_NUM_THREADS`).
        device: "cuda" or "cpu".
        per_run_bytes: the estimated peak memory of one run (bytes).
        reason: one line saying which limit decided.
    """

    processes: int
    threads: int
    device: str
    per_run_bytes: int
    reason: str


def estimate_run_bytes(
    parameters: int,
    *,
    batch_size: int,
    input_length: int,
    target_length: int,
    hidden_size: int,
    num_heads: int,
    encoder_layers: int,
    decoder_layers: int,
    vocab_size: int,
    half_precision: bool,
    device: str,
) -> int:
    """Estimated peak memory of one pretraining run (bytes); see the module docstring for the formula.

    Args:
        parameters: parameters of the model (all of them, experts included).
        batch_size: sequences per optimizer step (per process).
        input_length: encoder tokens per sequence.
        target_length: decoder tokens per sequence.
        hidden_size: the model's width (Korthikanti et al.'s h).
        num_heads: attention heads (their a).
        encoder_layers: encoder layers.
        decoder_layers: decoder layers.
        vocab_size: output vocabulary (the logits' width).
        half_precision: activations kept in 16 bits (bf16 / fp16 autocast) rather than 32.
        device: "cuda" or "cpu" (the fixed per-process cost differs).

    Returns:
        Bytes.
    """
    scale = 1 if half_precision else 2

    def layer_bytes(length: int) -> float:
        return length * batch_size * hidden_size * (34 + 5 * num_heads * length / hidden_size) * scale

    activations = encoder_layers * layer_bytes(input_length) + decoder_layers * layer_bytes(target_length)
    logits = 3 * 4 * batch_size * target_length * vocab_size
    fixed = CUDA_PROCESS_BYTES if device == "cuda" else CPU_PROCESS_BYTES
    return int(fixed + 16 * parameters + activations + logits)


def plan_parallel_runs(
    *, device: str, per_run_bytes: int, free_memory_bytes: int, cpu_cores: int, runs: int | None = None
) -> ParallelPlan:
    """How many study processes fit: see the module docstring.

    Args:
        device: "cuda" (`free_memory_bytes` is the GPU's free memory) or "cpu" (the available RAM).
        per_run_bytes: one run's peak memory (`estimate_run_bytes`).
        free_memory_bytes: free memory of the device the runs use.
        cpu_cores: CPU cores this process may use.
        runs: runs left to do (no more processes than runs), or None.

    Returns:
        The plan (at least one process, at least one thread each).

    Raises:
        ValueError: a non-positive `per_run_bytes` or `cpu_cores`, or an unknown device.
    """
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', got {device!r}")
    if per_run_bytes <= 0 or cpu_cores <= 0:
        raise ValueError(f"per_run_bytes and cpu_cores must be positive, got {per_run_bytes} and {cpu_cores}")
    share = GPU_MEMORY_SHARE if device == "cuda" else CPU_MEMORY_SHARE
    by_memory = int(share * max(0, free_memory_bytes) // per_run_bytes)
    limits = {"memory": by_memory, "CPU cores": cpu_cores}
    if runs is not None:
        limits["runs left"] = max(1, runs)
    limit = min(limits, key=limits.get)
    processes = max(1, limits[limit])
    threads = max(1, cpu_cores // processes)
    what = "GPU" if device == "cuda" else "RAM"
    reason = (
        f"{processes} process(es) x {threads} thread(s): limited by {limit} ({cpu_cores} cores, "
        f"{free_memory_bytes / 2**30:.1f} GiB free {what}, about {per_run_bytes / 2**30:.2f} GiB per run)"
    )
    return ParallelPlan(processes, threads, device, per_run_bytes, reason)


def cpu_cores() -> int:
    """CPU cores this process may run on (its affinity mask; `os.cpu_count()` where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def available_ram_bytes() -> int:
    """Memory available to new processes (`MemAvailable` of /proc/meminfo; free pages elsewhere), bytes."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:  # pragma: no cover - not Linux
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def resolve_parallel_runs(
    settings: StudySettings, num_processes: int, tokenizer_fields: dict[str, Any], runs: int | None = None
) -> ParallelPlan:
    """`--parallel_runs auto` on this machine: `plan_parallel_runs` for the study's largest model.

    The per-run peak memory is estimated (`estimate_run_bytes`: the largest variant's parameters, the
    per-device batch, the input and target lengths), not measured; the free memory is the GPU's
    (`torch.cuda.mem_get_info`) when CUDA is available, else the available RAM; the cores are this process's.

    Args:
        settings: the study settings (paths resolved).
        num_processes: processes per run (`--num_processes`; the per-device batch is divided by it).
        tokenizer_fields: `vocab_size` and special token ids (`check_settings`' planned ones).
        runs: runs left to do (caps the processes), or None.

    Returns:
        The plan.
    """
    targets = target_length(settings)  # None: one stack, whose every token is predicted (or may be)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    precision = resolve_mixed_precision(settings.mixed_precision, device_type=device).mixed_precision
    half_precision = precision in ("bf16", "fp16")  # activations kept in 16 bits
    per_run = 0
    for variant in settings.variants or [BASELINE]:
        config = build_variant_config(settings, variant, tokenizer_fields)
        per_run = max(per_run, estimate_run_bytes(
            count_parameters(config),
            batch_size=sequences_per_device(settings, num_processes),
            input_length=settings.block_size,
            target_length=settings.block_size if targets is None else targets,
            hidden_size=config.hidden_size,
            num_heads=config.num_attention_heads,
            encoder_layers=0 if targets is None else config.num_hidden_layers,
            decoder_layers=config.num_hidden_layers if targets is None else config.num_decoder_layers,
            vocab_size=config.vocab_size,
            half_precision=half_precision,
            device=device,
        ))  # fmt: skip
    free = torch.cuda.mem_get_info()[0] if device == "cuda" else available_ram_bytes()
    return plan_parallel_runs(device=device, per_run_bytes=per_run, free_memory_bytes=free, cpu_cores=cpu_cores(),
                              runs=runs)  # fmt: skip
