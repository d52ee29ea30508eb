"""Throughput of a training run: tokens/s, model FLOPs per token, achieved TFLOP/s and model FLOPs utilization.

MFU (model FLOPs utilization; PaLM, Chowdhery et al. 2022, App. B) is the model FLOPs a run performs per
second divided by the hardware's peak: `mfu = tokens_per_second x flops_per_token / (num_devices x peak)`.
The model FLOPs are those of `hfzoo.models.flops` (6 per matrix-product weight a token passes, plus
PaLM's attention term; recomputation by gradient checkpointing is not counted, as in PaLM).

The peak (`resolve_peak_tflops`):

- `--peak_tflops` when given (TFLOP/s per device);
- on CUDA, the dense (no sparsity) datasheet peak of the detected GPU for the run's precision, from
  `DATASHEET_PEAK_TFLOPS` (matched by name in `torch.cuda.get_device_name()`); fp32 means plain FP32,
  or TF32 tensor cores when `torch.get_float32_matmul_precision()` allows them. Sources (dense
  figures; the datasheets' headline numbers are with 2:4 sparsity, twice these):
  NVIDIA H100 Tensor Core GPU datasheet (H100 SXM5 / PCIe / NVL), NVIDIA H200 Tensor Core GPU
  datasheet (H200 SXM / NVL; GH200 Grace Hopper Superchip datasheet), NVIDIA A100 Tensor Core GPU
  datasheet, NVIDIA A10 / L4 / L40 / L40S datasheets;
- on CPU, a peak measured by a short matmul micro-benchmark (`measure_cpu_peak_tflops`, square matmuls
  of up to 2,048 in the precision the run trains in, on the threads torch uses) and cached in
  `~/.cache/hfzoo/cpu_peak_tflops.json` (`$XDG_CACHE_HOME/hfzoo` when set), keyed by CPU model, capability
  class as capped (`hfzoo.training.precision.cpu_capability`: a host capped to AVX2 computes bf16 at a
  hundredth of its native rate), thread count, dtype and torch version. A peak is a maximum: the cache
  keeps the highest value measured. A machine shared with other work measures a lower peak than a quiet
  one; when a run's achieved rate then exceeds its peak (an MFU above 100%), `Throughput.metrics`
  measures the peak again and keeps the higher of the two, or the achieved rate itself if it is higher
  still, so that no MFU above 100% is reported. `--peak_tflops` fixes the peak instead.

Unknown GPUs have no peak: their runs log tokens/s and TFLOP/s but no MFU (a warning names the GPU).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..configuration_utils import HfzooConfig
from ..models.flops import count_classification_flops, count_training_flops
from ..outputs import write_text_atomic
from .precision import cpu_capability

logger = logging.getLogger(__name__)

__all__ = [
    "DATASHEET_PEAK_TFLOPS",
    "PeakTflops",
    "SequenceClassificationFlops",
    "Throughput",
    "cpu_peak_cache_file",
    "datasheet_peak_tflops",
    "measure_cpu_peak_tflops",
    "pretraining_flops_per_token",
    "resolve_peak_tflops",
]

#: Square matmul size of the CPU micro-benchmark.
CPU_BENCHMARK_SIZE = 2048
#: torch dtypes of the precisions a run can train in.
PRECISION_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class PeakTflops:
    """The peak a run's MFU is measured against.

    Attributes:
        tflops: peak TFLOP/s of one device (None: unknown, no MFU).
        source: where the value comes from (`--peak_tflops`, a datasheet entry, or the CPU micro-benchmark).
        precision: `fp32` / `bf16` / `fp16` when the peak is this CPU's measured one (which `Throughput`
            measures again when a run exceeds it); None for a given or datasheet peak.
    """

    tflops: float | None
    source: str
    precision: str | None = None  # set for a CPU peak measured here (`cached_cpu_peak_tflops`): re-measurable


def precision_of(mixed_precision: str | None) -> str:
    """`fp32`, `bf16` or `fp16` from accelerate's `mixed_precision` (`"no"`/None: fp32)."""
    return {"bf16": "bf16", "fp16": "fp16"}.get(mixed_precision or "no", "fp32")


def datasheet_peak_tflops(device_name: str, precision: str) -> float | None:
    """Dense datasheet peak of a GPU (TFLOP/s) for `precision`, or None for a GPU not in the table.

    Args:
        device_name: as `torch.cuda.get_device_name()` returns it, e.g. `"NVIDIA H100 80GB HBM3"`.
        precision: `"bf16"`, `"fp16"`, `"fp32"` or `"tf32"`.

    Returns:
        The peak of the longest table key found as a whole word in `device_name` (so `"H100 PCIe"` wins
        over `"H100"`, and `"L40S"` does not match `"L4"`).

    Raises:
        ValueError: an unknown precision.
    """
    if precision not in ("bf16", "fp16", "fp32", "tf32"):
        raise ValueError(f"precision must be bf16, fp16, fp32 or tf32, got {precision!r}")
    matches = [key for key in DATASHEET_PEAK_TFLOPS if re.search(rf"(?<![\w]){re.escape(key)}(?![\w])", device_name)]
    if not matches:
        return None
    peaks = DATASHEET_PEAK_TFLOPS[max(matches, key=len)]
    return peaks["bf16"] if precision == "fp16" else peaks[precision]  # fp16 tensor-core peak = bf16's


def cpu_model_name() -> str:
    """The CPU's model name (`/proc/cpuinfo`'s `model name`; `platform.processor()` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def cpu_peak_cache_file() -> Path:
    """`$XDG_CACHE_HOME/hfzoo/cpu_peak_tflops.json` (default `~/.cache/hfzoo/cpu_peak_tflops.json`)."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "hfzoo" / "cpu_peak_tflops.json"


def measure_cpu_peak_tflops(precision: str, size: int = CPU_BENCHMARK_SIZE, min_seconds: float = 0.3) -> float:
    """Measure this CPU's matmul throughput (TFLOP/s) in `precision` on torch's current threads.

    The best of repeated `(n, n) @ (n, n)` products (2 n^3 FLOPs each) over at least `min_seconds`, after
    one warm-up product. `n` is `size`, or less where this CPU is slow in `precision` (bf16 without native
    support runs at a few GFLOP/s, where one product of 2,048 takes seconds): a product of 256 first
    estimates the rate, and `n` is the largest multiple of 64 (at least 256) whose product takes about a
    tenth of `min_seconds`.

    Args:
        precision: `"fp32"`, `"bf16"` or `"fp16"`.
        size: the largest matrix size.
        min_seconds: time to keep measuring (s); at least 3 products are timed.

    Returns:
        TFLOP/s.

    Raises:
        ValueError: an unknown precision.
    """
    if precision not in PRECISION_DTYPES:
        raise ValueError(f"precision must be one of {sorted(PRECISION_DTYPES)}, got {precision!r}")
    generator = torch.Generator().manual_seed(0)
    dtype = PRECISION_DTYPES[precision]
    probe = min(size, 256)
    a, b = (torch.randn(probe, probe, generator=generator).to(dtype) for _ in range(2))
    torch.mm(a, b)  # warm-up: thread pool, kernel selection
    t0 = time.perf_counter()
    torch.mm(a, b)
    rate = 2 * probe**3 / max(time.perf_counter() - t0, 1e-9)  # FLOP/s, a first estimate
    size = max(probe, min(size, int((rate * min_seconds / 10 / 2) ** (1 / 3)) // 64 * 64))
    a, b = (torch.randn(size, size, generator=generator).to(dtype) for _ in range(2))
    torch.mm(a, b)  # warm-up at the measured size
    best, start, timed = float("inf"), time.perf_counter(), 0
    while timed < 3 or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        torch.mm(a, b)
        best, timed = min(best, time.perf_counter() - t0), timed + 1
    return 2 * size**3 / best / 1e12


def _cpu_peak_key(precision: str) -> str:
    """The cache key of this CPU's peak: model, capability class (as capped), threads, dtype, torch version."""
    return (
        f"{cpu_model_name()} | {cpu_capability().describe()} | {torch.get_num_threads()} threads | {precision} | "
        f"torch {torch.__version__}"
    )


def _read_cpu_peak_cache(path: Path) -> dict:
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return cache if isinstance(cache, dict) else {}


def cached_cpu_peak_tflops(precision: str, at_least: float = 0.0) -> float:
    """This CPU's peak TFLOP/s in `precision`: measured once per key (`_cpu_peak_key`), then read from the cache.

    The cache is `cpu_peak_cache_file()`, written atomically; an unreadable cache is measured again. With
    `at_least` > 0 (a run achieved that rate: the cached peak is too low) the peak is measured again and the
    cache keeps the highest of the cached value, the new measurement and `at_least`.

    Args:
        precision: `"fp32"`, `"bf16"` or `"fp16"`.
        at_least: TFLOP/s the peak is known to reach (0: none).

    Returns:
        TFLOP/s.
    """
    path = cpu_peak_cache_file()
    key = _cpu_peak_key(precision)
    cache = _read_cpu_peak_cache(path)
    cached = float(cache[key]) if isinstance(cache.get(key), (int, float)) else None
    if cached is not None and cached >= at_least:
        return cached
    value = max(measure_cpu_peak_tflops(precision), cached or 0.0, at_least)
    cache = _read_cpu_peak_cache(path)  # another process may have written meanwhile: keep the highest
    if isinstance(cache.get(key), (int, float)):
        value = max(value, float(cache[key]))
    cache[key] = value
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps(cache, indent=1) + "\n")
    except OSError as err:  # a read-only home still gets its MFU, measured again next time
        logger.warning(f"cannot cache the CPU peak in {path}: {err}")
    return value


def resolve_peak_tflops(device: torch.device, mixed_precision: str | None, override: float | None = None) -> PeakTflops:
    """The per-device peak a run's MFU is measured against (see the module docstring).

    Args:
        device: the run's device (`accelerator.device`).
        mixed_precision: accelerate's `mixed_precision` (`"no"`, `"bf16"`, `"fp16"` or None).
        override: `--peak_tflops` (TFLOP/s per device), used as given when set.

    Returns:
        A `PeakTflops` (its `tflops` None for a GPU not in `DATASHEET_PEAK_TFLOPS`).

    Raises:
        ValueError: a non-positive `override`.
    """
    precision = precision_of(mixed_precision)
    if override is not None:
        if not override > 0:
            raise ValueError(f"--peak_tflops must be positive, got {override}")
        return PeakTflops(float(override), "--peak_tflops")
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        if precision == "fp32" and torch.get_float32_matmul_precision() != "highest":
            precision = "tf32"
        value = datasheet_peak_tflops(name, precision)
        if value is None:
            logger.warning(f"no datasheet peak for GPU {name!r}: no MFU is reported (give --peak_tflops)")
            return PeakTflops(None, f"unknown GPU {name}")
        return PeakTflops(value, f"datasheet {name} {precision} (dense)")
    if device.type == "cpu":
        value = cached_cpu_peak_tflops(precision)
        return PeakTflops(value, _cpu_peak_source(precision), precision)
    return PeakTflops(None, f"no peak for device type {device.type}")


def _cpu_peak_source(precision: str) -> str:
    return (
        f"measured {precision} matmul, {cpu_model_name()} ({cpu_capability().describe()}), "
        f"{torch.get_num_threads()} threads"
    )


def pretraining_flops_per_token(
    config, block_size: int, raw_block_size: int, target_length: int | None = None
) -> float:
    """Training FLOPs per text token of a pretraining run (`hfzoo.models.flops.count_training_flops`).

    Args:
        config: the model's hfzoo config.
        block_size: tokens of the model's input sequence (an encoder-decoder's encoder input).
        raw_block_size: text tokens each sequence is made of (the unit of the run's `tokens_per_second`;
            span corruption: before corruption; otherwise `block_size`).
        target_length: an encoder-decoder's decoder length (span corruption's target length).

    Returns:
        FLOPs of one training sequence / `raw_block_size`, so that `tokens_per_second x flops_per_token`
        is the run's FLOP/s.
    """
    return count_training_flops(config, block_size, target_length).total / raw_block_size


class SequenceClassificationFlops:
    """Training FLOPs of a sequence classifier's padded batches (GLUE finetuning), counted on their real tokens.

    A sequence's FLOPs depend on its length alone, so they are tabulated per length (once, up to the widest
    batch seen) and a batch's FLOPs are one lookup on its device: no host sync per batch.

    - An hfzoo model: `hfzoo.models.flops.count_classification_flops`, its architecture's own count (the
      experts a token is sent to, a Universal Transformer's recurrent steps, a funnel's pooled lengths, ...;
      the rules of pretraining's MFU).
    - Any other model (e.g. a BERT from the Hub): `6 N` per token over its `N` non-embedding parameters
      (Kaplan et al. 2020 §2.1; the classifier head included) plus PaLM's attention term `12 d_attn T^2` per
      attention layer and sequence of `T` real tokens (an encoder-decoder's decoder layers count self- and
      cross-attention).

    Frozen weights (PEFT) are counted like trained ones, as MFU does; adapter weights (LoRA's low-rank
    products) and prefix tokens are not counted.

    Args:
        config: the model's config (the base model's under PEFT); an hfzoo config needs its `num_labels`.
        non_embedding_parameters: `N` of a model that is not an hfzoo model (not used for hfzoo models).
        max_length: the longest sequence expected (tokens; the tokenizer's truncation), tabulated at once.
        device: where the batches' attention masks are.

    Raises:
        ValueError: `max_length` < 1.
    """

    def __init__(self, config, non_embedding_parameters: int = 0, max_length: int = 128, device=None) -> None:
        if max_length < 1:
            raise ValueError(f"max_length must be at least 1 token, got {max_length}")
        self.config = config
        self.non_embedding_parameters = non_embedding_parameters
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.table = self._tabulate(max_length)

    def sequence_flops(self, seq_len: int) -> float:
        """Training FLOPs of one sequence of `seq_len` real tokens (0 for an empty one)."""
        if seq_len == 0:
            return 0.0
        if isinstance(self.config, HfzooConfig):
            return float(count_classification_flops(self.config, seq_len).total)
        config = self.config
        heads = config.num_attention_heads
        width = heads * (getattr(config, "head_dim", None) or config.hidden_size // heads)
        layers = config.num_hidden_layers
        if getattr(config, "is_encoder_decoder", False):
            layers += 2 * (getattr(config, "num_decoder_layers", None) or config.num_hidden_layers)
        return float(6 * self.non_embedding_parameters * seq_len + 12 * layers * width * seq_len**2)

    def _tabulate(self, max_length: int) -> torch.Tensor:
        """`(max_length + 1,)` float64 FLOPs of every length from 0, on `self.device`."""
        flops = [self.sequence_flops(length) for length in range(max_length + 1)]
        return torch.tensor(flops, dtype=torch.float64, device=self.device)

    def __call__(self, attention_mask: torch.Tensor) -> torch.Tensor:
        """The batch's training FLOPs: the sum over its rows of their sequences' FLOPs.

        Args:
            attention_mask: `(batch_size, seq_len)`, 1 at real tokens (any integer or bool dtype).

        Returns:
            A float64 scalar tensor on `attention_mask`'s device (no host sync).
        """
        if attention_mask.shape[-1] >= len(self.table):  # wider than tabulated (known from the shape alone)
            self.table = self._tabulate(attention_mask.shape[-1])
        table = self.table.to(attention_mask.device)
        lengths = attention_mask.sum(-1)
        return table[lengths].sum()


@dataclass
class Throughput:
    """Turns tokens, FLOPs and seconds into the logged metrics of a training window or run.

    Attributes:
        peak: the per-device peak (`resolve_peak_tflops`).
        num_devices: processes training together (their peaks add up).
    """

    peak: PeakTflops
    num_devices: int = 1

    def metrics(self, tokens: float, flops: float, seconds: float) -> dict[str, float]:
        """`tokens_per_second`, `flops_per_token`, `tflops` (achieved, all devices) and `mfu` (fraction).

        Args:
            tokens: tokens trained in the window (all processes).
            flops: their training FLOPs.
            seconds: the window's wall time (s).

        Returns:
            The metrics; `mfu` is left out when the peak is unknown, `tflops` and `mfu` when `flops` is 0
            (unknown), everything but `flops_per_token` when `seconds` is not positive. When the achieved
            rate exceeds a CPU peak measured here, the peak is measured again first (`cached_cpu_peak_tflops`
            with `at_least` the achieved rate per device; `peak` is updated), so `mfu` is at most 1.
        """
        record = {"flops_per_token": flops / tokens if tokens else 0.0}
        if seconds <= 0:
            return record
        record["tokens_per_second"] = tokens / seconds
        if flops <= 0:  # FLOPs unknown (not an hfzoo config)
            return record
        record["tflops"] = flops / seconds / 1e12
        per_device = record["tflops"] / self.num_devices
        if self.peak.tflops and self.peak.precision is not None and per_device > self.peak.tflops:
            old = self.peak.tflops
            value = cached_cpu_peak_tflops(self.peak.precision, at_least=per_device)
            source = _cpu_peak_source(self.peak.precision)
            if value <= per_device:
                source += f"; raised to a run's achieved rate ({per_device:.4g} TFLOP/s)"
            self.peak = PeakTflops(value, source, self.peak.precision)
            logger.info(
                f"achieved {per_device:.4g} TFLOP/s per device, above the CPU peak {old:.4g}: "
                f"peak measured again, now {value:.4g} TFLOP/s"
            )
        if self.peak.tflops:
            record["mfu"] = record["tflops"] / (self.peak.tflops * self.num_devices)
        return record


#: Dense peak TFLOP/s per GPU (no 2:4 sparsity) by name as found in `torch.cuda.get_device_name()`:
#: `bf16` (= fp16) and `tf32` on tensor cores, `fp32` on the CUDA cores. Sources in the module docstring.
DATASHEET_PEAK_TFLOPS: dict[str, dict[str, float]] = {
    "H100": {"bf16": 989.4, "tf32": 494.7, "fp32": 66.9},  # H100 SXM5 (device name "NVIDIA H100 80GB HBM3")
    "H100 PCIe": {"bf16": 756.5, "tf32": 378.0, "fp32": 51.2},
    "H100 NVL": {"bf16": 835.5, "tf32": 417.5, "fp32": 60.0},
    "H200": {"bf16": 989.4, "tf32": 494.7, "fp32": 66.9},  # H200 SXM
    "H200 NVL": {"bf16": 835.5, "tf32": 417.5, "fp32": 60.0},
    "GH200": {"bf16": 989.4, "tf32": 494.7, "fp32": 66.9},
    "A100": {"bf16": 312.0, "tf32": 156.0, "fp32": 19.5},  # SXM4 and PCIe, 40 and 80 GB
    "A10": {"bf16": 125.0, "tf32": 62.5, "fp32": 31.2},
    "L4": {"bf16": 121.0, "tf32": 60.0, "fp32": 30.3},
    "L40": {"bf16": 181.0, "tf32": 90.5, "fp32": 90.5},
    "L40S": {"bf16": 362.0, "tf32": 183.0, "fp32": 91.6},
}
