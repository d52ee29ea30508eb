"""Resumable training checkpoints: atomic saves with a manifest, verification, and the choice of what to resume.

Layout: `<output_dir>/checkpoints/step_N/` holds accelerate's `save_state` files (model, optimizer,
scheduler, RNG and sampler states; under DeepSpeed one ZeRO partition per process), `config.json`, the
tokenizer, `training_state.json` (step, tokens seen, world size, skipped non-finite steps) and, written
last, `manifest.json`: every other file's relative path, size in bytes and sha256.

A save goes to `step_N.tmp/` and is renamed to `step_N/` only after the manifest is written, so a run
killed during a save leaves an incomplete `.tmp` folder and the previous checkpoints intact. Loading
verifies the manifest (sizes, then digests); `--resume_from_checkpoint latest` takes the newest
checkpoint that verifies and warns about each newer one it skips, naming it and why.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pickle
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch.distributed as dist
from accelerate.utils import DistributedType
from safetensors import SafetensorError

from ..integrity import WeightFileError, check_weight_files, file_sha256
from .faults import (
    CheckpointError,
    NonFiniteError,
    NonFiniteGuard,
    broadcast_from_main,
    first_nonfinite_parameter,
    gather_messages,
)

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator

logger = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoints"
TRAINING_STATE = "training_state.json"
#: Written last into each checkpoint: `{"files": {relative_path: {"size": bytes, "sha256": hex}}}`.
MANIFEST = "manifest.json"
#: Config fields that may differ between a checkpoint and the run resuming from it.
_RESUME_IGNORED_CONFIG_KEYS = {"architectures", "transformers_version", "_name_or_path", "dtype", "torch_dtype"}
_STEP_FOLDER = re.compile(r"step_(\d+)(\.tmp)?")


class CheckpointedRun(Protocol):
    """What `save_checkpoint` reads of a run (the pretraining job's `PretrainingRun` is one).

    Attributes:
        args: the run's arguments (`output_dir`, `checkpoints_total_limit`, ...).
        accelerator: the run's `Accelerator`, whose `save_state` writes the training state.
        model: the prepared (wrapped) model.
        tokenizer: saved into each checkpoint with `save_pretrained`.
        max_train_steps: optimizer steps in total (recorded, to resume the same schedule).
        nonfinite_guard: the run's guard against non-finite steps (its state is saved), or None.
    """

    args: argparse.Namespace
    accelerator: Accelerator
    model: torch.nn.Module
    tokenizer: Any
    max_train_steps: int
    nonfinite_guard: NonFiniteGuard | None


def checkpoint_folder(args: argparse.Namespace, step: int) -> Path:
    """The folder of the checkpoint of `step`: `<args.output_dir>/checkpoints/step_<step>`."""
    return Path(args.output_dir) / CHECKPOINT_DIR / f"step_{step}"


def prepare_output_dir(
    output_dir: str | os.PathLike, checkpointing: bool = False, argument: str = "--output_dir"
) -> Path:
    """Create the output folder (and its `checkpoints` folder) and check that files can be written there.

    Called before any data is read, so that a bad `--output_dir` fails in a second instead of after
    training. Every process of a multi-process run checks (each writes its part of a checkpoint).

    Args:
        output_dir: the folder.
        checkpointing: also create and check `output_dir/checkpoints`.
        argument: the command-line argument, for messages.

    Returns:
        The folder.

    Raises:
        ValueError: the path (or a parent) is an existing file, or the folder cannot be created or
            written to (the message names the path and the OS error).
    """
    folder = Path(output_dir).expanduser()
    targets = [folder, folder / CHECKPOINT_DIR] if checkpointing else [folder]
    for target in targets:
        if target.exists() and not target.is_dir():
            raise ValueError(f"{argument} {target}: is an existing file, not a folder")
        try:
            target.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=target, prefix=".write_check_"):
                pass
        except OSError as err:
            raise ValueError(f"{argument} {target}: cannot write there ({err.strerror or err})") from None
    return folder


def _step_folders(root: Path) -> list[tuple[int, bool, Path]]:
    """`(step, finished, path)` of every `step_N` and `step_N.tmp` folder under `root`."""
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _STEP_FOLDER.fullmatch(path.name)
        if match and path.is_dir():
            found.append((int(match.group(1)), match.group(2) is None, path))
    return found


def _complete_checkpoints(root: Path) -> list[Path]:
    """The `step_N` folders under `root` (a `checkpoints` folder), oldest first, not verified.

    A folder is complete when its save finished: it has a manifest (or, written by an older hfzoo
    without manifests, a `training_state.json`). `step_N.tmp` folders are unfinished saves.
    """
    done = [
        (step, path)
        for step, finished, path in _step_folders(root)
        if finished and ((path / MANIFEST).is_file() or (path / TRAINING_STATE).is_file())
    ]
    return [path for _, path in sorted(done)]


def complete_checkpoints(output_dir: str | os.PathLike) -> list[Path]:
    """The complete checkpoint folders of a run's `output_dir`, oldest first (see `_complete_checkpoints`)."""
    return _complete_checkpoints(Path(output_dir) / CHECKPOINT_DIR)


def write_manifest(folder: Path) -> dict[str, Any]:
    """Write `folder/manifest.json` listing every other file of `folder` (recursively) with size and sha256.

    Returns:
        The manifest written.

    Raises:
        OSError: a file cannot be read, or the manifest cannot be written.
    """
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST):
        files[path.relative_to(folder).as_posix()] = {"size": path.stat().st_size, "sha256": file_sha256(path)}
    manifest = {"format": 1, "files": files}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def verify_checkpoint(folder: str | os.PathLike) -> None:
    """Check a checkpoint folder against its manifest: every file present, of its size, with its sha256.

    Sizes are checked first (a truncated file fails without reading anything), then digests. A folder
    written by an older hfzoo (no manifest, but a `training_state.json`) cannot be verified: it is
    accepted with a warning, after a check of its weight files' headers.

    Args:
        folder: a `checkpoints/step_N` folder.

    Raises:
        CheckpointError: the reason, naming the file (missing, truncated, or corrupt).
    """
    folder = Path(folder)
    manifest_file = folder / MANIFEST
    if not manifest_file.is_file():
        if (folder / TRAINING_STATE).is_file():
            logger.warning(f"checkpoint {folder} has no {MANIFEST} (written by an older hfzoo): not verified")
            try:
                check_weight_files(folder)
            except WeightFileError as err:
                raise CheckpointError(str(err)) from None
            return
        raise CheckpointError(f"incomplete: no {MANIFEST} (its save did not finish)")
    try:
        files = json.loads(manifest_file.read_text())["files"]
        entries = [(folder / name, int(entry["size"]), str(entry["sha256"])) for name, entry in files.items()]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise CheckpointError(f"{manifest_file}: corrupt ({err})") from None
    for path, size, _ in entries:
        if not path.is_file():
            raise CheckpointError(f"{path}: missing (listed in {MANIFEST})")
        actual = path.stat().st_size
        if actual != size:
            kind = "truncated" if actual < size else "corrupt"
            raise CheckpointError(f"{path}: {kind} ({actual} bytes, {MANIFEST} says {size})")
    for path, _, digest in entries:
        if file_sha256(path) != digest:
            raise CheckpointError(f"{path}: corrupt (its sha256 differs from {MANIFEST})")


def find_latest_checkpoint(output_dir: str | os.PathLike, verify: bool = True) -> Path | None:
    """Return the newest intact checkpoint folder under `output_dir/checkpoints`, or None.

    Newer folders that are incomplete (`step_N.tmp`: the save was interrupted) or fail verification
    (`verify_checkpoint`) are skipped with a warning naming the folder and why.

    Args:
        output_dir: the run's output folder.
        verify: check each candidate against its manifest (False: only completeness).

    Returns:
        The checkpoint folder, or None when there is none.

    Raises:
        CheckpointError: there are complete checkpoints but none verifies (a fresh start would discard them).
    """
    candidates = sorted(_step_folders(Path(output_dir) / CHECKPOINT_DIR), key=lambda c: (c[0], c[1]), reverse=True)
    rejected = []
    for _, finished, path in candidates:
        if not finished:
            logger.warning(f"skipping checkpoint {path}: incomplete (its save did not finish)")
            continue
        try:
            if verify:
                verify_checkpoint(path)
            elif not ((path / MANIFEST).is_file() or (path / TRAINING_STATE).is_file()):
                raise CheckpointError(f"incomplete: no {MANIFEST} (its save did not finish)")
        except CheckpointError as err:
            logger.warning(f"skipping checkpoint {path}: {err}")
            rejected.append(f"{path.name} ({err})")
            continue
        return path
    if rejected:
        raise CheckpointError(f"no intact checkpoint in {Path(output_dir) / CHECKPOINT_DIR}: {'; '.join(rejected)}")
    return None


def _resolve_resume_here(args: argparse.Namespace) -> Path | None:
    if args.resume_from_checkpoint == "latest":
        path = find_latest_checkpoint(args.output_dir)
        if path is None:
            logger.warning(f"--resume_from_checkpoint latest: no checkpoint in {args.output_dir}; starting fresh")
        return path
    path = Path(args.resume_from_checkpoint)
    if not (path / TRAINING_STATE).is_file():
        raise CheckpointError(f"--resume_from_checkpoint {path}: not a checkpoint folder (no {TRAINING_STATE})")
    try:
        verify_checkpoint(path)
    except CheckpointError as err:
        raise CheckpointError(f"--resume_from_checkpoint {path}: {err}") from None
    return path


def _resolve_resume(args: argparse.Namespace, accelerator: Accelerator | None = None) -> Path | None:
    """The checkpoint to resume from (`--resume_from_checkpoint`: a folder or `latest`), verified, or None.

    The main process reads and verifies the checkpoints and tells the others its choice.

    Raises:
        CheckpointError: the named folder is not a checkpoint or fails verification, or `latest` finds
            only checkpoints that fail it.
    """
    if not args.resume_from_checkpoint:
        return None
    path, error = None, None
    if accelerator is None or accelerator.is_main_process:
        try:
            path = _resolve_resume_here(args)
        except CheckpointError as err:
            error = str(err)
    if accelerator is not None:
        path, error = broadcast_from_main(accelerator, (path, error))
    if error is not None:
        raise CheckpointError(error)
    return path


def check_resume_config(resume_path: Path, config) -> None:
    """Refuse to resume from a checkpoint saved with a different model config.

    Raises:
        ValueError: a config field differs (names the first fields and both values).
    """
    saved_file = resume_path / "config.json"
    if not saved_file.is_file():
        return
    saved_type = json.loads(saved_file.read_text()).get("model_type")
    if saved_type != config.model_type:
        raise ValueError(
            f"--resume_from_checkpoint {resume_path}: saved from a {saved_type!r} model, "
            f"this run builds {config.model_type!r}"
        )
    saved = type(config).from_json_file(saved_file).to_dict()
    current = config.to_dict()
    keys = sorted((set(saved) | set(current)) - _RESUME_IGNORED_CONFIG_KEYS)
    diffs = [k for k in keys if saved.get(k) != current.get(k)]
    if diffs:
        shown = ", ".join(f"{k}={saved.get(k)!r} there, {current.get(k)!r} here" for k in diffs[:3])
        raise ValueError(f"--resume_from_checkpoint {resume_path}: saved with a different model config ({shown})")


def _check_resume_topology(resume_path: Path, accelerator: Accelerator) -> None:
    """DeepSpeed checkpoints hold one ZeRO partition per process: resume them with the same world and backend."""
    state = json.loads((resume_path / TRAINING_STATE).read_text())
    saved_type, saved_processes = state.get("distributed_type"), state.get("num_processes")
    if saved_type != DistributedType.DEEPSPEED.value and accelerator.distributed_type != DistributedType.DEEPSPEED:
        return
    if saved_type != accelerator.distributed_type.value or saved_processes != accelerator.num_processes:
        raise ValueError(
            f"--resume_from_checkpoint {resume_path}: written by {saved_processes} process(es) with {saved_type}; "
            f"this run has {accelerator.num_processes} with {accelerator.distributed_type.value} "
            "(convert it with recipes/consolidate_checkpoint.py and start from --model_name_or_path)"
        )


def _attempt(action) -> str | None:
    """Run `action()`; return None, or the error it raised as one line (OS errors keep errno and path)."""
    try:
        action()
    except (OSError, RuntimeError) as err:
        text = str(err).strip().splitlines()
        return f"{type(err).__name__}: {text[0] if text else ''}"
    return None


def _raise_if_any_failed(accelerator: Accelerator, error: str | None, tmp: Path, root: Path) -> None:
    """After one phase of a save, stop every process if any of them failed (removing the partial save)."""
    errors = gather_messages(accelerator, None if error is None else f"process {accelerator.process_index}: {error}")
    if not errors:
        return
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)  # frees the space a partial save took
    previous = _complete_checkpoints(root)
    kept = f"the previous checkpoint, {previous[-1]}, is intact" if previous else "no earlier checkpoint exists"
    try:
        free = f"; {shutil.disk_usage(root).free / 2**20:.0f} MiB free on its disk"
    except OSError:
        free = ""
    shown = errors[0] if accelerator.num_processes > 1 else errors[0].split(": ", 1)[1]
    raise CheckpointError(f"cannot write checkpoint {tmp} ({shown}){free}; {kept}")


def save_checkpoint(
    run: CheckpointedRun, step: int, tokens_seen: int, extra_state: dict[str, Any] | None = None
) -> Path:
    """Save a resumable checkpoint (model, optimizer, scheduler, RNG and sampler states) atomically.

    Every process writes its part (DeepSpeed: its ZeRO partition) to `checkpoints/step_N.tmp`; once all
    are done, the main process adds `config.json`, the tokenizer, `training_state.json` and, last,
    `manifest.json`, then renames the folder to `checkpoints/step_N`, so a crash during a save never
    leaves a partial `step_N`. The oldest checkpoints beyond `--checkpoints_total_limit`, and unfinished
    saves of earlier steps, are then removed.

    Args:
        run: the prepared run.
        step: the optimizer steps completed.
        tokens_seen: training tokens consumed so far (all processes).
        extra_state: more entries for `training_state.json` (default: the skipped non-finite steps of
            `run.nonfinite_guard`).

    Returns:
        The checkpoint folder.

    Raises:
        NonFiniteError: a parameter holds a NaN or infinity (nothing is written).
        CheckpointError: a process could not write its files (full disk, no permission, ...): the partial
            save is removed, the previous checkpoints are untouched, and the message names the folder
            and the OS error.
    """
    accelerator, args = run.accelerator, run.args
    bad = first_nonfinite_parameter(accelerator, run.model)
    if bad is not None:
        raise NonFiniteError(f"refusing to write the checkpoint of step {step}: parameter {bad} is not finite")
    if extra_state is None and getattr(run, "nonfinite_guard", None) is not None:
        extra_state = run.nonfinite_guard.state_dict()
    final = checkpoint_folder(args, step)
    root, tmp = final.parent, final.with_name(f"{final.name}.tmp")

    error = None
    if accelerator.is_main_process:
        error = _attempt(lambda: shutil.rmtree(tmp) if tmp.exists() else None)
    _raise_if_any_failed(accelerator, error, tmp, root)
    _raise_if_any_failed(accelerator, _attempt(lambda: accelerator.save_state(str(tmp))), tmp, root)

    def finish() -> None:
        unwrapped = accelerator.unwrap_model(run.model)
        unwrapped.config.architectures = [type(unwrapped).__name__]
        unwrapped.config.save_pretrained(tmp)
        run.tokenizer.save_pretrained(tmp)
        state = {
            "step": step,
            "tokens_seen": tokens_seen,
            "max_train_steps": run.max_train_steps,
            "objective": args.objective,
            "num_processes": accelerator.num_processes,
            "distributed_type": accelerator.distributed_type.value,
            **(extra_state or {}),
        }
        (tmp / TRAINING_STATE).write_text(json.dumps(state))
        write_manifest(tmp)  # last: a folder with a manifest is complete
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)

    error = _attempt(finish) if accelerator.is_main_process else None
    _raise_if_any_failed(accelerator, error, tmp, root)
    if accelerator.is_main_process:
        done = _complete_checkpoints(root)
        for old in done[: max(0, len(done) - args.checkpoints_total_limit)]:
            shutil.rmtree(old, ignore_errors=True)
        for earlier, finished, path in _step_folders(root):
            if not finished and earlier < step:
                shutil.rmtree(path, ignore_errors=True)  # a save killed before it finished
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator: Accelerator, path: Path) -> dict[str, Any]:
    """Restore model, optimizer, scheduler, RNG and sampler states from a (verified) checkpoint folder.

    Returns:
        Its `training_state.json` (`step`, `tokens_seen`, ...).

    Raises:
        CheckpointError: a file cannot be read (truncated or corrupt), naming the folder or the file.
    """
    try:
        check_weight_files(path)
        accelerator.load_state(str(path))
        return json.loads((path / TRAINING_STATE).read_text())
    except WeightFileError as err:
        raise CheckpointError(f"--resume_from_checkpoint {path}: {err}") from None
    except (OSError, RuntimeError, ValueError, EOFError, KeyError, pickle.UnpicklingError, SafetensorError) as err:
        if isinstance(err, dist.DistError):
            raise  # a failed collective, not a damaged file
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise CheckpointError(
            f"--resume_from_checkpoint {path}: cannot load it, a file is truncated or corrupt "
            f"({type(err).__name__}: {first})"
        ) from None
