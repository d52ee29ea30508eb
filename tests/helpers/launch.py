"""Tiny pretraining runs started with `accelerate launch` (2 processes on CPU, gloo) and checks of their logs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from helpers.paths import REPO_ROOT
from helpers.pretraining import TINY_OVERRIDES

STEPS = 16


#: The single-process reference uses one process x 8 sequences; the 2-process runs 2 x 4 (same global batch).
GLOBAL_BATCH = 8


def recipe_args(train_file, tokenizer_dir, output_dir, per_device, *extra):
    """fp32 on every CPU (not the default `auto`, bf16 where the CPU computes it natively): the runs' losses and
    saved weights are compared exactly with a single process's, and DeepSpeed names its files by precision."""
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
        "--mixed_precision", "no",
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


# ---------------------------------------------------------------------------------------------------------
# Several nodes simulated on this machine: one launcher per "node", one process each, over 127.0.0.1
# ---------------------------------------------------------------------------------------------------------

CHAOS_SCRIPT = REPO_ROOT / "scripts" / "chaos_pretrain.py"


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for `--main_process_port` / `--master_port`)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node_command(config: str, node_rank: int, port: int, argv: list[str], script: list[str] | None = None) -> list[str]:
    """`accelerate launch` of node `node_rank` of 2 (one process per node, main node at 127.0.0.1:`port`).

    `script` replaces `recipes/pretrain.py` (e.g. the chaos child with a fault injected).
    """
    multinode = ["--deepspeed_multinode_launcher", "standard"] if config.startswith("deepspeed") else []
    return [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(REPO_ROOT / "accelerate_configs" / config),
        "--num_machines", "2", "--machine_rank", str(node_rank), "--num_processes", "2",
        "--main_process_ip", "127.0.0.1", "--main_process_port", str(port), *multinode,
        *(script or [str(REPO_ROOT / "recipes" / "pretrain.py")]), *argv,
    ]  # fmt: skip


def torchrun_node_command(node_rank: int, port: int, argv: list[str]) -> list[str]:
    """`torchrun` of node `node_rank` of 2 (one process per node), the recipe run without an accelerate config."""
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "2", "--node_rank", str(node_rank), "--nproc_per_node", "1",
        "--master_addr", "127.0.0.1", "--master_port", str(port),
        str(REPO_ROOT / "recipes" / "pretrain.py"), *argv,
    ]  # fmt: skip


def start_nodes(commands: list[list[str]], cwd: Path, logs: Path) -> list[subprocess.Popen]:
    """Start one launcher per node, each in a session of its own (a "machine"), stderr to `logs/node<R>.log`."""
    logs.mkdir(parents=True, exist_ok=True)
    return [
        subprocess.Popen(
            command,
            cwd=cwd,
            env=launch_env(),
            stdout=subprocess.DEVNULL,
            stderr=(logs / f"node{rank}.log").open("w"),
            start_new_session=True,
        )
        for rank, command in enumerate(commands)
    ]


def run_nodes(commands: list[list[str]], cwd: Path, logs: Path, timeout: float = 600) -> list[str]:
    """Run one launcher per node to the end; every one must succeed. Returns their stderr logs."""
    procs = start_nodes(commands, cwd, logs)
    try:
        for rank, proc in enumerate(procs):
            proc.wait(timeout=timeout)
            text = (logs / f"node{rank}.log").read_text()
            assert proc.returncode == 0, f"node {rank} failed:\n{text[-4000:]}"
    finally:
        for proc in procs:
            kill_node(proc)
    return [(logs / f"node{rank}.log").read_text() for rank in range(len(procs))]


def wait_for_file(path: Path, proc: subprocess.Popen, timeout: float = 300, log: Path | None = None) -> None:
    """Wait until `path` exists (a checkpoint a run writes); fail if `proc` ends first or after `timeout` seconds.

    The failure shows the end of `log` (the run's stderr file) when given.
    """
    deadline = time.monotonic() + timeout
    while not path.is_file():
        ended, late = proc.poll() is not None, time.monotonic() > deadline
        if ended or late:
            tail = log.read_text()[-3000:] if log is not None and log.is_file() else ""
            assert not ended, f"the run ended (status {proc.returncode}) before {path} appeared\n{tail}"
            raise AssertionError(f"{path} did not appear within {timeout} s\n{tail}")
        time.sleep(0.05)


def kill_node(proc: subprocess.Popen) -> None:
    """SIGKILL a node: its launcher's process group and every descendant (torchrun puts its workers in
    sessions of their own), as when the machine fails. Nothing happens if it already ended."""
    import signal

    import psutil

    try:
        launcher = psutil.Process(proc.pid)
        family = [*launcher.children(recursive=True), launcher]
    except psutil.NoSuchProcess:
        family = []
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    for process in family:
        try:
            process.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    proc.wait(timeout=60)
