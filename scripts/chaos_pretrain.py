#!/usr/bin/env python
r"""Fault injection for the pretraining recipe: interrupt a run many times, resume it, compare bit for bit.

    python scripts/chaos_pretrain.py --work_dir outputs/chaos --interruptions 6 --seed 0 -- \
        --train_file ../shared/data/gutenberg/pg_top100_en.00.jsonl.xz --tokenizer_name outputs/tokenizer \
        --config_name decoder-tiny --block_size 64 --per_device_train_batch_size 8 --max_eval_samples 16 \
        --max_train_steps 40 --checkpointing_steps 4

The arguments after `--` are `recipes/pretrain.py`'s (without `--output_dir` / `--resume_from_checkpoint`;
`--checkpointing_steps` is required). The script runs the recipe once without interruption
(`<work_dir>/reference`), then again in `<work_dir>/chaos`, where each process is interrupted at a random
step by one of:

- `sigkill`: SIGKILL at a random moment of the step (nothing is saved; work since the last checkpoint is lost);
- `sigterm`: SIGTERM at a random moment of the step (the run finishes the step, checkpoints, exits with 75);
- `kill_during_save`: SIGKILL in the middle of the next checkpoint save (half of the model file written);
- `corrupt_latest`: SIGKILL, then one byte of the newest complete checkpoint is flipped (or a file truncated).

Each time it resumes with `--resume_from_checkpoint latest`, until the run completes. It then checks that
the final weights, the final checkpoint's optimizer, scheduler and RNG states, and its data position
(step, tokens seen) are identical to the uninterrupted run's, prints one line per process and exits
with 0 when everything matched.

`python scripts/chaos_pretrain.py child --fault KIND --step N [--rank R] -- RECIPE_ARGS` runs the recipe
in this process with one fault injected at optimizer step N (also `raise`: an exception, `hang`: a 600 s
stall, `nan`: a NaN loss; on process R only when given); the tests use it for multi-process faults.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

INTERRUPTIONS = ("sigkill", "sigterm", "kill_during_save", "corrupt_latest")
CHILD_FAULTS = ("sigkill", "sigterm", "kill_during_save", "raise", "hang", "nan", "none")
#: Exit code of a run stopped by SIGTERM after writing its checkpoint (hfzoo.training.faults.EXIT_PREEMPTED).
EXIT_PREEMPTED = 75


# ----------------------------------------------------------------------------------------------------------
# Child side: the recipe with one fault injected
# ----------------------------------------------------------------------------------------------------------


def install_fault(kind: str, step: int, rank: int | None = None, delay: float = 0.0) -> None:
    """Patch the pretraining loop of this process so that `kind` happens at optimizer step `step`.

    Args:
        kind: one of `CHILD_FAULTS`.
        step: the (1-based, absolute: counting the steps of the run resumed from) optimizer step.
        rank: only on this process index (None: every process).
        delay: seconds after the start of the step at which a signal is sent (from another thread; 0: at once,
            from this thread, before the step's computation).
    """
    from hfzoo.pretraining import loop as pretraining
    from hfzoo.training import checkpointing

    position = {"start": 0, "calls": 0, "armed": False}
    real_load, real_step, real_manifest = (
        pretraining.load_checkpoint,
        pretraining.accumulation_step,
        checkpointing.write_manifest,
    )

    def load_checkpoint(accelerator, path, *args, **kwargs):  # the real one's optional resharding arguments too
        state = real_load(accelerator, path, *args, **kwargs)
        position["start"] = state["step"]
        return state

    def accumulation_step(accelerator, *args, **kwargs):
        position["calls"] += 1
        here = rank is None or accelerator.process_index == rank
        if position["start"] + position["calls"] == step and here:
            if kind in ("sigkill", "sigterm"):
                sig = signal.SIGKILL if kind == "sigkill" else signal.SIGTERM
                if delay > 0:
                    threading.Timer(delay, os.kill, (os.getpid(), sig)).start()
                else:
                    os.kill(os.getpid(), sig)
            elif kind == "kill_during_save":
                position["armed"] = True
            elif kind == "raise":
                raise RuntimeError(f"injected failure at step {step} on process {accelerator.process_index}")
            elif kind == "hang":
                time.sleep(600)
            elif kind == "nan":  # this step's loss (and so its gradients) become NaN
                handle = args[0].register_forward_hook(lambda module, inputs, output: _nan_loss(output))
                try:
                    return real_step(accelerator, *args, **kwargs)
                finally:
                    handle.remove()
        return real_step(accelerator, *args, **kwargs)

    def write_manifest(folder):
        if position["armed"]:
            # A torn write: the model file half written, the manifest never; then the process dies.
            model_file = folder / "model.safetensors"
            with open(model_file, "r+b") as f:
                f.truncate(model_file.stat().st_size // 2)
            os.kill(os.getpid(), signal.SIGKILL)
        return real_manifest(folder)

    pretraining.load_checkpoint = load_checkpoint
    pretraining.accumulation_step = accumulation_step
    checkpointing.write_manifest = write_manifest


def _nan_loss(output):
    output["loss"] = output["loss"] * float("nan")
    return output


def child_main(argv: list[str]) -> None:
    """`child --fault KIND --step N [--rank R] [--delay S] -- RECIPE_ARGS`: the recipe with a fault injected."""
    parser = argparse.ArgumentParser(prog="chaos_pretrain.py child")
    parser.add_argument("--fault", choices=CHILD_FAULTS, required=True)
    parser.add_argument("--step", type=int, default=1)
    parser.add_argument("--rank", type=int, default=None)
    parser.add_argument("--delay", type=float, default=0.0)
    split = argv.index("--") if "--" in argv else len(argv)
    options, recipe_args = parser.parse_args(argv[:split]), argv[split + 1 :]
    if options.fault != "none":
        install_fault(options.fault, options.step, options.rank, options.delay)
    from hfzoo.pretraining.loop import main
    from hfzoo.training.faults import run_launched

    run_launched(lambda: main(recipe_args))  # as `recipes/pretrain.py` ends


# ----------------------------------------------------------------------------------------------------------
# Driver side
# ----------------------------------------------------------------------------------------------------------


@dataclass
class Segment:
    """One process of the interrupted run."""

    kind: str
    step: int
    returncode: int
    resumed_from: int | None
    message: str = ""
    skipped: list[str] = field(default_factory=list)
    corrupted: str | None = None


def child_command(
    kind: str, step: int, recipe_args: list[str], delay: float = 0.0, rank: int | None = None
) -> list[str]:
    """The command line that runs the recipe in a child process with one fault injected (on process `rank` only)."""
    fault = ["--fault", kind, "--step", str(step), "--delay", f"{delay:.4f}"]
    fault += ["--rank", str(rank)] if rank is not None else []
    return [sys.executable, str(Path(__file__).resolve()), "child", *fault, "--", *recipe_args]


def checkpoint_steps(output_dir: Path) -> list[int]:
    """Steps of the complete (renamed) checkpoint folders, oldest first."""
    root = output_dir / "checkpoints"
    if not root.is_dir():
        return []
    return sorted(int(p.name[5:]) for p in root.iterdir() if re.fullmatch(r"step_\d+", p.name))


def corrupt_newest_checkpoint(output_dir: Path, rng: random.Random) -> str:
    """Flip one byte of the newest complete checkpoint's model file, or truncate its optimizer file."""
    folder = output_dir / "checkpoints" / f"step_{checkpoint_steps(output_dir)[-1]}"
    if rng.random() < 0.5:
        target = folder / "model.safetensors"
        size = target.stat().st_size
        offset = rng.randrange(size // 2, size)  # in the tensor data, past the header
        with open(target, "r+b") as f:
            f.seek(offset)
            byte = f.read(1)
            f.seek(offset)
            f.write(bytes([byte[0] ^ 0x10]))
        return f"{target} (one byte flipped at offset {offset})"
    target = folder / "optimizer.bin"
    with open(target, "r+b") as f:
        f.truncate(target.stat().st_size // 3)
    return f"{target} (truncated to a third)"


def _last_line(text: str, pattern: str) -> str:
    lines = [line for line in text.splitlines() if re.search(pattern, line)]
    return lines[-1].strip() if lines else ""


def run_interrupted(
    recipe_args: list[str],
    output_dir: Path,
    kinds: list[str],
    max_train_steps: int,
    checkpointing_steps: int,
    seed: int = 0,
    env: dict[str, str] | None = None,
    timeout: float = 600,
    max_delay: float = 0.05,
) -> list[Segment]:
    """Run the recipe into `output_dir`, interrupting one process per entry of `kinds`, then to the end.

    Each fault lands at a random step after the checkpoint the process resumes from, late enough for the
    process to write at least one checkpoint first (SIGTERM: any later step), so that every process makes
    progress. After a process ends, a `corrupt_latest` interruption damages the newest complete checkpoint
    (when there is an older one to fall back to; otherwise it behaves as `sigkill`). Signals arrive a
    random 0 to `max_delay` seconds into their step (0: at its start, so that each process stops within
    the steps planned for it, as a test needs).

    Returns:
        One `Segment` per process, the last being the uninterrupted completion.

    Raises:
        RuntimeError: a process ended in a way its fault does not explain, or did not end within `timeout` s.
    """
    rng = random.Random(seed)
    segments: list[Segment] = []
    args = [*recipe_args, "--output_dir", str(output_dir), "--resume_from_checkpoint", "latest"]
    for kind in [*kinds, "none"]:
        done = checkpoint_steps(output_dir)
        start = done[-1] if done else 0  # the newest complete checkpoint (it may be the corrupted one)
        if kind == "sigterm":
            step = rng.randint(start + 1, start + checkpointing_steps)
        else:  # after the next periodic checkpoint, which the process then writes first
            first_save = (start // checkpointing_steps + 1) * checkpointing_steps
            step = rng.randint(first_save + 1, first_save + checkpointing_steps)
        step = min(step, max_train_steps) if kind != "none" else 0
        child_kind = "sigkill" if kind == "corrupt_latest" else kind
        delay = rng.uniform(0.0, max_delay)
        proc = subprocess.run(
            child_command(child_kind, step, args, delay), capture_output=True, text=True, env=env, timeout=timeout
        )
        resumed = re.findall(r"Resumed from \S+ at step (\d+)", proc.stderr)
        segment = Segment(kind, step, proc.returncode, int(resumed[-1]) if resumed else None)
        segment.skipped = re.findall(r"skipping checkpoint (\S+): ([^\n]*)", proc.stderr)
        segment.message = _last_line(proc.stderr, r"stopped by SIG|^error:")
        segments.append(segment)
        finished = (output_dir / "all_results.json").is_file()
        expected = {"none": (0,), "sigterm": (EXIT_PREEMPTED, 0)}.get(child_kind, (-signal.SIGKILL, 0))
        if proc.returncode not in expected:
            raise RuntimeError(
                f"{kind} at step {step}: exit code {proc.returncode}, expected {expected}\n{proc.stderr[-3000:]}"
            )
        if finished:
            break  # the fault came too late: the run completed
        if kind == "corrupt_latest" and len(checkpoint_steps(output_dir)) >= 2:
            segment.corrupted = corrupt_newest_checkpoint(output_dir, rng)
    return segments


def _load(path: Path):
    import torch

    return torch.load(path, map_location="cpu", weights_only=False)  # our own files (numpy RNG states)


def _equal(a, b) -> bool:
    import numpy as np
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


def compare_runs(reference: Path, candidate: Path) -> dict[str, bool]:
    """Compare two finished runs bit for bit: final weights, and the final checkpoint's states and position.

    Returns:
        `{what: equal}` for `weights` (model.safetensors), `optimizer`, `scheduler`, `rng` (random_states_*),
        `data_position` (step and tokens seen of training_state.json) and `checkpoint_weights`.
    """
    from safetensors.torch import load_file

    step = max(checkpoint_steps(reference))
    ref_ckpt, cand_ckpt = reference / "checkpoints" / f"step_{step}", candidate / "checkpoints" / f"step_{step}"
    states = [json.loads((d / "training_state.json").read_text()) for d in (ref_ckpt, cand_ckpt)]
    rng_files = sorted(p.name for p in ref_ckpt.glob("random_states_*.pkl"))
    return {
        "weights": _equal(load_file(reference / "model.safetensors"), load_file(candidate / "model.safetensors")),
        "checkpoint_weights": _equal(
            load_file(ref_ckpt / "model.safetensors"), load_file(cand_ckpt / "model.safetensors")
        ),
        "optimizer": _equal(_load(ref_ckpt / "optimizer.bin"), _load(cand_ckpt / "optimizer.bin")),
        "scheduler": _equal(_load(ref_ckpt / "scheduler.bin"), _load(cand_ckpt / "scheduler.bin")),
        "rng": bool(rng_files) and all(_equal(_load(ref_ckpt / n), _load(cand_ckpt / n)) for n in rng_files),
        "data_position": all(states[0][k] == states[1][k] for k in ("step", "tokens_seen")),
    }


def interruption_plan(count: int, seed: int) -> list[str]:
    """`count` interruptions, every kind at least once when `count` allows, in a seeded random order."""
    rng = random.Random(seed)
    kinds = [INTERRUPTIONS[i % len(INTERRUPTIONS)] for i in range(count)]
    rng.shuffle(kinds)
    if "corrupt_latest" in kinds and kinds[0] == "corrupt_latest":  # needs two checkpoints to fall back on
        kinds.append(kinds.pop(0))
    return kinds


def _option(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args and args.index(name) + 1 < len(args) else None


def main(argv: list[str] | None = None) -> int:
    """Driver entry point (see the module docstring). Returns the exit code: 0 when the runs match."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "child":
        child_main(argv[1:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work_dir", required=True, help="Folder for the reference and the interrupted run.")
    parser.add_argument("--interruptions", type=int, default=6, help="Processes to interrupt (>= 1).")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the fault schedule.")
    split = argv.index("--") if "--" in argv else len(argv)
    options, recipe_args = parser.parse_args(argv[:split]), argv[split + 1 :]
    if _option(recipe_args, "--checkpointing_steps") is None or _option(recipe_args, "--max_train_steps") is None:
        parser.error("the recipe arguments after -- need --checkpointing_steps and --max_train_steps")
    recipe_args = [*recipe_args, "--checkpoints_total_limit", _option(recipe_args, "--checkpoints_total_limit") or "3"]
    work = Path(options.work_dir)
    reference, chaos = work / "reference", work / "chaos"
    start = time.perf_counter()
    proc = subprocess.run(child_command("none", 0, [*recipe_args, "--output_dir", str(reference)]))
    if proc.returncode != 0:
        return proc.returncode
    segments = run_interrupted(
        recipe_args,
        chaos,
        interruption_plan(options.interruptions, options.seed),
        int(_option(recipe_args, "--max_train_steps")),
        int(_option(recipe_args, "--checkpointing_steps")),
        options.seed,
    )
    print(f"{'process':>7}  {'fault':<16} {'at step':>7}  {'exit':>4}  {'resumed from':>12}  notes")
    for i, s in enumerate(segments):
        notes = [
            s.message,
            *(f"skipped {p}: {why}" for p, why in s.skipped),
            s.corrupted and f"corrupted {s.corrupted}",
        ]
        notes = "; ".join(n for n in notes if n)
        at = str(s.step) if s.kind != "none" else "-"
        print(f"{i:>7}  {s.kind:<16} {at:>7}  {s.returncode:>4}  {str(s.resumed_from or '-'):>12}  {notes}")
    result = compare_runs(reference, chaos)
    print("identical to the uninterrupted run: " + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in result.items()))
    print(f"{len(segments) - 1} interruptions, {time.perf_counter() - start:.0f} s")
    return 0 if all(result.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
