"""Faults during training: non-finite losses, SIGTERM in multi-process runs (DDP, DeepSpeed), a failing or stuck
process, and the fault-injection run (`scripts/chaos_pretrain.py`): interrupted five times, bit-exact at the end."""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers.launch import GLOBAL_BATCH, launch_command, launch_env, recipe_args, wait_for_file
from helpers.pretraining import TINY_OVERRIDES, base_args
from safetensors.torch import load_file

from hfzoo.pretraining import loop as pretraining
from hfzoo.pretraining.loop import main
from hfzoo.training import faults
from hfzoo.training.checkpointing import find_latest_checkpoint, save_checkpoint, verify_checkpoint

REPO_ROOT = Path(__file__).resolve().parents[2]


def _load_chaos_script():
    spec = importlib.util.spec_from_file_location("chaos_pretrain", REPO_ROOT / "scripts" / "chaos_pretrain.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


chaos = _load_chaos_script()


@pytest.fixture
def nan_loss_at(monkeypatch):
    """`nan_loss_at({3, 5})`: the training forward passes 3 and 5 of the next run return a NaN loss."""

    def install(calls: set[int]):
        real_build, count = pretraining._build_model, [0]

        def poison(module, args, kwargs, output):
            if module.training:
                count[0] += 1
                if count[0] in calls:
                    output["loss"] = output["loss"] * float("nan")
            return output

        def build(*args):
            model, base_model = real_build(*args)
            model.register_forward_hook(poison, with_kwargs=True)
            return model, base_model

        monkeypatch.setattr(pretraining, "_build_model", build)

    return install


def _step_count(checkpoint: Path) -> int:
    state = torch.load(checkpoint / "optimizer.bin", map_location="cpu", weights_only=True)["state"]
    return int(next(iter(state.values()))["step"])


NONFINITE_ARGS = ["--max_train_steps", "6", "--checkpointing_steps", "2", "--checkpoints_total_limit", "5",
                  "--logging_steps", "1"]  # fmt: skip


# --logging_steps 1 reads every step's gradient norm before the next; with 4 (and checkpoints every 2 steps) the
# norms of steps 3 and 5 are read one step late (fused AdamW: the device leaves the update out, the host learns of
# it during the next step).
@pytest.mark.parametrize("logging_steps", ["1", "4"])
def test_a_nan_loss_stops_the_run_at_its_step_and_keeps_the_last_checkpoint(
    logging_steps, tmp_path, small_jsonl_xz, tokenizer_dir, nan_loss_at, capsys
):
    nan_loss_at({3})
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exc:
        main(base_args(small_jsonl_xz, tokenizer_dir, out, *NONFINITE_ARGS, "--logging_steps", logging_steps))
    assert exc.value.code == faults.EXIT_NONFINITE
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("error: non-finite gradient norm (nan; loss nan) at step 3: its update was not applied")
    assert "skip such steps with --max_nonfinite_steps N" in last
    assert last.endswith(f"the last checkpoint, {out / 'checkpoints' / 'step_2'}, is intact")
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_2"]
    assert not (out / "model.safetensors").exists()
    weights = load_file(out / "checkpoints" / "step_2" / "model.safetensors")
    assert all(torch.isfinite(w).all() for w in weights.values())


@pytest.mark.parametrize("logging_steps", ["1", "4"])
def test_max_nonfinite_steps_skips_such_steps_logs_each_and_counts_them_across_resumes(
    logging_steps, tmp_path, small_jsonl_xz, tokenizer_dir, nan_loss_at, caplog, capsys
):
    nan_loss_at({3, 5})
    out = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="hfzoo.training.faults"), pytest.raises(SystemExit) as exc:
        main(base_args(small_jsonl_xz, tokenizer_dir, out, *NONFINITE_ARGS, "--max_nonfinite_steps", "1",
                       "--logging_steps", logging_steps))  # fmt: skip
    assert exc.value.code == faults.EXIT_NONFINITE
    warnings = [r.getMessage() for r in caplog.records]
    assert any(
        w.startswith("step 3: non-finite gradient norm (nan; loss nan); update skipped (1 of at most 1")
        for w in warnings
    )
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "at step 5: its update was not applied and training stopped (1 such step(s) already skipped ([3]))" in last
    step_4 = out / "checkpoints" / "step_4"
    assert json.loads((step_4 / "training_state.json").read_text())["nonfinite_steps"] == [3]
    assert _step_count(step_4) == 3  # 4 steps of data, 3 updates: the skipped one was not applied

    # Resumed without faults: it completes, and the checkpoints keep the record of the skipped step.
    monkey_free = main(base_args(small_jsonl_xz, tokenizer_dir, out, *NONFINITE_ARGS, "--max_nonfinite_steps", "1",
                                 "--resume_from_checkpoint", "latest"))  # fmt: skip
    assert monkey_free["train_steps"] == 6 and math.isfinite(monkey_free["eval_loss"])
    step_6 = out / "checkpoints" / "step_6"
    assert json.loads((step_6 / "training_state.json").read_text())["nonfinite_steps"] == [3]
    assert _step_count(step_6) == 5


def _stepping_run(deferred: bool, norms: list[float]):
    """Fused AdamW + a decaying schedule stepped through `norms` (the gradient norm of each step; the gradients are
    scaled to it, NaN/inf included) by an `OptimizerStepper`; returns its checked steps, the learning rates the
    updates used, the weights, the moments and the step counts."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(5))]
    optimizer = torch.optim.AdamW(params, lr=0.1, weight_decay=0.1, fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)
    stepper = faults.OptimizerStepper(optimizer, scheduler, deferred=deferred, last_step=10)
    checked, rates = [], []
    for norm in norms:
        direction = [torch.randn_like(p) for p in params]
        length = torch.cat([d.flatten() for d in direction]).norm()
        for p, d in zip(params, direction):
            p.grad = d * (norm / length)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, float("inf"))
        rates.append(optimizer.param_groups[0]["lr"])  # before the step; a deferred stepper changes it in `step`
        stepper.step(grad_norm)
        checked += stepper.checked()
    checked += stepper.settle()
    state = [(s["exp_avg"], s["exp_avg_sq"], s["step"]) for s in optimizer.state.values()]
    return checked, scheduler.get_last_lr(), [p.detach() for p in params], state, rates


def test_a_deferred_stepper_applies_exactly_the_updates_and_schedule_of_an_immediate_one():
    norms = [1.0, float("nan"), 2.0, float("inf"), float("inf"), 0.5, float("nan")]
    immediate, deferred = _stepping_run(False, norms), _stepping_run(True, norms)
    assert [(c.step, c.applied) for c in immediate[0]] == [(11 + i, math.isfinite(n)) for i, n in enumerate(norms)]
    described = lambda run: [(c.step, str(c.grad_norm), c.applied) for c in run[0]]  # noqa: E731 (NaN != NaN)
    assert described(deferred) == described(immediate)
    assert deferred[1] == immediate[1] == [0.1 * 0.5**3]  # the scheduler stepped for the 3 finite steps alone
    for a, b in zip(deferred[2], immediate[2]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for a, b in zip(deferred[3], immediate[3]):
        for x, y in zip(a, b):
            torch.testing.assert_close(x, y, rtol=0, atol=0)
    assert [float(s[2]) for s in deferred[3]] == [3.0, 3.0]  # the fused kernel undid the left-out steps' counts
    # The first update of a deferred stepper ran at the learning rate of an immediate one's, and so on.
    applied_rates = lambda run: [r for r, c in zip(run[4], run[0]) if c.applied]  # noqa: E731
    assert applied_rates(deferred) == applied_rates(immediate)


def _inside(event, prefix: str) -> bool:
    """Whether a profiler event ran inside a region whose name starts with `prefix`."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith(prefix):
            return True
        parent = parent.cpu_parent
    return False


def test_a_deferred_stepper_reads_no_value_back_when_it_steps():
    params = [torch.nn.Parameter(torch.randn(8))]
    counts = {}
    for deferred in (False, True):
        optimizer = torch.optim.AdamW(params, lr=0.1, fused=True)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        stepper = faults.OptimizerStepper(optimizer, scheduler, deferred=deferred)
        params[0].grad = torch.ones(8)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            stepper.step(grad_norm)
        counts[deferred] = sum(
            e.name == "aten::_local_scalar_dense" and not _inside(e, "Optimizer.step#") for e in prof.events()
        )  # values read back by the stepper (on the CPU, the fused kernel itself reads its step counts)
        assert stepper.checked() == ([] if deferred else [faults.CheckedStep(1, pytest.approx(8**0.5), True)])
        assert stepper.settle() == ([faults.CheckedStep(1, pytest.approx(8**0.5), True)] if deferred else [])
    assert counts == {False: 1, True: 0}


def test_a_deferred_stepper_needs_an_optimizer_that_skips_on_the_device():
    params = [torch.nn.Parameter(torch.randn(3))]
    foreach = torch.optim.AdamW(params, lr=0.1, foreach=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(foreach, lambda step: 1.0)
    assert not faults.skips_updates_on_device(foreach)
    assert faults.skips_updates_on_device(torch.optim.AdamW(params, lr=0.1, fused=True))
    with pytest.raises(ValueError, match="needs an optimizer that skips updates on the device.*got AdamW"):
        faults.OptimizerStepper(foreach, scheduler, deferred=True)
    fused = torch.optim.AdamW(params, lr=0.1, fused=True)
    with pytest.raises(ValueError, match="with a loss scaler"):
        faults.OptimizerStepper(fused, scheduler, deferred=True, scaler=True)


def test_a_checkpoint_with_non_finite_weights_is_never_written(tmp_path):
    from accelerate import Accelerator
    from transformers import AutoModelForCausalLM

    from hfzoo.models.presets import build_config

    accelerator = Accelerator(cpu=True)
    model = AutoModelForCausalLM.from_config(build_config("decoder-tiny", TINY_OVERRIDES + ",vocab_size=64"))
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[0, 0] = float("inf")
    run = SimpleNamespace(accelerator=accelerator, model=model, args=SimpleNamespace(output_dir=str(tmp_path)))
    with pytest.raises(faults.NonFiniteError, match=r"step 7: parameter model\.layers\.1\.mlp\.down_proj\.weight"):
        save_checkpoint(run, 7, 0)
    assert not (tmp_path / "checkpoints").exists()


# A job's main as `recipes/*.py` run it: it prints, logs, leaves a thread busy in torch's C++ code (as gloo's workers
# can be, releasing the tensors of the last collective) and ends with the exit status in argv[1] ("0", "75" or a
# message), or raises ("raise"). A thread that takes the GIL while the interpreter finalizes aborts the process.
_LAUNCHED_MAIN = """
import atexit, logging, sys, threading, time
import torch
from hfzoo.training import faults

def main():
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("job").info("logged by the job")
    sys.stdout.write("printed by the job")  # a pipe is block-buffered: written by a flush only
    atexit.register(print, "interpreter teardown")
    if "--busy_thread" in sys.argv:
        a = torch.randn(1200, 1200)
        threading.Thread(target=lambda: [a @ a for _ in iter(int, 1)], daemon=True).start()
        time.sleep(0.2)
    if sys.argv[1] == "raise":
        raise RuntimeError("a bug in the job")
    if sys.argv[1] != "0":
        raise SystemExit(int(sys.argv[1]) if sys.argv[1].isdigit() else sys.argv[1])

faults.run_launched(main)
"""


def test_a_check_decided_on_the_main_process_gives_every_process_its_answer(monkeypatch):
    """The main process runs the check and broadcasts `(result, message, refused)`; another process never runs it
    and returns the result, raises the refusal of the given type, or, when the main process failed with another
    error, a `RuntimeError` naming it."""
    calls, sent = [], []

    def check():
        calls.append("checked")
        return "user/repo"

    def refuse():
        raise faults.CheckpointError("--output_dir out holds the checkpoints of an earlier run")

    main_process, other_process = SimpleNamespace(is_main_process=True), SimpleNamespace(is_main_process=False)
    monkeypatch.setattr(faults, "broadcast_from_main", lambda accelerator, obj: sent.append(obj) or obj)
    assert faults.decide_on_main(main_process, check) == "user/repo" and sent == [("user/repo", None, False)]
    with pytest.raises(faults.CheckpointError, match="earlier run") as refused:
        faults.decide_on_main(main_process, refuse, faults.CheckpointError)
    assert sent[-1] == (None, str(refused.value), True)
    with pytest.raises(KeyError):  # not a refusal: a bug, raised as it is on the main process ...
        faults.decide_on_main(main_process, lambda: {}["missing"], faults.CheckpointError)
    assert sent[-1] == (None, "KeyError: 'missing'", False)  # ... and named to the others
    with pytest.raises(KeyError):
        faults.decide_on_main(None, lambda: {}["missing"], faults.CheckpointError)

    calls.clear()
    monkeypatch.setattr(faults, "broadcast_from_main", lambda accelerator, obj: ("user/repo", None, False))
    assert faults.decide_on_main(other_process, check) == "user/repo"
    monkeypatch.setattr(faults, "broadcast_from_main", lambda accelerator, obj: (None, "earlier run", True))
    with pytest.raises(faults.CheckpointError, match="^earlier run$"):
        faults.decide_on_main(other_process, check, faults.CheckpointError)
    monkeypatch.setattr(faults, "broadcast_from_main", lambda accelerator, obj: (None, "KeyError: 'missing'", False))
    with pytest.raises(RuntimeError, match=r"main process failed this check before the run \(KeyError: 'missing'\)"):
        faults.decide_on_main(other_process, check, faults.CheckpointError)
    assert calls == []  # only the main process looks


@pytest.mark.parametrize(("status", "code"), [("0", 0), ("75", 75), ("error: bad input", 1), ("raise", 1)])
def test_a_launched_process_of_several_ends_with_its_status_and_its_output_without_the_interpreter_teardown(
    status, code
):
    """One process of a multi-process run (`WORLD_SIZE` 2) whose job leaves a thread in torch's C++ code: the
    process ends with the job's exit status (1 after an exception's traceback, as Python ends), everything it
    printed and logged written, and no abort (plain interpreter exit: `terminate called without an active
    exception`, SIGABRT)."""
    proc = subprocess.run(
        [sys.executable, "-c", _LAUNCHED_MAIN, status, "--busy_thread"],
        env={**launch_env(), "WORLD_SIZE": "2"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == code, proc.stderr[-2000:]
    assert proc.stdout == "printed by the job"  # flushed; the interpreter's teardown (atexit) never ran
    assert "logged by the job" in proc.stderr and "terminate called" not in proc.stderr
    assert proc.stderr.rstrip().endswith({"error: bad input": "error: bad input", "raise": _RAISED}.get(status, "job"))


#: The end of the traceback of `_LAUNCHED_MAIN raise`, as Python prints it (a `-c` script has no source lines).
_RAISED = "in main\nRuntimeError: a bug in the job"


@pytest.mark.parametrize(("status", "code"), [("0", 0), ("error: bad input", 1), ("raise", 1)])
def test_a_single_process_ends_as_python_ends_it(status, code):
    """Without a launcher (no `WORLD_SIZE`), the job's exit status and Python's own teardown (atexit) are kept."""
    env = {k: v for k, v in launch_env().items() if k != "WORLD_SIZE"}
    proc = subprocess.run([sys.executable, "-c", _LAUNCHED_MAIN, status], env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == code, proc.stderr[-2000:]
    assert proc.stdout == "printed by the job" + "interpreter teardown\n"
    assert proc.stderr.rstrip().endswith({"error: bad input": "error: bad input", "raise": _RAISED}.get(status, "job"))


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("config", ["ddp.yaml", "deepspeed_zero2.yaml"])
def test_sigterm_to_accelerate_launch_checkpoints_every_process(config, tmp_path, small_jsonl_xz, tokenizer_dir):
    """SIGTERM to the launcher (torchrun forwards it to both processes): every process finishes the same step,
    writes its part of one checkpoint and exits. (Resuming a checkpoint of several processes: test_distributed.)"""
    argv = recipe_args(small_jsonl_xz, tokenizer_dir, "run", GLOBAL_BATCH // 2, "--checkpointing_steps", "8",
                       "--max_train_steps", "400")  # fmt: skip
    proc = subprocess.Popen(launch_command(config, argv), cwd=tmp_path, env=launch_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    out = tmp_path / "run"
    wait_for_file(out / "checkpoints" / "step_8" / "manifest.json", proc)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    stopped = re.findall(r"^stopped by SIGTERM after step (\d+); checkpoint (\S+) written; .*$", stderr, re.MULTILINE)
    assert len(stopped) == 1, stderr[-3000:]  # one line, from the main process
    step = int(stopped[0][0])
    assert 8 <= step < 400 and stderr.count("SIGTERM received: finishing the current step") == 2
    checkpoint = out / "checkpoints" / f"step_{step}"
    assert Path(tmp_path / stopped[0][1]) == checkpoint and find_latest_checkpoint(out) == checkpoint
    verify_checkpoint(checkpoint)
    state = json.loads((checkpoint / "training_state.json").read_text())
    assert state["step"] == step and state["num_processes"] == 2
    names = {p.name for p in checkpoint.rglob("*")}
    assert {"random_states_0.pkl", "random_states_1.pkl"} <= names  # every process saved its part
    if config.startswith("deepspeed"):  # each process's ZeRO partition of the optimizer state
        assert {"zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"} <= names


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_processes(command: list[str]) -> list[subprocess.Popen]:
    """`command` as processes 0 and 1 of a 2-process run, started without a launcher (stderr piped)."""
    env = {**launch_env(), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port())}  # fmt: skip
    return [
        subprocess.Popen(
            command,
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for r in (0, 1)
    ]


@pytest.mark.slow
@pytest.mark.distributed
def test_a_nonfinite_step_on_one_process_stops_both_with_one_line(tmp_path, small_jsonl_xz, tokenizer_dir):
    """Process 1's loss is NaN at step 3: the gradient norm is reduced over the processes, so both stop at step 3
    with exit status 76, and the main process alone prints the line naming the step and the checkpoint."""
    out = tmp_path / "run"
    argv = recipe_args(small_jsonl_xz, tokenizer_dir, out, GLOBAL_BATCH // 2, "--checkpointing_steps", "2")
    procs = _two_processes(chaos.child_command("nan", 3, argv, rank=1))
    try:
        errors = [proc.communicate(timeout=240)[1] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert [proc.returncode for proc in procs] == [faults.EXIT_NONFINITE] * 2, errors[0][-2000:]
    lines = [[line for line in err.splitlines() if line.startswith("error: non-finite")] for err in errors]
    assert len(lines[0]) == 1 and lines[1] == [], errors
    assert lines[0][0].startswith("error: non-finite gradient norm (nan; loss ")
    assert " at step 3: " in lines[0][0] and lines[0][0].endswith(
        f"the last checkpoint, {out}/checkpoints/step_2, is intact"
    )


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("fault", ["raise", "hang"])
def test_a_failing_or_stuck_process_ends_the_others_with_a_message(fault, tmp_path, small_jsonl_xz, tokenizer_dir):
    """Two processes started without a launcher that would kill the survivors: process 1 raises (or stops
    responding) at step 3; process 0 ends on its own with a one-line message (`--ddp_timeout 10` for the hang)."""
    argv = recipe_args(small_jsonl_xz, tokenizer_dir, tmp_path / "run", GLOBAL_BATCH // 2, "--ddp_timeout", "10")
    procs = _two_processes(chaos.child_command(fault, 3, argv, rank=1))
    try:
        _, err0 = procs[0].communicate(timeout=240)
        if fault == "raise":
            _, err1 = procs[1].communicate(timeout=60)
            assert procs[1].returncode == 1 and "RuntimeError: injected failure at step 3 on process 1" in err1
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert procs[0].returncode == 1
    last = err0.strip().splitlines()[-1]
    assert last.startswith("error: process 0: a collective operation failed or timed out (another process failed")
    if fault == "hang":
        assert "Timed out waiting 10001ms" in last


@pytest.mark.slow
def test_five_interruptions_of_mixed_kinds_end_bit_exact_with_the_uninterrupted_run(
    tmp_path, small_jsonl_xz, tokenizer_dir
):
    """SIGKILL, SIGTERM, a kill in the middle of a save and a corrupted newest checkpoint, each resumed with
    `latest`: weights, optimizer, scheduler and RNG states and the data position end identical (CPU, bit for bit)."""
    recipe = base_args(small_jsonl_xz, tokenizer_dir, "unused", "--max_train_steps", "48", "--checkpointing_steps",
                       "4", "--checkpoints_total_limit", "3", "--learning_rate", "3e-3", "--weight_decay", "0.01")[:-2]  # fmt: skip
    reference = tmp_path / "reference"
    proc = subprocess.run(chaos.child_command("none", 0, [*recipe, "--output_dir", str(reference)]),
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    kinds = chaos.interruption_plan(5, seed=0)
    assert set(kinds) == set(chaos.INTERRUPTIONS)
    segments = chaos.run_interrupted(
        recipe, tmp_path / "chaos", kinds, max_train_steps=48, checkpointing_steps=4, max_delay=0.0
    )
    assert [s.kind for s in segments] == [*kinds, "none"]  # every interruption happened before the run ended
    assert segments[-1].returncode == 0
    # each process after the first resumed from a checkpoint (a run that started over would end the same)
    assert segments[0].resumed_from is None and all(s.resumed_from for s in segments[1:]), segments
    for segment, following in zip(segments, segments[1:]):
        if segment.kind == "sigterm":
            assert segment.returncode == faults.EXIT_PREEMPTED
            assert re.fullmatch(r"stopped by SIGTERM after step \d+; checkpoint \S+ written; .*", segment.message)
        else:
            assert segment.returncode == -signal.SIGKILL
        if segment.corrupted:  # the next process skipped the damaged checkpoint, with a warning naming it
            assert any(segment.corrupted.startswith(f"{path}/") for path, _ in following.skipped), following
    assert any(s.corrupted for s in segments), "no checkpoint was corrupted"
    assert any("incomplete (its save did not finish)" in reason for s in segments for _, reason in s.skipped)
    assert chaos.compare_runs(reference, tmp_path / "chaos") == dict.fromkeys(
        ("weights", "checkpoint_weights", "optimizer", "scheduler", "rng", "data_position"), True
    )
