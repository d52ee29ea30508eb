"""Tiny pretraining runs started with `accelerate launch` (2 processes on CPU, gloo) and checks of their logs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from helpers.paths import REPO_ROOT
from helpers.pretraining import TINY_OVERRIDES

STEPS = 16


#: The single-process reference uses one process x 8 sequences; the 2-process runs 2 x 4 (same global batch).
GLOBAL_BATCH = 8


def recipe_args(train_file, tokenizer_dir, output_dir, per_device, *extra):
    return [
        "--train_file", str(train_file),
        "--tokenizer_name", str(tokenizer_dir),
        "--config_name", "decoder-tiny",
        "--config_overrides", TINY_OVERRIDES,
        "--block_size", "32",
        "--per_device_train_batch_size", str(per_device),
        "--per_device_eval_batch_size", "4",
        "--max_train_steps", str(STEPS),
        "--max_eval_samples", "8",
        "--validation_split_percentage", "25",
        "--learning_rate", "3e-3",
        "--num_warmup_steps", "2",
        "--weight_decay", "0.01",
        "--logging_steps", "1",
        "--output_dir", str(output_dir),
        *extra,
    ]  # fmt: skip


def launch_command(config: str, argv: list[str], num_processes: int | None = None) -> list[str]:
    """`accelerate launch` of the pretraining recipe; `num_processes` overrides the config's."""
    processes = ["--num_processes", str(num_processes)] if num_processes is not None else []
    return [
        sys.executable, "-m", "accelerate.commands.launch", *processes,
        "--config_file", str(REPO_ROOT / "accelerate_configs" / config),
        str(REPO_ROOT / "recipes" / "pretrain.py"), *argv,
    ]  # fmt: skip


def launch_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}  # 2 processes share the 2 cores


def launch(config: str, argv: list[str], cwd: Path, num_processes: int | None = None) -> str:
    proc = subprocess.run(
        launch_command(config, argv, num_processes),
        cwd=cwd,
        env=launch_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stderr


def check_two_processes(log: str, distributed_type: str) -> None:
    """World size 2 logged, and each process trained on different blocks."""
    assert f"world size 2 (distributed_type {distributed_type}" in log
    rows = dict(re.findall(r"process (\d)/2: first micro-batch row token-id sums (\[[^\]]*\])", log))
    assert set(rows) == {"0", "1"}, log[-3000:]
    assert json.loads(rows["0"]) != json.loads(rows["1"])
    assert len(json.loads(rows["0"])) == GLOBAL_BATCH // 2
