"""The precision a run trains in: `--mixed_precision auto` (the default) picks it from the hardware.

bf16 autocast is fast only where the hardware computes bf16 products natively: NVIDIA GPUs from Ampere
on, and x86 CPUs with AVX512-BF16 or AMX (Intel Cooper Lake, Sapphire Rapids and later; AMD Zen 4 and
later). Elsewhere oneDNN emulates bf16 matmuls: measured on an AMD EPYC (Zen 5) capped to AVX2 with
`ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2` (torch 2.13.0, 2 threads, the machine shared with other
work), a 2048x256 @ 256x1024 matmul ran at 2.0 GFLOP/s in bf16 against 227 in fp32, and an `nn.Linear` of
that shape under bf16 autocast at 36 GFLOP/s against 205 without it (uncapped, the same CPU: 1,028 and 926
GFLOP/s in bf16); an AVX2-only AMD EPYC (Zen 3) measured 1.2 GFLOP/s in bf16 against 132 in fp32.
So `auto` trains in bf16 where it is native and in fp32 (accelerate's `"no"`) elsewhere
(`resolve_mixed_precision`).

The CPU's class (`cpu_capability`): `AMX`, `AVX512-BF16`, `AVX512`, `AVX2` or `other` (no AVX2: older x86,
or another architecture such as aarch64, where `auto` keeps fp32). It is what torch reports
(`torch.cpu._is_amx_tile_supported`, `torch.cpu._is_avx512_bf16_supported`,
`torch.backends.cpu.get_cpu_capability`), lowered by the caps a user sets to make a host behave as a smaller
one: `ATEN_CPU_CAPABILITY` (torch's own vectorised kernels; `get_cpu_capability` reflects it) and
`ONEDNN_MAX_CPU_ISA` (or its older name `DNNL_MAX_CPU_ISA`; oneDNN's matmuls and convolutions, which torch's
capability functions do not reflect). With both set to AVX2, an AVX-512 or AMX host runs bf16 matmuls
through oneDNN's slow AVX2 path, as an AVX2-only host does, and counts as `AVX2`.
"""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)

__all__ = [
    "CPU_CLASSES",
    "MIXED_PRECISION_CHOICES",
    "CpuCapability",
    "PrecisionChoice",
    "aten_cpu_capability",
    "cpu_capability",
    "resolve_mixed_precision",
]

#: CPU capability classes, lowest first (`cpu_capability`).
CPU_CLASSES = ("other", "AVX2", "AVX512", "AVX512-BF16", "AMX")
#: The classes whose CPUs compute bf16 products natively.
NATIVE_BF16_CLASSES = ("AVX512-BF16", "AMX")
#: `--mixed_precision` values: `auto` (`resolve_mixed_precision`) and accelerate's own.
MIXED_PRECISION_CHOICES = ("auto", "no", "bf16", "fp16")

#: The highest class a oneDNN ISA cap (`ONEDNN_MAX_CPU_ISA`, upper case) lets oneDNN use; the oneDNN ISA names
#: of oneDNN 3.x (`dnnl::cpu_isa`). A name not listed (ALL, DEFAULT, a typo) caps nothing, as in oneDNN.
ONEDNN_ISA_CLASSES = {
    "SSE41": "other",
    "AVX": "other",
    "AVX2": "AVX2",
    "AVX2_VNNI": "AVX2",
    "AVX2_VNNI_2": "AVX2",
    "AVX512_CORE": "AVX512",
    "AVX512_CORE_VNNI": "AVX512",
    "AVX512_CORE_BF16": "AVX512-BF16",
    "AVX512_CORE_FP16": "AVX512-BF16",
    "AVX10_1_512": "AVX512-BF16",
    "AVX10_2_512": "AVX512-BF16",
    "AVX512_CORE_AMX": "AMX",
    "AVX512_CORE_AMX_FP16": "AMX",
    "AVX10_1_512_AMX": "AMX",
    "AVX10_1_512_AMX_FP16": "AMX",
    "AVX10_2_512_AMX_2": "AMX",
}
#: The highest class torch's own kernels may use under an `ATEN_CPU_CAPABILITY` value (lower case, as torch reads it).
ATEN_CAPABILITY_CLASSES = {"default": "other", "avx2": "AVX2"}


def _torch_flag(name: str) -> bool:
    """A `torch.cpu._is_*_supported()` capability check (private torch API: False where it is missing)."""
    check = getattr(torch.cpu, name, None)
    try:
        return bool(check()) if check is not None else False
    except RuntimeError:  # pragma: no cover - cpuinfo failed to initialise
        return False


@dataclass(frozen=True)
class CpuCapability:
    """What a CPU computes natively, after the caps set in the environment.

    Attributes:
        cpu_class: the effective class, one of `CPU_CLASSES` (the hardware's, lowered by the caps).
        hardware_class: the CPU's own class, without the caps.
        caps: the environment settings that lowered it (`("ONEDNN_MAX_CPU_ISA=AVX2", ...)`; empty if none did).
    """

    cpu_class: str
    hardware_class: str
    caps: tuple[str, ...] = ()

    @property
    def native_bf16(self) -> bool:
        """Whether this CPU (as capped) computes bf16 products natively (AVX512-BF16 or AMX)."""
        return self.cpu_class in NATIVE_BF16_CLASSES

    def describe(self) -> str:
        """One phrase: the class, and the caps and the hardware's class when they differ (for logs and records)."""
        if not self.caps:
            return self.cpu_class
        return f"{self.cpu_class} (capped by {', '.join(self.caps)}; the CPU itself: {self.hardware_class})"


def aten_cpu_capability() -> str:
    """The `ATEN_CPU_CAPABILITY` setting as torch reads it: lower case, stripped; "" when unset.

    It caps the vector instruction set of torch's own CPU kernels and of the C++ inductor generates
    (`default`, `avx2`, `avx512`, ...).
    """
    return os.environ.get("ATEN_CPU_CAPABILITY", "").strip().lower()


def cpu_capability() -> CpuCapability:
    """This CPU's capability class, honouring `ATEN_CPU_CAPABILITY` and `ONEDNN_MAX_CPU_ISA` (module docstring).

    Returns:
        A `CpuCapability`: `AMX` (AMX tiles), `AVX512-BF16`, `AVX512`, `AVX2` or `other`, the lowest of the
        hardware's class, the class `ATEN_CPU_CAPABILITY` allows (`default` or `avx2`) and the class
        `ONEDNN_MAX_CPU_ISA` (else `DNNL_MAX_CPU_ISA`) allows.
    """
    if _torch_flag("_is_amx_tile_supported"):
        hardware = "AMX"
    elif _torch_flag("_is_avx512_bf16_supported"):
        hardware = "AVX512-BF16"
    elif _torch_flag("_is_avx512_supported"):
        hardware = "AVX512"
    elif _torch_flag("_is_avx2_supported"):
        hardware = "AVX2"
    else:
        hardware = "other"
    rank = CPU_CLASSES.index
    effective, caps = hardware, []
    aten = aten_cpu_capability()
    aten_cap = ATEN_CAPABILITY_CLASSES.get(aten)  # avx512 (or a value torch ignores) caps nothing here
    if aten_cap is not None and rank(aten_cap) < rank(effective):
        effective = aten_cap
        caps.append(f"ATEN_CPU_CAPABILITY={aten}")
    for variable in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        value = os.environ.get(variable, "").strip()
        if value:
            onednn_cap = ONEDNN_ISA_CLASSES.get(value.upper())
            if onednn_cap is not None and rank(onednn_cap) < rank(hardware):
                effective = min(effective, onednn_cap, key=rank)
                caps.append(f"{variable}={value}")
            break  # oneDNN reads ONEDNN_MAX_CPU_ISA first and DNNL_MAX_CPU_ISA only without it
    return CpuCapability(effective, hardware, tuple(caps))


@dataclass(frozen=True)
class PrecisionChoice:
    """The precision a run trains in and why (`resolve_mixed_precision`).

    Attributes:
        mixed_precision: accelerate's value: `"no"` (fp32), `"bf16"` or `"fp16"`.
        requested: what was asked for: `"auto"`, `"no"`, `"bf16"` or `"fp16"`.
        device_type: `"cuda"` or `"cpu"`.
        host: the device's capability: the GPU's name, or the CPU's class (`CpuCapability.describe`).
        reason: one sentence saying why (for the log and the results).
    """

    mixed_precision: str
    requested: str
    device_type: str
    host: str
    reason: str

    def record(self) -> dict[str, str]:
        """The fields the jobs write into `all_results.json` (and the study into `results.json`)."""
        return {
            "mixed_precision": self.mixed_precision,
            "mixed_precision_requested": self.requested,
            "mixed_precision_reason": self.reason,
            "host_capability": f"{self.device_type}: {self.host}",
        }


#: Explicit bf16 on a CPU without native bf16 is said once per process (`resolve_mixed_precision`).
_warned_slow_bf16: set[str] = set()


def resolve_mixed_precision(
    requested: str | None = "auto", *, device_type: str = "cpu", launcher: str | None = None
) -> PrecisionChoice:
    """The precision of a run: `--mixed_precision auto` (the default of every recipe) decided from the hardware.

    The rule:

    - an explicit `no`, `bf16` or `fp16` is used as given; `bf16` on a CPU without native bf16 (below
      `AVX512-BF16`, see `cpu_capability`) runs, emulated and many times slower than fp32, with a warning
      (once per process) naming the CPU's class;
    - `auto` (or None) with a launcher whose accelerate config names `bf16` or `fp16` (`launcher`, accelerate's
      `ACCELERATE_MIXED_PRECISION`) takes that value: the config asked for it explicitly (accelerate writes
      `"no"` when nothing was chosen, so `"no"` there means "not chosen");
    - otherwise `auto` is `bf16` on a CUDA GPU that computes bf16 natively
      (`torch.cuda.is_bf16_supported(including_emulation=False)`: Ampere and later) and fp32 (`no`) on older
      GPUs (fp16 needs loss scaling: ask for it explicitly); on the CPU, `bf16` where the CPU (as capped by
      `ONEDNN_MAX_CPU_ISA` / `ATEN_CPU_CAPABILITY`) has AVX512-BF16 or AMX, and fp32 elsewhere (AVX2-only
      and AVX-512 CPUs without BF16, non-x86 CPUs).

    Args:
        requested: `auto`, `no`, `bf16` or `fp16` (None: `auto`).
        device_type: the device the run trains on: `"cuda"` or `"cpu"`.
        launcher: the accelerate config's `mixed_precision` (`os.environ["ACCELERATE_MIXED_PRECISION"]` under
            `accelerate launch`), or None.

    Returns:
        A `PrecisionChoice`.

    Raises:
        ValueError: an unknown `requested` or `device_type` value.
    """
    requested = requested or "auto"
    if requested not in MIXED_PRECISION_CHOICES:
        raise ValueError(f"--mixed_precision must be one of {', '.join(MIXED_PRECISION_CHOICES)}, got {requested!r}")
    if device_type not in ("cuda", "cpu"):
        raise ValueError(f"device_type must be 'cuda' or 'cpu', got {device_type!r}")
    if device_type == "cuda":
        host = torch.cuda.get_device_name()
        try:
            native = torch.cuda.is_bf16_supported(including_emulation=False)
        except TypeError:  # pragma: no cover - torch without the argument
            native = torch.cuda.is_bf16_supported()
        capability = None
    else:
        capability = cpu_capability()
        host, native = capability.describe(), capability.native_bf16
    device = "GPU" if device_type == "cuda" else "CPU"
    if requested != "auto":
        choice = PrecisionChoice(requested, requested, device_type, host, f"--mixed_precision {requested} as given")
    elif launcher in ("bf16", "fp16"):
        choice = PrecisionChoice(
            launcher, requested, device_type, host, f"auto: the accelerate config's mixed_precision {launcher}"
        )
    elif native:
        choice = PrecisionChoice(
            "bf16", requested, device_type, host, f"auto: bf16, this {device} computes bf16 natively ({host})"
        )
    else:
        choice = PrecisionChoice(
            "no", requested, device_type, host, f"auto: fp32, this {device} has no native bf16 ({host})"
        )
    if choice.mixed_precision == "bf16" and capability is not None and not native and host not in _warned_slow_bf16:
        _warned_slow_bf16.add(host)
        warnings.warn(
            f"mixed_precision bf16 on a CPU without native bf16 ({host}): bf16 matmuls are emulated, many times "
            "slower than fp32; --mixed_precision auto (or no) trains in fp32 here",
            UserWarning,
            stacklevel=2,
        )
    return choice
