"""File integrity checks: sha256 digests, and weight files checked before they are loaded.

`check_weight_files(folder)` reads only the headers of a checkpoint folder's weight files
(`*.safetensors`, `pytorch_model*.bin`) and compares the sizes they declare with the sizes on disk, so
that a truncated or corrupt file is reported by name before `from_pretrained` or a resume fails on it
with a message that names no file. `file_sha256` is the digest the training checkpoints' manifests
record (`hfzoo.training.checkpointing`).

Standard library only: `hfzoo.modeling_utils` imports this module, and a `trust_remote_code` export
copies it next to the model files.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import zipfile
from pathlib import Path

#: Bytes read at a time when hashing a file.
_CHUNK = 1 << 22


class WeightFileError(OSError, ValueError):
    """A weight or checkpoint file is truncated or corrupt (the message names the file and what is wrong).

    An `OSError`, as transformers' `from_pretrained` raises for unusable files, and a `ValueError`, as the
    recipes report bad input.
    """


def file_sha256(path: str | os.PathLike) -> str:
    """Return the sha256 digest of a file's bytes (hex string), read in 4 MiB chunks.

    Raises:
        OSError: the file cannot be read.
    """
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def check_safetensors_file(path: str | os.PathLike) -> None:
    """Check that a `.safetensors` file is complete: a readable header whose tensors end where the file ends.

    The format (huggingface/safetensors): an 8-byte little-endian header length N, N bytes of JSON mapping
    each tensor name to its `data_offsets` `[begin, end)` in the byte buffer that follows; the file is
    `8 + N + max(end)` bytes long. Only the header is read.

    Raises:
        WeightFileError: the file is shorter or longer than its header says, or the header is unreadable.
    """
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise WeightFileError(f"{path}: truncated ({size} bytes, shorter than a safetensors header)")
        (header_size,) = struct.unpack("<Q", head)
        if 8 + header_size > size:
            raise WeightFileError(
                f"{path}: truncated or corrupt ({size} bytes, but its header alone claims {header_size} bytes)"
            )
        try:
            header = json.loads(f.read(header_size))
            end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError) as err:
            raise WeightFileError(f"{path}: corrupt (unreadable safetensors header: {err})") from None
    expected = 8 + header_size + end
    if size < expected:
        raise WeightFileError(f"{path}: truncated ({size} bytes, its header describes {expected})")
    if size > expected:
        raise WeightFileError(f"{path}: corrupt ({size} bytes, its header describes {expected})")


def check_zip_file(path: str | os.PathLike) -> None:
    """Check that a `torch.save` file (a zip archive: `pytorch_model.bin`, `optimizer.bin`) has its directory.

    A truncated archive loses its central directory, which sits at the end of the file; only the
    directory is read, not the members.

    Raises:
        WeightFileError: not a readable zip archive (truncated or corrupt).
    """
    try:
        with zipfile.ZipFile(path) as archive:
            archive.infolist()
    except (zipfile.BadZipFile, EOFError, ValueError) as err:
        size = Path(path).stat().st_size
        raise WeightFileError(f"{path}: truncated or corrupt ({size} bytes; not a complete archive: {err})") from None


def check_weight_files(folder: str | os.PathLike, subfolder: str = "") -> list[Path]:
    """Check every weight file of a model folder before it is loaded (headers and sizes only).

    Checks `*.safetensors` (see `check_safetensors_file`), and `*.bin` / `*.pt` files saved by `torch.save`
    in its zip format (see `check_zip_file`); files of other formats are left to their loaders. A
    sharded checkpoint's index (`*.index.json`) must name only files that exist.

    Args:
        folder: a `save_pretrained` folder (or a training checkpoint folder).
        subfolder: a subfolder of `folder` holding the weights (`from_pretrained`'s `subfolder`).

    Returns:
        The files checked.

    Raises:
        WeightFileError: a file is truncated or corrupt, or a shard named by the index is missing.
    """
    root = Path(folder) / subfolder
    checked = []
    for index in sorted(root.glob("*.index.json")):
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise WeightFileError(f"{index}: corrupt (unreadable index: {err})") from None
        missing = sorted(s for s in shards if not (root / s).is_file())
        if missing:
            raise WeightFileError(f"{index}: names shard(s) {missing} that are missing from {root}")
    for path in sorted(root.iterdir()) if root.is_dir() else []:
        if not path.is_file():
            continue
        if path.suffix == ".safetensors":
            check_safetensors_file(path)
        elif path.suffix in (".bin", ".pt") and _starts_like_zip(path):
            check_zip_file(path)
        else:
            continue
        checked.append(path)
    return checked


def _starts_like_zip(path: Path) -> bool:
    """Whether a file begins with a zip local-file signature (torch.save's default format since torch 1.6)."""
    with open(path, "rb") as f:
        return f.read(4) == b"PK\x03\x04"
