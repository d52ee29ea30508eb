"""Output paths of the command lines: checked before any work, and no empty folder left behind by a refusal.

`check_output_folder` / `check_output_file` create a missing folder and check that a file can be written
there (a one-line `ValueError` naming the argument, the path and the reason otherwise);
`removed_if_refused` removes the folders a command created when it then refuses its input, so that a
refused command leaves nothing on disk; `check_output_is_not_source` keeps a command from writing over the
checkpoint it reads; `replaced_atomically` (and `write_text_atomic`, `write_json_atomic` through it)
replaces a file so that a reader never sees it half written.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def missing_folders(path: str | os.PathLike) -> list[Path]:
    """`path` and those of its parents that do not exist yet, innermost first (what creating it would create)."""
    missing = []
    folder = Path(path).expanduser().absolute()
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def remove_empty_folders(folders: list[Path]) -> None:
    """Remove each of `folders` (innermost first) that holds nothing but empty folders, those included.

    Args:
        folders: folders this process created (`missing_folders` before creating them); a file anywhere below
            one keeps it and the folders above that file.
    """
    for folder in folders:
        if not folder.is_dir():
            continue
        for below, _, _ in sorted(os.walk(folder), key=lambda entry: -len(Path(entry[0]).parts)):
            with contextlib.suppress(OSError):  # not empty, already gone, or not ours to remove
                Path(below).rmdir()


@contextlib.contextmanager
def removed_if_refused(*paths: str | os.PathLike | None) -> Iterator[None]:
    """Remove the folders of `paths` created inside the block, if the block raises and they are still empty.

    Args:
        paths: output folders (or a file's folder) the block may create; None is skipped.
    """
    created = [folder for path in paths if path is not None for folder in missing_folders(path)]
    try:
        yield
    except BaseException:
        remove_empty_folders(created)
        raise


def check_output_folder(path: str | os.PathLike, argument: str = "--output_dir") -> Path:
    """Create the folder `path` (and its parents) and check that a file can be written in it.

    Args:
        path: the folder.
        argument: the command-line argument, for messages.

    Returns:
        The folder as a `Path`.

    Raises:
        ValueError: the path (or a parent) is an existing file, or the folder cannot be created or written to
            (one line naming the argument, the path and the OS error).
    """
    folder = Path(path).expanduser()
    for parent in [folder, *folder.parents]:
        if parent.exists() and not parent.is_dir():
            which = "is" if parent == folder else f"its folder {parent} is"
            raise ValueError(f"{argument} {folder}: {which} an existing file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write_check_"):
            pass
    except OSError as err:
        raise ValueError(f"{argument} {folder}: cannot write there ({err.strerror or err})") from None
    return folder


def check_output_file(path: str | os.PathLike, argument: str = "--output_file") -> Path:
    """Create the folder of the file `path` and check that the file can be written there.

    Args:
        path: the file (it may exist: it is replaced).
        argument: the command-line argument, for messages.

    Returns:
        The file as a `Path`.

    Raises:
        ValueError: the path is an existing folder, a parent is an existing file, or the folder cannot be
            created or written to (one line naming the argument, the path and the reason).
    """
    file = Path(path).expanduser()
    if file.is_dir():
        raise ValueError(f"{argument} {file}: is an existing folder, not a file")
    check_output_folder(file.parent, argument=f"{argument} {file}: its folder")
    if file.exists() and not os.access(file, os.W_OK):
        raise ValueError(f"{argument} {file}: cannot write there (the file is read-only)")
    return file


def check_output_is_not_source(output_dir: str | os.PathLike, source: str | os.PathLike | None, writes: str) -> None:
    """Refuse an `--output_dir` that is the local checkpoint folder `--model_name_or_path` names.

    Args:
        output_dir: the output folder.
        source: `--model_name_or_path` (a folder or a hub id; None: none given).
        writes: what the command writes there, for the message (`"the finetuned model or adapter"`).

    Raises:
        ValueError: one line naming both arguments and what would be lost.
    """
    if source is None or not Path(source).expanduser().is_dir():
        return
    if Path(output_dir).expanduser().resolve() == Path(source).expanduser().resolve():
        raise ValueError(
            f"--output_dir {output_dir} is the --model_name_or_path folder: {writes} would be written over the "
            "checkpoint it starts from; give another --output_dir"
        )


@contextlib.contextmanager
def replaced_atomically(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary file beside `path` to write in the block; renamed over `path` when the block ends without error.

    The temporary file is `<path>.<pid>.tmp`, one per process, so that two processes writing the same file never
    rename each other's half-written one; a block that raises leaves `path` as it was and removes the temporary
    file. A process killed in the block leaves the previous `path` (and at worst a stray `.tmp` file), never a torn
    one.

    Args:
        path: the file to replace (its folder must exist).

    Yields:
        The temporary file's `Path` (not created: the block writes it).

    Raises:
        OSError: the rename fails.
    """
    path = Path(path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)  # only after an error: a renamed file is gone


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically (`replaced_atomically`): a reader never sees it half written.

    Raises:
        OSError: the file cannot be written.
    """
    with replaced_atomically(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: str | os.PathLike, value: Any, **dumps_kwargs: Any) -> None:
    """Write `value` as JSON, indented by 2 and ending with a newline, to `path` atomically (`write_text_atomic`).

    Args:
        path: the file.
        value: what `json.dumps` takes.
        **dumps_kwargs: further `json.dumps` arguments (`sort_keys=True`, `default=float`, ...).

    Raises:
        OSError: the file cannot be written. TypeError: a value JSON cannot hold (without a `default`).
    """
    write_text_atomic(path, json.dumps(value, indent=2, **dumps_kwargs) + "\n")
