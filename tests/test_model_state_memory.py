"""`benchmarks/model_state_memory.py` with FSDP2 (`fully_shard`) at 1 and 2 gloo processes: the measured bytes of
model state per process are the standard accounting's 16 / N bytes per parameter (fp32 AdamW, full sharding), and
the fit from those two runs (what the scaling table of docs/distributed.md uses) gives it back."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
from helpers.launch import launch_env
from helpers.paths import REPO_ROOT

BENCHMARK = REPO_ROOT / "benchmarks" / "model_state_memory.py"


def load_benchmark():
    spec = importlib.util.spec_from_file_location("model_state_memory", BENCHMARK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp2_model_state_is_sixteen_bytes_per_parameter_over_the_processes(tmp_path):
    benchmark = load_benchmark()
    results = []
    for processes in (1, 2):
        out = tmp_path / f"fsdp2_{processes}.json"
        command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                   str(REPO_ROOT / "accelerate_configs" / "ddp.yaml"), "--num_processes", str(processes),
                   str(BENCHMARK), "--fsdp2", "--hidden_size", "64", "--layers", "2", "--vocab_size", "512",
                   "--output", str(out)]  # fmt: skip
        proc = subprocess.run(command, env=launch_env(), capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-4000:]
        result = json.loads(out.read_text())
        assert result["mode"] == "fsdp2" and result["num_processes"] == processes
        replicated, sharded = benchmark.FORMULA_BYTES_PER_PARAMETER["fsdp2"]
        for per_param in result["bytes_per_parameter"]:  # every process holds its shard (+ buffers: position ids)
            assert per_param == pytest.approx(replicated + sharded / processes, rel=0.02), per_param
        results.append(result)
    ((replicated, sharded),) = benchmark.fit_bytes_per_parameter(results).values()
    assert abs(replicated) < 0.3 and sharded == pytest.approx(16, rel=0.03)
