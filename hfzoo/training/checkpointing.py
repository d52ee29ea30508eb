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
import ast
import hashlib
import json
import logging
import os
import pickle
import re
import shutil
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist
from accelerate.utils import DistributedType
from safetensors import SafetensorError
from transformers import AutoTokenizer

from ..integrity import WeightFileError, check_weight_files, file_sha256
from ..outputs import check_output_folder
from .arguments import MUON_FLAGS, muon_settings
from .faults import (
    CheckpointError,
    NonFiniteError,
    NonFiniteGuard,
    decide_on_main,
    first_nonfinite_parameter,
    gather_messages,
)
from .objectives import OBJECTIVES

if TYPE_CHECKING:
    from accelerate import Accelerator

logger = logging.getLogger(__name__)

CHECKPOINT_DIR = "checkpoints"
TRAINING_STATE = "training_state.json"
#: A checkpoint's training and validation records so far (`{"log_history", "eval_history"}`), when the run
#: keeps them (`CheckpointedRun.train_history`): a resumed run's `train_history.json` starts with them.
TRAIN_HISTORY_FILE = "train_history.json"
#: Written last into each checkpoint: `{"files": {relative_path: {"size": bytes, "sha256": hex}}}`.
MANIFEST = "manifest.json"
#: Config fields that may differ between a checkpoint and the run resuming from it.
_RESUME_IGNORED_CONFIG_KEYS = {"architectures", "transformers_version", "_name_or_path", "dtype", "torch_dtype"}
#: Optimizer parameter-group entries a checkpoint restores (the others are the run's: weight decay, betas, eps).
_LOADED_GROUP_KEYS = {"params", "lr", "initial_lr", "step"}
_STEP_FOLDER = re.compile(r"step_(\d+)(\.tmp)?")


class _DeclaredTiesFilter(logging.Filter):
    """Drop accelerate's "Removed shared tensor {...} while saving" warning when it names declared ties only."""

    def __init__(self, tied: set[str]) -> None:
        super().__init__()
        self.tied = tied

    def filter(self, record: logging.LogRecord) -> bool:
        match = re.search(r"Removed shared tensor (\{.*\}) while saving", record.getMessage())
        if match is None:
            return True
        try:
            removed = ast.literal_eval(match.group(1))
        except (ValueError, SyntaxError):
            return True
        return not (isinstance(removed, set) and removed <= self.tied)


def save_accelerator_state(accelerator: Accelerator, model: torch.nn.Module, folder: str | os.PathLike) -> None:
    """`accelerator.save_state(folder)`, without accelerate's warning about the model's tied weights.

    With safetensors, accelerate writes a tensor shared by several names once and logs "Removed shared tensor
    {'lm_head.weight'} while saving. This should be OK, but check ..." at every save. For the weights the model
    declares tied (`all_tied_weights_keys`: e.g. the output embeddings tied to the input embeddings) that is
    expected: loading the checkpoint ties them again (the resume tests compare every step after it). The warning
    still shows for any other shared tensor.

    Args:
        accelerator: the run's `Accelerator`.
        model: the prepared model (unwrapped here to read its ties).
        folder: the folder to write.

    Raises:
        OSError: from `save_state`.
    """
    tied = set(getattr(accelerator.unwrap_model(model), "all_tied_weights_keys", None) or {})
    accelerate_logger = logging.getLogger("accelerate.utils.other")
    declared = _DeclaredTiesFilter(tied)
    accelerate_logger.addFilter(declared)
    try:
        accelerator.save_state(str(folder))
    finally:
        accelerate_logger.removeFilter(declared)


class CheckpointedRun(Protocol):
    """What `save_checkpoint` reads of a run (the pretraining job's `PretrainingRun` is one).

    Attributes:
        args: the run's arguments (`output_dir`, `checkpoints_total_limit`, ...).
        accelerator: the run's `Accelerator`, whose `save_state` writes the training state.
        model: the prepared (wrapped) model.
        tokenizer: saved into each checkpoint with `save_pretrained`.
        max_train_steps: optimizer steps in total (recorded, to resume the same schedule).
        nonfinite_guard: the run's guard against non-finite steps (its state is saved), or None.
        train_history: optional; `{"log_history": [...], "eval_history": [...]}` so far, saved with each
            checkpoint as `train_history.json`.
        base_model: optional; the pretrained model the run started from (`base_model_record`, None: newly
            initialized weights), saved in `training_state.json` for `check_resume_base_model`.
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
    training. Every process of a multi-process run checks (each writes its part of a checkpoint). A run
    refused later removes the folders created here again (`hfzoo.outputs.removed_if_refused`).

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
    for target in [folder, folder / CHECKPOINT_DIR] if checkpointing else [folder]:
        check_output_folder(target, argument)
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


def verify_checkpoint(folder: str | os.PathLike, state_file: str = TRAINING_STATE) -> None:
    """Check a checkpoint folder against its manifest: every file present, of its size, with its sha256.

    Sizes are checked first (a truncated file fails without reading anything), then digests. A folder
    written by an older hfzoo (no manifest, but its loop state `state_file`) cannot be verified: it is
    accepted with a warning, after a check of its weight files' headers.

    Args:
        folder: a `checkpoints/step_N` folder.
        state_file: the loop state every checkpoint of the run holds (`training_state.json` for pretraining,
            `hfzoo.finetuning.loop.GLUE_STATE` for GLUE finetuning).

    Raises:
        CheckpointError: the reason, naming the file (missing, truncated, or corrupt).
    """
    folder = Path(folder)
    manifest_file = folder / MANIFEST
    if not manifest_file.is_file():
        if (folder / state_file).is_file():
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


def find_latest_checkpoint(
    output_dir: str | os.PathLike, verify: bool = True, state_file: str = TRAINING_STATE
) -> Path | None:
    """Return the newest intact checkpoint folder under `output_dir/checkpoints`, or None.

    Newer folders that are incomplete (`step_N.tmp`: the save was interrupted) or fail verification
    (`verify_checkpoint`) are skipped with a warning naming the folder and why.

    Args:
        output_dir: the run's output folder.
        verify: check each candidate against its manifest (False: only completeness).
        state_file: the loop state of the run's checkpoints (see `verify_checkpoint`).

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
                verify_checkpoint(path, state_file)
            elif not ((path / MANIFEST).is_file() or (path / state_file).is_file()):
                raise CheckpointError(f"incomplete: no {MANIFEST} (its save did not finish)")
        except CheckpointError as err:
            logger.warning(f"skipping checkpoint {path}: {err}")
            rejected.append(f"{path.name} ({err})")
            continue
        return path
    if rejected:
        raise CheckpointError(f"no intact checkpoint in {Path(output_dir) / CHECKPOINT_DIR}: {'; '.join(rejected)}")
    return None


def resolve_resume_argument(
    resume_from_checkpoint: str,
    output_dir: str | os.PathLike,
    state_file: str = TRAINING_STATE,
    what: str = "checkpoint",
) -> Path | None:
    """The verified checkpoint folder `--resume_from_checkpoint` names, in the process that reads it.

    Args:
        resume_from_checkpoint: a checkpoint folder, or `latest`: the newest intact one in `output_dir`
            (`find_latest_checkpoint`), None (with a warning) when there is none.
        output_dir: the run's output folder.
        state_file: the loop state every checkpoint of the run holds (see `verify_checkpoint`).
        what: the kind of folder, for messages (`"GLUE checkpoint"`).

    Raises:
        CheckpointError: a folder without `state_file`, or whose files do not match its manifest (one line naming
            the file); `latest` with checkpoints of which none is intact.
    """
    if resume_from_checkpoint == "latest":
        path = find_latest_checkpoint(output_dir, state_file=state_file)
        if path is None:
            logger.warning(f"--resume_from_checkpoint latest: no checkpoint in {output_dir}; starting fresh")
        return path
    path = Path(resume_from_checkpoint)
    if not (path / state_file).is_file():
        raise CheckpointError(f"--resume_from_checkpoint {path}: not a {what} folder (no {state_file})")
    try:
        verify_checkpoint(path, state_file)
    except CheckpointError as err:
        raise CheckpointError(f"--resume_from_checkpoint {path}: {err}") from None
    return path


def earlier_run_checkpoints(args: argparse.Namespace) -> str | None:
    """The complete checkpoints of an earlier run that a fresh run in `args.output_dir` would save beside its own.

    None when `args.resume_from_checkpoint` continues a run or `args.overwrite_output_dir` deletes them.

    Args:
        args: the run's arguments (`output_dir`, `resume_from_checkpoint`, `overwrite_output_dir`).

    Returns:
        `"checkpoints/step_4, checkpoints/step_8"` (oldest first), or None when there are none.
    """
    if args.resume_from_checkpoint or args.overwrite_output_dir:
        return None
    earlier = complete_checkpoints(args.output_dir)
    return ", ".join(f"{CHECKPOINT_DIR}/{path.name}" for path in earlier) or None


def refuse_earlier_checkpoints(args: argparse.Namespace, accelerator: Accelerator | None = None) -> None:
    """Refuse a fresh run in an `--output_dir` that holds the checkpoints of an earlier run.

    A run started without `--resume_from_checkpoint` would save its checkpoints beside the earlier run's:
    `--checkpoints_total_limit` would then remove the new run's own checkpoints first when the earlier run's steps
    are higher, and a later `--resume_from_checkpoint latest` would continue the earlier run. With
    `--overwrite_output_dir` the run goes on, and `delete_earlier_checkpoints` deletes them once every check has
    passed. The main process looks and tells the others (one answer for every process).

    Args:
        args: the run's arguments (`output_dir`, `resume_from_checkpoint`, `overwrite_output_dir`).
        accelerator: the run's `Accelerator` (None: this process alone).

    Raises:
        CheckpointError: complete checkpoints in `<output_dir>/checkpoints`, and neither `--resume_from_checkpoint`
            nor `--overwrite_output_dir`; one line naming them and the three ways on.
    """

    def refuse() -> None:
        if earlier := earlier_run_checkpoints(args):
            raise CheckpointError(
                f"--output_dir {args.output_dir} holds the checkpoints of an earlier run ({earlier}); give "
                "--resume_from_checkpoint latest to continue it, --overwrite_output_dir to delete them and start "
                "over, or another --output_dir"
            )

    decide_on_main(accelerator, refuse, CheckpointError)


def delete_earlier_checkpoints(args: argparse.Namespace, accelerator: Accelerator | None = None) -> None:
    """With `--overwrite_output_dir` and no `--resume_from_checkpoint`: delete `<output_dir>/checkpoints/step_*`.

    Called once the run has passed its checks, just before training, so that a refused run deletes nothing
    (see `refuse_earlier_checkpoints`). The main process deletes; every process waits for it.

    Args:
        args: the run's arguments (`output_dir`, `resume_from_checkpoint`, `overwrite_output_dir`).
        accelerator: the run's `Accelerator` (None: this process alone).
    """
    if not args.overwrite_output_dir or args.resume_from_checkpoint:
        return
    if accelerator is None or accelerator.is_main_process:
        root = Path(args.output_dir) / CHECKPOINT_DIR
        earlier = _step_folders(root)
        if earlier:
            logger.warning(f"--overwrite_output_dir: deleting the earlier run's {len(earlier)} checkpoint(s) in {root}")
        for _, _, path in earlier:
            shutil.rmtree(path)
    if accelerator is not None:
        accelerator.wait_for_everyone()


def _resolve_resume(args: argparse.Namespace, accelerator: Accelerator | None = None) -> Path | None:
    """The checkpoint to resume from (`--resume_from_checkpoint`: a folder or `latest`), verified, or None.

    The main process reads and verifies the checkpoints and tells the others its choice.

    Raises:
        CheckpointError: the named folder is not a checkpoint or fails verification, or `latest` finds
            only checkpoints that fail it.
    """
    if not args.resume_from_checkpoint:
        return None
    return decide_on_main(
        accelerator, lambda: resolve_resume_argument(args.resume_from_checkpoint, args.output_dir), CheckpointError
    )


def check_resume_config(resume_path: Path, config) -> None:
    """Refuse to resume from a checkpoint saved with a different model config.

    Raises:
        ValueError: a config field differs (names the first fields and both values).
    """
    saved_file = resume_path / "config.json"
    if not saved_file.is_file():
        return
    saved = json.loads(saved_file.read_text())
    if saved.get("model_type") != config.model_type:
        raise ValueError(
            f"--resume_from_checkpoint {resume_path}: saved from a {saved.get('model_type')!r} model, "
            f"this run builds {config.model_type!r}"
        )
    if shown := _config_differences(saved, config):
        raise ValueError(f"--resume_from_checkpoint {resume_path}: saved with a different model config ({shown})")


def _config_differences(saved: dict[str, Any], config) -> str:
    """The first three fields in which the config dict `saved` (of `config`'s model type) differs from `config`.

    Both are read by `config`'s class, so fields a newer release adds get their defaults on both sides; the keys a
    save rewrites (`_RESUME_IGNORED_CONFIG_KEYS`) are left out.

    Returns:
        `"name=<saved value> there, <this value> here, ..."`, or "" when they agree.
    """
    there, here = type(config).from_dict(saved).to_dict(), config.to_dict()
    keys = sorted((there.keys() | here.keys()) - _RESUME_IGNORED_CONFIG_KEYS)
    differ = [k for k in keys if there.get(k) != here.get(k)]
    return ", ".join(f"{k}={there.get(k)!r} there, {here.get(k)!r} here" for k in differ[:3])


def check_resume_tokenizer(resume_path: Path, tokenizer, source: str) -> None:
    """Refuse to resume with a tokenizer whose vocabulary differs from the one the checkpoint was trained with.

    Every checkpoint holds its run's tokenizer. A tokenizer of the same size passes `check_resume_config`, but one
    trained on other text or with other settings maps text to other ids: the resumed run would go on training
    embeddings and output rows learnt for one token on another, and finish without an error.

    Args:
        resume_path: the checkpoint folder.
        tokenizer: this run's tokenizer (`get_vocab()`: token -> id).
        source: where this run's tokenizer comes from, for the message (`"--tokenizer_name tok"`).

    Raises:
        ValueError: one line naming the checkpoint, `source`, how many tokens differ and the first of them. A
            checkpoint without tokenizer files (`tokenizer_config.json`) is not checked.
    """
    if not (resume_path / "tokenizer_config.json").is_file():
        return
    saved = AutoTokenizer.from_pretrained(resume_path).get_vocab()
    here = tokenizer.get_vocab()
    differ = sorted((token for token in saved.keys() | here.keys() if saved.get(token) != here.get(token)),
                    key=lambda token: min(saved.get(token, len(saved)), here.get(token, len(here))))  # fmt: skip
    if differ:
        first = differ[0]
        raise ValueError(
            f"--resume_from_checkpoint {resume_path}: trained with another tokenizer than this run's ({source}): "
            f"{len(differ)} of its {len(saved)} tokens have other ids here or are missing (first: {first!r}, id "
            f"{saved.get(first)} there, {here.get(first)} here); resume with the tokenizer the checkpoint holds"
        )


def base_model_record(
    name: str, model: torch.nn.Module, config, tokenizer, newly_initialized: Collection[str] = ()
) -> dict[str, Any]:
    """What identifies the pretrained model a run starts from, as its checkpoints record it.

    Finetuning and continued pretraining record it. A checkpoint holds the whole model's weights (accelerate's
    `save_state`), so a resume from another base of the same architecture would load them over it without an error
    and go on training the first base, while the saved adapter or model card would name the second
    (`check_resume_base_model`). The record identifies the base by content, not by path, so the same model may be
    resumed from another folder or from the hub cache. Parameters that DeepSpeed ZeRO-3 partitioned as they were
    loaded (`zero3_init_flag: true`) are gathered one at a time, so the record is the same under every engine; then
    every process must call this function.

    Args:
        name: `--model_name_or_path` as given (for messages only; not compared).
        model: the model as loaded from `name`, before an adapter or engine wraps it or a step trains it.
        config: the base's own config (`AutoConfig.from_pretrained(name)`, without the run's label settings).
        tokenizer: the tokenizer the run uses with it (`get_vocab()`: token -> id).
        newly_initialized: names in `model.state_dict()` that `from_pretrained` initialized rather than loaded (a
            new task head: `newly_initialized_keys`); left out of the weights' digest.

    Returns:
        `{"model_name_or_path": name, "config": config.to_dict() without the keys a save rewrites,
        "vocabulary": "sha256:<hex>" of the sorted (token, id) pairs, "weights": "sha256:<hex>" of every loaded
        tensor's name, dtype, shape and bytes in name order}`, JSON-serializable.
    """
    weights = hashlib.sha256()
    parameters = dict(model.named_parameters(remove_duplicate=False))
    for key, tensor in sorted(model.state_dict().items()):
        if key in newly_initialized:
            continue
        parameter = parameters.get(key)
        if parameter is not None and hasattr(parameter, "ds_id"):  # a ZeRO-3 partition: its state_dict entry is empty
            import deepspeed

            with deepspeed.zero.GatheredParameters([parameter]):
                _update_weights_digest(weights, key, parameter)
        else:
            _update_weights_digest(weights, key, tensor)
    vocabulary = json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False).encode()
    return {
        "model_name_or_path": str(name),
        "config": {k: v for k, v in config.to_dict().items() if k not in _RESUME_IGNORED_CONFIG_KEYS},
        "vocabulary": f"sha256:{hashlib.sha256(vocabulary).hexdigest()}",
        "weights": f"sha256:{weights.hexdigest()}",
    }


def newly_initialized_keys(loading_info: dict[str, Any]) -> set[str]:
    """The state-dict names `from_pretrained(..., output_loading_info=True)` initialized instead of loading.

    Args:
        loading_info: its loading info (`missing_keys`; `mismatched_keys` as names or `(name, saved shape, shape)`).

    Returns:
        The missing and the mismatched names (a new task head), for `base_model_record`'s `newly_initialized`.
    """
    mismatched = {key if isinstance(key, str) else key[0] for key in loading_info.get("mismatched_keys") or ()}
    return {*(loading_info.get("missing_keys") or ()), *mismatched}


def _update_weights_digest(digest, key: str, tensor: torch.Tensor) -> None:
    """Add one tensor (its name, dtype, shape and bytes) to `base_model_record`'s weights digest."""
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    digest.update(f"{key} {flat.dtype} {tuple(tensor.shape)};".encode())
    digest.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")


def check_resume_base_model(resume_path: Path, record: dict[str, Any] | None, config, state_file: str) -> None:
    """Refuse to resume a checkpoint on another pretrained model than the one its run started from.

    Compares this run's `base_model_record` with the checkpoint's (`base_model` in `state_file`): the config (as
    `check_resume_config` does, both read by this run's config class), then the tokenizer's vocabulary, then the
    weights. A record of None is a run that started from newly initialized weights (pretraining without
    `--model_name_or_path`); such a checkpoint resumes only without a base, and a base's checkpoint only with it. A
    checkpoint of an older hfzoo, without the record, is not checked.

    Args:
        resume_path: the checkpoint folder.
        record: this run's `base_model_record`, or None when it starts from newly initialized weights.
        config: this run's base config (the class that reads the saved one).
        state_file: the checkpoint's loop state (`training_state.json`, or `hfzoo.finetuning.loop.GLUE_STATE`).

    Raises:
        ValueError: one line naming both models and what differs (the first config fields with both values, the
            vocabulary or the weights), or that one of the two runs starts from no pretrained model.
    """
    state = json.loads((resume_path / state_file).read_text())
    if "base_model" not in state:
        return
    saved = state["base_model"]
    if saved is None and record is None:
        return
    if saved is None:
        raise ValueError(
            f"--resume_from_checkpoint {resume_path}: written by a run that started from newly initialized weights; "
            f"this run starts from --model_name_or_path {record['model_name_or_path']}: the checkpoint's weights "
            "would replace its own and the saved model would name a base it was not trained from; resume without "
            "--model_name_or_path, or start a new run"
        )
    if record is None:
        raise ValueError(
            f"--resume_from_checkpoint {resume_path}: written by a run that started from "
            f"{saved['model_name_or_path']}; this run gives no --model_name_or_path: the saved model would not name "
            f"the model it was trained from; resume with --model_name_or_path {saved['model_name_or_path']} (or the "
            "same model from another folder)"
        )
    if saved["config"].get("model_type") != config.model_type:
        differs = f"model_type {config.model_type!r}, not {saved['config'].get('model_type')!r}"
    elif fields := _config_differences(saved["config"], config):
        differs = f"another config ({fields})"
    elif saved["vocabulary"] != record["vocabulary"]:
        differs = "another tokenizer vocabulary"
    elif saved["weights"] != record["weights"]:
        differs = "other weights"
    else:
        return
    raise ValueError(
        f"--resume_from_checkpoint {resume_path}: written by a run that started from {saved['model_name_or_path']}; "
        f"this run's --model_name_or_path {record['model_name_or_path']} has {differs}: the checkpoint's weights "
        "would replace its own and the saved model would name a base it was not trained from; resume from the model "
        "the checkpoint was written from, or start a new run"
    )


def optimizer_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """The optimizer hyperparameters of a run, by flag name (`--optim`'s effective settings, defaults filled in).

    These are what a checkpoint's optimizer state restores over a resuming run's (torch's
    `Optimizer.load_state_dict` takes the saved param groups' `lr`, `weight_decay`, `betas`, ...; the schedule its
    saved `base_lrs`): a resume with other values would silently train with the checkpoint's.

    Args:
        args: a recipe's arguments (`optim`, `learning_rate`, `weight_decay`, and `adam_beta1` / `adam_beta2`
            and the `--muon_*` flags where the recipe has them).

    Returns:
        `{flag name: value}`, JSON-serializable (recorded in each checkpoint's state file).
    """
    values = {name: getattr(args, name) for name in ("optim", "learning_rate", "weight_decay", "adam_beta1",
                                                      "adam_beta2") if hasattr(args, name)}  # fmt: skip
    muon = muon_settings(args) if getattr(args, "optim", None) == "muon" else None
    if muon is not None:
        values.update({flag: getattr(muon, field) for flag, field in MUON_FLAGS.items()})
    return values


def check_resume_optimizer(resume_path: Path, args: argparse.Namespace, state_file: str = TRAINING_STATE) -> None:
    """Refuse a resume whose optimizer hyperparameters differ from those its checkpoint was written with.

    The checkpoint's optimizer state restores its own (`optimizer_arguments`), so this run's would be ignored
    (another `--optim` would not load at all; the AdamW implementations `adamw_torch` and `adamw_torch_fused` share
    their state and may change). A checkpoint of an older hfzoo does not record them and is not checked.

    Args:
        resume_path: the checkpoint folder.
        args: this run's arguments.
        state_file: the checkpoint's loop state holding `optimizer_arguments` (`training_state.json`, or
            `hfzoo.finetuning.loop.GLUE_STATE`).

    Raises:
        ValueError: one line naming each differing flag with both values.
    """

    def comparable(name: str, value: Any) -> Any:  # fused and foreach AdamW keep the same state
        return "adamw" if name == "optim" and str(value).startswith("adamw") else value

    _refuse_changed_flags(
        resume_path,
        json.loads((resume_path / state_file).read_text()).get("optimizer_arguments"),
        optimizer_arguments(args),
        "a resume restores the checkpoint's optimizer with its hyperparameters, so this run's would be ignored "
        "(resume with the checkpoint's values, or start a new run from its weights)",
        comparable,
    )


#: The flags that decide which text a pretraining run trains and validates on, and in which blocks and order
#: (`training_state.json`'s `data_arguments`).
DATA_FLAGS = ("train_file", "validation_file", "dataset_name", "dataset_config_name", "text_column_name",
              "validation_split_percentage", "block_size", "max_train_samples", "no_clean_text", "streaming",
              "seed")  # fmt: skip
#: What a pretraining resume with other data settings would do (`check_resume_arguments`).
DATA_CHANGE = (
    "the resumed run would go on at the checkpoint's position in other data, training some blocks twice and holding "
    "out text it trained on (resume with the checkpoint's data settings, or start a new run from its weights)"
)
#: The flags that decide what a pretraining run's model learns to predict: `--objective` and each objective's own
#: flags (`--mlm_probability`, `--noise_density`, ...; `training_state.json`'s `objective_arguments`).
OBJECTIVE_FLAGS = ("objective", *(name for objective in OBJECTIVES.values() for name in objective.flags))
#: What a pretraining resume with other objective settings would do (`check_resume_arguments`).
OBJECTIVE_CHANGE = (
    "the resumed run would go on from the checkpoint's step with another objective, its training and held-out "
    "losses mixing two tasks (resume with the checkpoint's objective settings, or start a new run from its weights)"
)


def recorded_arguments(args: argparse.Namespace, flags: tuple[str, ...]) -> dict[str, Any]:
    """The values of `flags` in `args`, by flag name, JSON-serializable, as a checkpoint records them.

    `--train_file` and `--validation_file` (one path or a list) are recorded by file name and size in bytes
    (`"books.jsonl.xz (43,276 bytes)"`, `"train.tsv (missing)"`), not by path: a resume may read the same files
    from another folder.

    Args:
        args: a recipe's arguments.
        flags: the flag names (`DATA_FLAGS`, `hfzoo.finetuning.loop.GLUE_DATA_FLAGS`, ...); those `args` lacks are
            left out.

    Returns:
        `{flag name: value}`.
    """

    def file(path: str) -> str:
        return f"{Path(path).name} ({os.path.getsize(path):,} bytes)" if os.path.isfile(path) else f"{path} (missing)"

    values = {name: getattr(args, name) for name in flags if hasattr(args, name)}
    for name in ("train_file", "validation_file"):
        if isinstance(values.get(name), str):
            values[name] = file(values[name])
        elif values.get(name):
            values[name] = [file(path) for path in values[name]]
    return values


def check_resume_arguments(
    resume_path: Path,
    args: argparse.Namespace,
    flags: tuple[str, ...],
    key: str,
    consequence: str,
    state_file: str = TRAINING_STATE,
) -> None:
    """Refuse a resume that changes one of `flags` from the value its checkpoint recorded under `key`.

    Pretraining checkpoints record `DATA_FLAGS` as `data_arguments`: the data position counts the blocks already
    trained on in the run's data, so with other files, another split, block size or seed the resumed run would go on
    at that position in other blocks, training some twice, skipping others, and training on documents held out
    before, so that the held-out loss no longer measures unseen text. They also record `OBJECTIVE_FLAGS` as
    `objective_arguments`: with another masking rate or span length the run would switch tasks at the checkpoint's
    step, and its loss curves would join two. Flags missing from the record (a checkpoint of an older hfzoo) are
    not checked.

    Args:
        resume_path: the checkpoint folder.
        args: this run's arguments.
        flags: the flags to compare (`recorded_arguments`).
        key: the entry of the checkpoint's state file holding them.
        consequence: what the changed run would do, and the way out, for the message.
        state_file: the checkpoint's loop state (`training_state.json`, or `hfzoo.finetuning.loop.GLUE_STATE`).

    Raises:
        ValueError: one line naming each changed flag with both values, then `consequence`.
    """
    saved = json.loads((resume_path / state_file).read_text()).get(key)
    _refuse_changed_flags(resume_path, saved, recorded_arguments(args, flags), consequence)


def _refuse_changed_flags(
    resume_path: Path,
    saved: dict[str, Any] | None,
    here: dict[str, Any],
    consequence: str,
    comparable: Callable[[str, Any], Any] = lambda name, value: value,
) -> None:
    """Raise `ValueError` naming each flag of `saved` whose value differs in `here` (by `comparable`).

    `saved` None (a checkpoint of an older hfzoo) and flags missing from `here` are not checked.
    """
    differ = [
        name for name in saved or {} if name in here and comparable(name, saved[name]) != comparable(name, here[name])
    ]
    if differ:

        def show(values: dict[str, Any]) -> str:
            return ", ".join(f"--{name} {_flag_value(values[name])}" for name in differ)

        raise ValueError(
            f"--resume_from_checkpoint {resume_path}: written with {show(saved)}; this run has {show(here)}: "
            f"{consequence}"
        )


def _flag_value(value: Any) -> str:
    """A flag's value as typed: a list space-separated, a switch `True`/`False`."""
    return " ".join(map(str, value)) if isinstance(value, list) else str(value)


#: `training_state.json`'s `distributed_type` -> the engine whose files the checkpoint holds (other values: "plain",
#: accelerate's own `model.safetensors` + `optimizer.bin`, written by one process, DDP or MULTI_CPU).
_ENGINES = {DistributedType.DEEPSPEED.value: "DeepSpeed", DistributedType.FSDP.value: "FSDP"}
#: The folder (under `--output_dir`) where a DeepSpeed checkpoint is converted to a universal one for a new world size.
UNIVERSAL_DIR = "universal_checkpoint"


def _engine(distributed_type: str | None) -> str:
    return _ENGINES.get(distributed_type or "", "plain")


def _topology(processes: int | None, distributed_type: str | None, zero_stage: int | None, global_batch) -> str:
    """E.g. `2 process(es) with DeepSpeed ZeRO-3, global batch 8` (for messages)."""
    engine = _engine(distributed_type)
    engine = f"DeepSpeed ZeRO-{zero_stage}" if engine == "DeepSpeed" and zero_stage else engine
    engine = "DDP / one process" if engine == "plain" else engine
    batch = f", global batch {global_batch}" if global_batch else ""
    return f"{processes} process(es) with {engine}{batch}"


def _run_topology(accelerator: Accelerator, args: argparse.Namespace) -> dict[str, Any]:
    """What `training_state.json` records of the run's world: processes, engine, ZeRO stage, global batch."""
    zero_stage = None
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        zero_stage = accelerator.state.deepspeed_plugin.zero_stage
    per_device = getattr(args, "per_device_train_batch_size", None)
    accumulation = getattr(args, "gradient_accumulation_steps", None)
    global_batch = per_device * accumulation * accelerator.num_processes if per_device and accumulation else None
    return {
        "num_processes": accelerator.num_processes,
        "distributed_type": accelerator.distributed_type.value,
        "zero_stage": zero_stage,
        "global_batch": global_batch,
    }


def resume_batch_hint(global_batch: int, num_processes: int, accumulation: int = 1) -> str:
    """The settings that keep a checkpoint's global batch with `num_processes` processes, or the counts that can.

    Args:
        global_batch: the checkpoint's global batch (sequences per optimizer step).
        num_processes: this run's processes.
        accumulation: this run's `--gradient_accumulation_steps` (kept in the advice when it can be).

    Returns:
        One clause: e.g. `"set --per_device_train_batch_size 2 with --gradient_accumulation_steps 2"`, or, when
        `num_processes` does not divide `global_batch`, `"no batch settings give 8 sequences over 3 processes:
        resume with 1, 2, 4 or 8 processes"`.
    """
    if global_batch % num_processes:
        counts = [n for n in range(1, global_batch + 1) if global_batch % n == 0]
        shown = ", ".join(map(str, counts[:-1])) + f" or {counts[-1]}" if len(counts) > 1 else str(counts[0])
        return (
            f"no batch settings give {global_batch} sequences over {num_processes} processes: "
            f"resume with {shown} processes"
        )
    per_process = global_batch // num_processes
    pairs = [(per_process // a, a) for a in range(1, per_process + 1) if per_process % a == 0]
    pairs.sort(key=lambda pair: (pair[1] != accumulation, pair[1]))  # this run's accumulation first
    shown = " or ".join(
        f"--per_device_train_batch_size {b} with --gradient_accumulation_steps {a}" for b, a in pairs[:2]
    )
    return f"set {shown}"


def _check_resume_topology(
    resume_path: Path, accelerator: Accelerator, args: argparse.Namespace | None = None
) -> int | None:
    """Check that a checkpoint can be resumed by this run's world; say whether it must be resharded.

    A checkpoint written by N processes resumes in a run of M processes of the same engine: DeepSpeed
    (ZeRO partitions, resharded through DeepSpeed's universal checkpoint by `load_checkpoint`),
    FSDP2 (`torch.distributed.checkpoint` folders, which reshard on load) or plain (DDP / one process:
    whole weights and optimizer state). The data position of map-style data is the step count, which maps to the
    same samples only when the global batch (processes x per-device batch x accumulation) is unchanged, so a
    changed global batch is refused whether or not the number of processes changes (a stream's position is in
    blocks: a streaming run may change its batch with the same processes), as is a changed engine or ZeRO stage
    and, when the world size changes, a streaming run (each process holds its own position in its shard of the
    stream).

    Args:
        resume_path: the checkpoint folder.
        accelerator: this run's `Accelerator`.
        args: the recipe's arguments (`per_device_train_batch_size`, `gradient_accumulation_steps`,
            `streaming`); None skips the global-batch check.

    Returns:
        The checkpoint's number of processes when it differs from this run's (the load must reshard), else None.

    Raises:
        ValueError: the combination cannot be resumed: one line naming both topologies and the way out.
    """
    state = json.loads((resume_path / TRAINING_STATE).read_text())
    saved_type, saved_processes = state.get("distributed_type"), state.get("num_processes")
    saved_batch = state.get("global_batch")
    run = _run_topology(accelerator, args) if args is not None else _run_topology(accelerator, argparse.Namespace())
    there = _topology(saved_processes, saved_type, state.get("zero_stage"), saved_batch)
    here = _topology(run["num_processes"], run["distributed_type"], run["zero_stage"], run["global_batch"])
    prefix = f"--resume_from_checkpoint {resume_path}: written by {there}; this run has {here}"
    consolidate = "consolidate it with recipes/consolidate_checkpoint.py and start from --model_name_or_path"
    if _engine(saved_type) != _engine(run["distributed_type"]):
        raise ValueError(
            f"{prefix}: a checkpoint cannot change its engine (resume with the engine that wrote it, "
            f"or {consolidate}; the optimizer state and data position are then lost)"
        )
    saved_stage = state.get("zero_stage")
    if saved_stage is not None and run["zero_stage"] is not None and saved_stage != run["zero_stage"]:
        raise ValueError(f"{prefix}: a checkpoint cannot change its ZeRO stage (use the stage that wrote it)")
    batch_changed = saved_batch is not None and run["global_batch"] is not None and saved_batch != run["global_batch"]
    if saved_processes == run["num_processes"] and not (batch_changed and not getattr(args, "streaming", False)):
        return None  # (a stream's position is in blocks, not steps: a stream may change its batch)
    if saved_batch is None:
        raise ValueError(
            f"{prefix}: it does not record its global batch (written by an older hfzoo), so it resumes only "
            f"with {saved_processes} process(es) ({consolidate})"
        )
    if batch_changed:
        raise ValueError(
            f"{prefix}: the data position is the step count, so the global batch must stay {saved_batch} "
            f"({resume_batch_hint(saved_batch, run['num_processes'], getattr(args, 'gradient_accumulation_steps', 1))})"
        )
    if getattr(args, "streaming", False):
        raise ValueError(
            f"{prefix}: a streaming run's data position is per process and cannot move to another number of "
            f"processes (resume with {saved_processes}, or {consolidate})"
        )
    return saved_processes


def enable_universal_checkpoint_loading(accelerator: Accelerator) -> None:
    """Make DeepSpeed load universal checkpoints (`"checkpoint": {"load_universal": true}`); before `prepare`.

    Used when a DeepSpeed checkpoint is resumed by another number of processes (`load_checkpoint`).
    """
    ds_config = accelerator.state.deepspeed_plugin.deepspeed_config
    ds_config.setdefault("checkpoint", {})["load_universal"] = True


def _to_universal(resume_path: Path, target: Path) -> None:
    """Write `target`: the checkpoint's accelerate files, and its DeepSpeed folder as a universal checkpoint.

    DeepSpeed's `ds_to_universal` (Lian et al. 2024, "Universal Checkpointing", arXiv:2406.18820) gathers
    each parameter's fp32 weights and optimizer moments from the ZeRO partitions into one file per parameter
    and state, which an engine of any data-parallel size partitions anew on load.
    """
    from deepspeed.checkpoint import ds_to_universal

    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    for item in resume_path.iterdir():
        if item.is_file() and item.name != MANIFEST:
            shutil.copy2(item, target / item.name)
    convert = argparse.Namespace(
        input_folder=str(resume_path / "pytorch_model"),
        output_folder=str(target / "pytorch_model"),
        num_extract_workers=1,
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=True,
    )
    ds_to_universal.main(convert)


def _unshare_step_counts(accelerator: Accelerator) -> None:
    """Give each optimizer state its own `step` tensor after a DeepSpeed universal load.

    ZeRO-3's universal load stores one `step` tensor in the state of every parameter group; AdamW increments
    its group's `step` in place, so a shared tensor would count each optimizer step once per group (and skew
    the bias correction, Kingma & Ba 2015, Algorithm 1).
    """
    for wrapped in accelerator._optimizers:
        optimizer = wrapped
        while not isinstance(optimizer, torch.optim.Optimizer) and hasattr(optimizer, "optimizer"):
            optimizer = optimizer.optimizer  # accelerate's wrapper -> DeepSpeed's ZeRO optimizer -> torch's
        seen: set[int] = set()
        for state in getattr(optimizer, "state", {}).values():
            step = state.get("step") if isinstance(state, dict) else None
            if isinstance(step, torch.Tensor):
                if id(step) in seen:
                    state["step"] = step.clone()
                seen.add(id(step))


def _rescale_schedulers(accelerator: Accelerator, saved_processes: int) -> None:
    """Map the schedulers' step counts from the checkpoint's world to this one.

    accelerate steps a scheduler once per process per optimizer step (`AcceleratedScheduler`), so after
    `s` optimizer steps its `last_epoch` is `s x processes`; the run's schedule is built for its own number.
    """
    for wrapped in accelerator._schedulers:
        scheduler = getattr(wrapped, "scheduler", wrapped)
        steps, remainder = divmod(scheduler.last_epoch, saved_processes)
        if remainder:
            raise CheckpointError(
                f"scheduler at step {scheduler.last_epoch}, not a multiple of the checkpoint's {saved_processes} "
                "processes: cannot map it to this run's"
            )
        scheduler.last_epoch = steps * accelerator.num_processes
        scheduler._step_count = scheduler.last_epoch + 1


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
    _raise_if_any_failed(accelerator, _attempt(lambda: save_accelerator_state(accelerator, run.model, tmp)), tmp, root)

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
            **_run_topology(accelerator, args),
            "optimizer_arguments": optimizer_arguments(args),
            "data_arguments": recorded_arguments(args, DATA_FLAGS),
            "objective_arguments": recorded_arguments(args, OBJECTIVE_FLAGS),
            **(extra_state or {}),
        }
        if hasattr(run, "base_model"):
            state["base_model"] = run.base_model
        (tmp / TRAINING_STATE).write_text(json.dumps(state))
        history = getattr(run, "train_history", None)
        if history is not None:  # the records so far, so that a resumed run's train_history.json keeps them
            (tmp / TRAIN_HISTORY_FILE).write_text(json.dumps(history, default=float))
        write_manifest(tmp)  # last: a folder with a manifest is complete
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)

    error = _attempt(finish) if accelerator.is_main_process else None
    _raise_if_any_failed(accelerator, error, tmp, root)
    if accelerator.is_main_process:
        prune_checkpoints(root, args.checkpoints_total_limit, step)
    accelerator.wait_for_everyone()
    return final


def prune_checkpoints(root: Path, keep: int, step: int) -> None:
    """Keep the newest `keep` complete checkpoints in `root`; delete the rest and earlier unfinished saves.

    Called by the main process once the checkpoint of step `step` is complete (`--checkpoints_total_limit`). The
    unfinished saves (`step_N.tmp`) of earlier steps were left by a run killed while saving. Folders that cannot
    be deleted are left in place.
    """
    done = _complete_checkpoints(root)
    for old in done[: max(0, len(done) - keep)]:
        shutil.rmtree(old, ignore_errors=True)
    for earlier, finished, path in _step_folders(root):
        if not finished and earlier < step:
            shutil.rmtree(path, ignore_errors=True)  # a save killed before it finished


def load_checkpoint(
    accelerator: Accelerator, path: Path, saved_processes: int | None = None, work_dir: Path | None = None
) -> dict[str, Any]:
    """Restore model, optimizer, scheduler, RNG and sampler states from a (verified) checkpoint folder.

    With `saved_processes` (from `_check_resume_topology`: the checkpoint was written by another number of
    processes), the state is resharded: a DeepSpeed checkpoint is first converted to a universal checkpoint
    under `work_dir/universal_checkpoint/` (by the main process; removed after the load), which DeepSpeed
    partitions for this world (`enable_universal_checkpoint_loading` must have been called before
    `prepare`); FSDP2's `torch.distributed.checkpoint` folders reshard on load; and the schedulers' step
    counts are mapped to this world (`_rescale_schedulers`). Random states are per process: a process
    without one in the checkpoint keeps the run's seed.

    Returns:
        Its `training_state.json` (`step`, `tokens_seen`, ...).

    Raises:
        CheckpointError: a file cannot be read (truncated or corrupt), naming the folder or the file.
    """
    source = path
    resharded = saved_processes is not None and saved_processes != accelerator.num_processes
    universal = resharded and accelerator.distributed_type == DistributedType.DEEPSPEED
    try:
        check_weight_files(path)
        if universal:
            source = Path(work_dir if work_dir is not None else path.parent) / UNIVERSAL_DIR / path.name
            error = None
            if accelerator.is_main_process:
                try:
                    _to_universal(path, source)
                except Exception as err:  # noqa: BLE001 (DeepSpeed's converter asserts): reported on every process
                    error = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"
            errors = gather_messages(accelerator, error)
            if errors:
                raise CheckpointError(
                    f"--resume_from_checkpoint {path}: cannot convert it to a universal checkpoint ({errors[0]})"
                )
        # DeepSpeed's ZeRO-3 universal load gives every parameter group the hyperparameters of the first
        # (weight decay included); the run's own groups (decay / no decay) are put back after it.
        groups = [g for opt in accelerator._optimizers for g in opt.param_groups] if universal else []
        hyperparameters = [{k: v for k, v in g.items() if k not in _LOADED_GROUP_KEYS} for g in groups]
        accelerator.load_state(str(source))
        for group, kept in zip(groups, hyperparameters, strict=True):
            group.update(kept)
        if universal:
            _unshare_step_counts(accelerator)
        if resharded:
            _rescale_schedulers(accelerator, saved_processes)
            logger.info(f"resharded {path} from {saved_processes} to {accelerator.num_processes} process(es)")
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
    finally:
        if universal:
            accelerator.wait_for_everyone()
            if accelerator.is_main_process:
                shutil.rmtree(source.parent, ignore_errors=True)
