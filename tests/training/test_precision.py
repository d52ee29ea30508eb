"""`--mixed_precision auto` (`hfzoo.training.precision`): bf16 where the device computes it natively, else fp32.

The CPU's capability is mocked (torch's capability checks) or capped for real in a child process with
`ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2`, which makes any AVX2-capable x86 host an AVX2 host.
"""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from hfzoo.finetuning import parse_glue_args
from hfzoo.hub import build_model_card
from hfzoo.models.presets import build_config
from hfzoo.pretraining import build_pretrain_parser
from hfzoo.training import precision
from hfzoo.training.accelerator import choose_mixed_precision, run_device_type
from hfzoo.training.precision import cpu_capability, resolve_mixed_precision

REPO_ROOT = Path(__file__).resolve().parents[2]
CAP_VARIABLES = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY", "ACCELERATE_MIXED_PRECISION")
FLAGS = ("_is_amx_tile_supported", "_is_avx512_bf16_supported", "_is_avx512_supported", "_is_avx2_supported")


@pytest.fixture
def cpu(monkeypatch):
    """Set the CPU's flags (`cpu("AMX")`, ...): torch's checks mocked, no caps in the environment, no warning yet."""
    for variable in CAP_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(precision, "_warned_slow_bf16", set())

    def set_class(name: str) -> None:
        top = {"AMX": 0, "AVX512-BF16": 1, "AVX512": 2, "AVX2": 3, "other": 4}[name]
        for i, flag in enumerate(FLAGS):
            monkeypatch.setattr(torch.cpu, flag, lambda has=i >= top and name != "other": has)

    return set_class


@pytest.mark.parametrize(
    ("name", "expected"), [("AMX", "bf16"), ("AVX512-BF16", "bf16"), ("AVX512", "no"), ("AVX2", "no"), ("other", "no")]
)
def test_auto_on_the_cpu_is_bf16_only_where_bf16_is_native(cpu, name, expected):
    cpu(name)
    assert cpu_capability().cpu_class == name
    choice = resolve_mixed_precision("auto", device_type="cpu")
    assert choice.mixed_precision == expected
    assert name in choice.reason and choice.reason.startswith(f"auto: {'bf16' if expected == 'bf16' else 'fp32'}")
    assert choice.record()["host_capability"] == f"cpu: {name}"


@pytest.mark.parametrize(
    ("variables", "expected_class", "caps"),
    [
        ({"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}, "AVX2", 2),
        ({"ONEDNN_MAX_CPU_ISA": "avx2"}, "AVX2", 1),  # oneDNN reads the name in any case
        ({"ATEN_CPU_CAPABILITY": "avx2"}, "AVX2", 1),
        ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}, "AVX512", 1),
        ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, "AVX512-BF16", 1),
        ({"DNNL_MAX_CPU_ISA": "AVX2"}, "AVX2", 1),  # the older name
        ({"ONEDNN_MAX_CPU_ISA": "ALL", "DNNL_MAX_CPU_ISA": "AVX2"}, "AMX", 0),  # oneDNN reads ONEDNN_ first
        ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX", "ATEN_CPU_CAPABILITY": "avx512"}, "AMX", 0),  # no lower
    ],
)
def test_the_caps_in_the_environment_lower_the_class(cpu, monkeypatch, variables, expected_class, caps):
    cpu("AMX")
    for variable, value in variables.items():
        monkeypatch.setenv(variable, value)
    capability = cpu_capability()
    assert (capability.cpu_class, capability.hardware_class, len(capability.caps)) == (expected_class, "AMX", caps)
    if caps:
        assert "the CPU itself: AMX" in capability.describe()
    expected = "bf16" if expected_class in ("AMX", "AVX512-BF16") else "no"
    assert resolve_mixed_precision("auto").mixed_precision == expected


def test_auto_under_the_avx2_emulation_is_fp32_on_this_host():
    """The real caps, in a fresh interpreter: torch's own checks still report the hardware's bf16 there."""
    code = (
        "import torch; from hfzoo.training.precision import cpu_capability, resolve_mixed_precision as r; "
        "c = cpu_capability(); print(c.cpu_class, c.hardware_class, r('auto').mixed_precision, "
        "torch.backends.cpu.get_cpu_capability())"
    )
    env = {"ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2", "PATH": "", "HOME": str(REPO_ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    effective, hardware, chosen, aten = out.stdout.split()
    assert chosen == "no"
    if hardware != "other":  # an x86 host with AVX2 at least: capped to exactly AVX2
        assert (effective, aten) == ("AVX2", "AVX2")


def test_auto_on_cuda_is_bf16_where_the_gpu_has_it(cpu, monkeypatch):
    cpu("AVX2")  # the CPU does not matter on a GPU
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
    native = []
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: native.append(
        including_emulation) or True)  # fmt: skip
    choice = resolve_mixed_precision("auto", device_type="cuda")
    assert (choice.mixed_precision, choice.host) == ("bf16", "NVIDIA H100 80GB HBM3")
    assert native == [False]  # bf16 that the GPU only emulates does not count
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Tesla V100-SXM2-16GB")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    assert resolve_mixed_precision("auto", device_type="cuda").mixed_precision == "no"
    assert resolve_mixed_precision("fp16", device_type="cuda").mixed_precision == "fp16"
    # the run's device: CUDA when visible, unless the launcher asked for the CPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert run_device_type() == "cuda"
    assert choose_mixed_precision(SimpleNamespace(mixed_precision="auto")).device_type == "cuda"
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    assert run_device_type() == "cpu"


def test_explicit_bf16_without_native_support_runs_and_warns_once(cpu):
    cpu("AVX2")
    with pytest.warns(UserWarning, match=r"bf16 on a CPU without native bf16 \(AVX2\)"):
        assert resolve_mixed_precision("bf16").mixed_precision == "bf16"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_mixed_precision("bf16").mixed_precision == "bf16"  # said once already
        cpu("AMX")
        assert resolve_mixed_precision("bf16").reason == "--mixed_precision bf16 as given"  # native: no warning


def test_explicit_values_and_the_accelerate_config(cpu):
    cpu("AVX2")
    assert resolve_mixed_precision("no").mixed_precision == "no"
    assert resolve_mixed_precision(None).requested == "auto"
    # auto takes an accelerate config's explicit bf16 / fp16; its "no" means nothing was chosen
    assert resolve_mixed_precision("auto", device_type="cpu", launcher="no").mixed_precision == "no"
    cpu("AMX")
    assert resolve_mixed_precision("auto", device_type="cpu", launcher="no").mixed_precision == "bf16"
    chosen = resolve_mixed_precision("auto", device_type="cpu", launcher="bf16")
    assert (chosen.mixed_precision, chosen.reason) == ("bf16", "auto: the accelerate config's mixed_precision bf16")
    assert resolve_mixed_precision("no", launcher="bf16").mixed_precision == "no"  # the flag wins
    with pytest.raises(ValueError, match="--mixed_precision must be one of auto, no, bf16, fp16, got 'fp8'"):
        resolve_mixed_precision("fp8")
    with pytest.raises(ValueError, match="device_type"):
        resolve_mixed_precision("auto", device_type="xpu")


def test_auto_is_the_default_of_every_command_line_and_recipe_file():
    assert build_pretrain_parser().get_default("mixed_precision") == "auto"
    glue = parse_glue_args(["--model_name_or_path", "m", "--task_name", "sst2", "--output_dir", "x"])
    assert glue.mixed_precision == "auto"
    files = sorted((REPO_ROOT / "recipes").glob("*/*.yaml"))
    assert len(files) >= 7
    for path in files:
        assert yaml.safe_load(path.read_text())["mixed_precision"] == "auto", path
    assert "--mixed_precision auto" in (REPO_ROOT / "recipes" / "glue_minilm_sweeps.sh").read_text()


def test_the_model_card_states_the_precision_and_why():
    config = build_config("decoder-tiny", "vocab_size=128")
    results = {"train_steps": 4, "mixed_precision": "no", "mixed_precision_reason": "auto: fp32, this CPU has no "
               "native bf16 (AVX2)", "host_capability": "cpu: AVX2"}  # fmt: skip
    card = str(build_model_card(config, results, num_parameters=1))
    assert "- precision: fp32 (auto: fp32, this CPU has no native bf16 (AVX2))" in card
    assert "- trained on: cpu: AVX2" in card
