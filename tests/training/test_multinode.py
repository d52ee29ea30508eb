"""Two "nodes" simulated on this machine: one `accelerate launch` (or `torchrun`) per node with `--num_machines 2`,
one process each, meeting at 127.0.0.1 over gloo. A node is SIGKILLed after a checkpoint (the whole machine:
launcher and workers); the survivor ends within the collective timeout with one line naming the lost process,
its node and the checkpoint to resume from; both nodes relaunched with `--resume_from_checkpoint latest`
reproduce the losses of an uninterrupted two-node run.
"""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest
from helpers.launch import (
    CHAOS_SCRIPT,
    GLOBAL_BATCH,
    STEPS,
    check_two_processes,
    free_port,
    kill_node,
    node_command,
    recipe_args,
    run_nodes,
    start_nodes,
    torchrun_node_command,
    wait_for_file,
)
from helpers.pretraining import restored_steps, tag_saved_history

from hfzoo.training.checkpointing import find_latest_checkpoint

#: `--ddp_timeout` of the runs: the survivor must end well within it (gloo reports a closed connection at once).
COLLECTIVE_TIMEOUT = 60
#: Harness limit on the survivor's exit after the kill: a hang fails the test instead of blocking CI.
SURVIVOR_LIMIT = 120


def losses(output_dir):
    history = json.loads((output_dir / "train_history.json").read_text())["log_history"]
    return {r["step"]: r["train_loss"] for r in history}


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize(
    ("config", "distributed_type"), [("ddp.yaml", "MULTI_CPU"), ("deepspeed_zero2.yaml", "DEEPSPEED")]
)
def test_two_nodes_lose_one_node_then_resume_from_the_last_checkpoint(
    config, distributed_type, tmp_path, small_jsonl_xz, tokenizer_dir
):
    def argv(output_dir, *extra):
        return recipe_args(small_jsonl_xz, tokenizer_dir, output_dir, GLOBAL_BATCH // 2, "--checkpointing_steps", "4",
                           "--ddp_timeout", str(COLLECTIVE_TIMEOUT), *extra)  # fmt: skip

    # The uninterrupted reference: two nodes, one process each (shared output folder, as on a shared filesystem).
    port = free_port()
    logs = run_nodes([node_command(config, r, port, argv("reference")) for r in (0, 1)], tmp_path, tmp_path / "logs0")
    check_two_processes("".join(logs), distributed_type)
    assert "[RANK 1]" in logs[1] and "[RANK 1]" not in logs[0]  # each node ran its own process
    reference = tmp_path / "reference"

    # Node 1 stalls at step 6 (so that the run cannot end first), and is killed once step 4's checkpoint exists.
    port = free_port()
    stall = [str(CHAOS_SCRIPT), "child", "--fault", "hang", "--step", "6", "--rank", "1", "--"]
    commands = [node_command(config, 0, port, argv("run")), node_command(config, 1, port, argv("run"), script=stall)]
    nodes = start_nodes(commands, tmp_path, tmp_path / "logs1")
    out = tmp_path / "run"
    try:
        wait_for_file(
            out / "checkpoints" / "step_4" / "training_state.json", nodes[0], 600, tmp_path / "logs1" / "node0.log"
        )
        kill_node(nodes[1])
        killed = time.monotonic()
        try:
            nodes[0].wait(timeout=SURVIVOR_LIMIT)
        except subprocess.TimeoutExpired:
            pytest.fail(f"node 0 still running {SURVIVOR_LIMIT} s after node 1 was killed")
        elapsed = time.monotonic() - killed
        print(f"{config}: node 0 ended {elapsed:.1f} s after node 1 was killed")  # shown with pytest -s
    finally:
        for node in nodes:
            kill_node(node)
    survivor = (tmp_path / "logs1" / "node0.log").read_text()
    assert nodes[0].returncode != 0
    assert elapsed < COLLECTIVE_TIMEOUT, elapsed
    errors = [line for line in survivor.splitlines() if line.startswith("error: process 0:")]
    assert len(errors) == 1, survivor[-3000:]
    assert "lost process 1 (node 1, host " in errors[0]
    assert "restart every node with --resume_from_checkpoint latest" in errors[0]
    assert f"last complete checkpoint: {out.name}/checkpoints/step_4" in errors[0]
    assert re.search(r"Connection (closed|reset) by peer", errors[0])  # gloo's own words follow
    assert "Traceback" not in survivor.split("error: process 0:")[0]  # the worker printed no traceback
    assert not (out / "all_results.json").exists()
    latest = find_latest_checkpoint(out)
    assert latest.name == "step_4"

    # Both nodes relaunched with `latest` (DDP: the torchrun form, no accelerate config) finish the run with the
    # uninterrupted run's losses (steps 1-4 from the checkpoint's records, the others trained again from step 5).
    tag_saved_history(latest)
    port = free_port()
    resume = argv("run", "--resume_from_checkpoint", "latest")
    if config == "ddp.yaml":
        commands = [torchrun_node_command(r, port, resume) for r in (0, 1)]
    else:
        commands = [node_command(config, r, port, resume) for r in (0, 1)]
    run_nodes(commands, tmp_path, tmp_path / "logs2")
    # Resumed from step_4, not started over (which, with the same seed, would give the same losses).
    assert restored_steps(out) == (list(range(1, STEPS + 1)), [1, 2, 3, 4])
    got, want = losses(out), losses(reference)
    assert sorted(got) == list(range(1, STEPS + 1))  # 1..4: the records step_4 saved; 5..: trained after the resume
    for step in got:
        assert got[step] == pytest.approx(want[step], abs=1e-6), f"step {step}"
    final = [json.loads((d / "all_results.json").read_text())["eval_loss"] for d in (out, reference)]
    assert final[0] == pytest.approx(final[1], abs=1e-6)


class _Process:
    """The two attributes of an `Accelerator` that the message reads."""

    def __init__(self, index: int, count: int) -> None:
        self.process_index, self.num_processes = index, count


GLOO_RESET = (
    "[../third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error [10.0.0.2]:16779: Connection reset by peer. "
    "This is typically caused by a remote worker hanging.\nsecond line"
)


def test_a_survivor_names_the_processes_that_do_not_answer_and_the_checkpoint(monkeypatch, tmp_path):
    """Of 3 processes, 0 and 2 survive (2 answered through the store), 1 is lost: named with its node and host."""
    from datetime import timedelta

    import torch.distributed as dist

    from hfzoo.training import faults

    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=10), wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    monkeypatch.setattr(faults, "PEER_ANSWER_SECONDS", 0.5)
    monkeypatch.setattr(faults, "_PEERS", [{"rank": r, "node": r, "host": f"h{r}"} for r in range(3)])
    store.set("hfzoo_alive/0/2", "1")  # process 2 answered
    checkpoint = tmp_path / "run" / "checkpoints" / "step_8"
    message = faults.lost_peer_message(_Process(0, 3), RuntimeError(GLOO_RESET), lambda: [checkpoint])
    assert message == (
        "error: process 0: a collective operation failed or timed out (another process failed or stopped "
        "responding; see its output): lost process 1 (node 1, host h1), which did not answer within 0.5 s; "
        f"restart every node with --resume_from_checkpoint latest (last complete checkpoint: {checkpoint}); "
        + GLOO_RESET.splitlines()[0]
    )
    assert store.check(["hfzoo_alive/0/0"])  # and it answered the others

    # Without the launcher's store (its node is the lost one): the peer address gloo reports, no checkpoint yet.
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    message = faults.lost_peer_message(_Process(0, 3), RuntimeError(GLOO_RESET), lambda: [])
    assert "lost the peer at 10.0.0.2:16779; no checkpoint was written; restart every node" in message


@pytest.mark.slow
@pytest.mark.distributed
def test_the_multi_node_template_trains_on_two_nodes(tmp_path, small_jsonl_xz, tokenizer_dir):
    """`accelerate_configs/multi_node_template.yaml` as shipped (ZeRO-2, bf16, torchrun per node), with only the
    per-run flags given on the command line: two nodes train on different data and the validation loss falls."""
    port = free_port()
    # the recipes' default precision (auto: the template's bf16), not the helpers' fp32
    argv = recipe_args(small_jsonl_xz, tokenizer_dir, "run", GLOBAL_BATCH // 2, "--max_train_steps", "8",
                       "--mixed_precision", "auto")  # fmt: skip
    commands = [node_command("multi_node_template.yaml", r, port, argv) for r in (0, 1)]
    logs = run_nodes(commands, tmp_path, tmp_path / "logs")
    check_two_processes("".join(logs), "DEEPSPEED")
    assert "world size 2 (distributed_type DEEPSPEED, mixed_precision bf16)" in logs[0]
    results = json.loads((tmp_path / "run" / "all_results.json").read_text())
    assert results["eval_loss"] < results["init_eval_loss"]
