"""The study a folder holds (`study.json`): its settings and the fingerprints of their data, compared on reuse.

A folder continues only the study it holds (`prepare_output_dir`): the settings must match, and a path
setting matches by the data it points to (sizes and sha256 digests, `data_fingerprints`), however it is
spelled, so a study continues from a moved folder or with moved data.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

from ..integrity import file_sha256
from ..models.presets import PRESETS
from .protocol import SELECTION_KEYS
from .settings import PATH_KEYS, StudySettings, _glue_files, resolve_paths
from .storage import STUDY_FILE, _read_json, _write_json


def _saved_settings(settings: StudySettings) -> dict[str, Any]:
    values = dataclasses.asdict(settings)
    return {k: v for k, v in values.items() if k not in SELECTION_KEYS}


#: Files of a tokenizer folder its fingerprint leaves out: model weights, which the tokenizer does not read.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack")


def _fingerprint(path: Path, files: list[str] | None = None) -> dict[str, Any] | None:
    """A file's `{"size", "sha256"}`; a folder's `{"files": {relative path: that or None}}`; None if absent.

    A folder's `files` default to the files directly in it, weights aside.
    """
    if path.is_file():
        return {"size": path.stat().st_size, "sha256": file_sha256(path)}
    if not path.is_dir():
        return None
    if files is None:
        files = sorted(f.name for f in path.iterdir() if f.is_file() and f.suffix not in _WEIGHT_SUFFIXES)
    return {"files": {name: _fingerprint(path / name) for name in files}}


def data_fingerprints(settings: StudySettings) -> dict[str, Any]:
    """What each path setting points to, so that a study folder recognises its data under another path.

    Per key of `PATH_KEYS`: None when there is no local data (null, a preset, a hub name), else the
    `_fingerprint` of the data the study reads: each file of a list; of `glue_data_dir` the study's tasks'
    training and dev files; of a `config_name` folder its `config.json`; a file or tokenizer folder whole.
    """
    prints: dict[str, Any] = {}
    for key in PATH_KEYS:
        value = getattr(settings, key)
        if value is None or key == "config_name" and value in PRESETS:
            prints[key] = None
        elif isinstance(value, list):
            prints[key] = [_fingerprint(Path(v)) for v in value]
        elif key == "glue_data_dir":
            files = [f.relative_to(value).as_posix() for t in settings.glue_tasks for f in _glue_files(settings, t)]
            prints[key] = _fingerprint(Path(value), files)
        else:
            prints[key] = _fingerprint(Path(value), ["config.json"] if key == "config_name" else None)
    return prints


def _data_difference(there: Any, here: Any) -> str:
    """What differs between two fingerprints (`_fingerprint`, or lists of them), in a few words."""
    if there is None or here is None:
        return "absent there" if there is None else "absent here"
    if isinstance(there, list) or isinstance(here, list):
        if not (isinstance(there, list) and isinstance(here, list)) or len(there) != len(here):
            count = [len(v) if isinstance(v, list) else 1 for v in (there, here)]
            return f"{count[0]} file(s) there, {count[1]} here"
        index = next(i for i, (a, b) in enumerate(zip(there, here)) if a != b)
        return f"file {index + 1}: {_data_difference(there[index], here[index])}"
    if "files" in there and "files" in here:
        a, b = there["files"], here["files"]
        if set(a) != set(b):
            return f"files only there: {sorted(set(a) - set(b))}, only here: {sorted(set(b) - set(a))}"
        name = next(n for n in sorted(a) if a[n] != b[n])
        return f"{name}: {_data_difference(a[name], b[name])}"
    if "files" in there or "files" in here:
        return "a folder there, a file here" if "files" in there else "a file there, a folder here"
    if there["size"] != here["size"]:
        return f"size {there['size']} bytes there, {here['size']} here"
    return f"same size ({here['size']} bytes) but sha256 {there['sha256'][:12]}... there, {here['sha256'][:12]}... here"


def _study_differences(saved: dict[str, Any], settings: StudySettings, data: dict[str, Any]) -> tuple[list, list]:
    """`(settings, data)`: one line per setting, and per path setting whose data, that differs from `saved`.

    A path setting compares by its data (`data_fingerprints`), however it is spelled; where a side has no
    local data (null, a preset, a hub name, an absent path), by its value first. A `study.json` without
    `data` (written before data was recorded) holds absolute paths: they compare with the resolved ones.
    """
    old, current = saved.get("settings", {}), _saved_settings(settings)
    old = {"family": "encoder-decoder", **old}  # recorded before studies had families: the encoder-decoder
    old_data = saved.get("data")
    if old_data is None:
        current.update({k: v for k, v in _saved_settings(resolve_paths(settings)).items() if k in PATH_KEYS})
    other_settings, other_data = [], []
    for key in sorted(set(old) | set(current)):
        shown = f"{key}: {old.get(key)!r} there, {current.get(key)!r} here"
        same_value = old.get(key) == current.get(key)
        if old_data is None or key not in PATH_KEYS:
            if not same_value:
                other_settings.append(shown)
            continue
        there, here = old_data.get(key), data[key]
        if None in (there, here) and not same_value:
            other_settings.append(shown)  # no local data on one side: the values tell
        elif there != here:
            other_data.append(f"{shown} ({_data_difference(there, here)})")
    return other_settings, other_data


def prepare_output_dir(output_dir: Path, settings: StudySettings, overwrite: bool) -> None:
    """Record the settings and their data in `study.json`, or refuse a folder holding another study.

    The variants and seeds are not part of the comparison: one folder can be filled a subset at a time.
    Paths are recorded as given, and with them the data they point to (`data_fingerprints`): a path
    spelled otherwise (the data or the folder moved, another working directory) is the same study if its
    data is the same; the record is then updated to the new paths.

    Raises:
        ValueError: the folder's study differs (the message names the first differing keys, and for a path
            setting what differs in its data), unless `overwrite`, which deletes the folder's contents first.
    """
    saved_file = output_dir / STUDY_FILE
    record = {"settings": _saved_settings(settings), "data": data_fingerprints(settings)}
    saved = _read_json(saved_file)
    if saved is None and output_dir.is_dir() and any(output_dir.iterdir()) and not overwrite:
        if (output_dir / "runs").exists() or saved_file.exists():
            raise ValueError(
                f"--output_dir {output_dir}: holds study runs without a readable {STUDY_FILE}; "
                "use --overwrite_output_dir to start again"
            )
    other_settings, other_data = _study_differences(saved, settings, record["data"]) if saved else ([], [])
    if (other_settings or other_data) and not overwrite:
        shown = "; ".join((other_settings + other_data)[:3])
        raise ValueError(
            f"--output_dir {output_dir} holds a study with other {'settings' if other_settings else 'data'} "
            f"({shown}); use --overwrite_output_dir to replace it, or another --output_dir"
        )
    if other_settings or other_data:
        for child in output_dir.iterdir():
            if child.name.startswith(".study"):
                continue
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    output_dir.mkdir(parents=True, exist_ok=True)
    if saved != record:
        _write_json(saved_file, record)
