"""Loading raw text corpora: local files (plain text, JSON lines, parquet, compressed or not) or hub datasets.

Everything goes through `datasets.load_dataset`, which handles the formats, the compression
(`.xz`, `.gz`, `.bz2`, `.zst`, inferred from the file name) and streaming. This module adds what
`datasets` does not: the choice of builder from file names, checks that fail early with a message
naming the bad file or column, and text cleaning for Project Gutenberg books (licence boilerplate,
CRLF line endings).
"""

from __future__ import annotations

import codecs
import lzma
import os
import re
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import datasets
import fsspec
import pandas
import pyarrow
from datasets.exceptions import DatasetGenerationError

#: Suffixes `datasets` decompresses on the fly (fsspec compression inferred from the file name).
COMPRESSION_SUFFIXES = (".xz", ".gz", ".bz2", ".zst", ".lz4")

#: Bytes read at a time when checking a file's encoding.
_SCAN_CHUNK = 1 << 22
#: Bytes checked per file when the data is streamed (the whole file is checked otherwise).
STREAMING_SCAN_BYTES = 1 << 20

#: File suffix (after removing a compression suffix) -> `datasets` builder name.
BUILDER_BY_SUFFIX = {
    ".json": "json",
    ".jsonl": "json",
    ".parquet": "parquet",
    ".csv": "csv",
    ".txt": "text",
    ".text": "text",
    ".tokens": "text",
    ".raw": "text",
}

# Project Gutenberg marks the start and end of the book proper with lines such as
# "*** START OF THIS PROJECT GUTENBERG EBOOK MOBY DICK ***" (older files: "***START OF THE PROJECT ...").
# Files from the early 1990s instead close their licence header with a "*END*THE SMALL PRINT! ..." line
# (the Shakespeare editions with a second "SMALL PRINT! FOR __ COMPLETE SHAKESPEARE" line) and end with
# "End of (this) (Project Gutenberg) Etext ...".
_PG_START = re.compile(r"^\s*\*{3}\s*START OF (?:THE|THIS) PROJECT GUTENBERG[^\n]*$", re.MULTILINE | re.IGNORECASE)
_PG_SMALL_PRINT = re.compile(r"^[^\n]*SMALL PRINT![^\n]*$", re.MULTILINE | re.IGNORECASE)
_PG_END = re.compile(
    r"^\s*(?:\*{3}\s*END OF (?:THE|THIS) PROJECT GUTENBERG|End of (?:the |this )?Project Gutenberg"
    r"|End of (?:the |this )?E-?text of)[^\n]*$",
    re.MULTILINE | re.IGNORECASE,
)


def _body_start(text: str) -> int:
    """Return the offset just after Project Gutenberg's header, or 0 when there is no header marker."""
    start = _PG_START.search(text)
    if start is not None:
        return start.end()
    # Old files: the header ends with the last "SMALL PRINT!" line of the first half of the file.
    small_print = [m for m in _PG_SMALL_PRINT.finditer(text, 0, len(text) // 2)]
    return small_print[-1].end() if small_print else 0


def clean_text(text: str) -> str:
    r"""Normalise line endings and remove Project Gutenberg boilerplate.

    `\r\n` and lone `\r` become `\n`. When the text carries Project Gutenberg's start marker
    (`*** START OF THE/THIS PROJECT GUTENBERG ...`, or in old files the last `SMALL PRINT!` line of
    the header), everything up to and including that line is dropped; when it carries an end
    marker (`*** END OF ...`, `End of the Project Gutenberg ...`, `End of this Etext of ...`),
    everything from the first such line after the start is dropped, and the remaining body is
    stripped of surrounding whitespace. Text without markers is only newline-normalised (a line
    of a plain text file keeps its `\n`), so the function is safe on any corpus.

    Args:
        text: one document or line (str).

    Returns:
        The cleaned text (str).
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    begin = _body_start(text)
    end = _PG_END.search(text, begin)
    if begin == 0 and end is None:
        return text
    return text[begin : end.start() if end else len(text)].strip()


def infer_builder(path: str | os.PathLike) -> str:
    """Choose the `datasets` builder for a local file from its name.

    Args:
        path: a file name such as `books.jsonl.xz`, `wiki.valid.tokens` or `part-0.parquet`.

    Returns:
        One of `"json"`, `"parquet"`, `"csv"`, `"text"`. Unknown suffixes are read as plain text.
    """
    name = Path(path).name.lower()
    for suffix in COMPRESSION_SUFFIXES:
        if name.endswith(suffix):
            name = name[: -len(suffix)]
            break
    return BUILDER_BY_SUFFIX.get(Path(name).suffix, "text")


def check_text_encoding(path: str | os.PathLike, argument: str = "--train_file", limit: int | None = None) -> bool:
    """Check that a (possibly compressed) text file is valid UTF-8, reading it in 4 MiB chunks.

    Compressed files (`COMPRESSION_SUFFIXES`) are decompressed on the fly, as `datasets` reads them; the
    byte offset in an error is then an offset in the decompressed text.

    Args:
        path: the file.
        argument: the command-line argument the file came from, used in error messages.
        limit: check only the first `limit` (decompressed) bytes (None: the whole file).

    Returns:
        Whether the file holds anything other than whitespace (in the part checked).

    Raises:
        ValueError: invalid UTF-8 (the message names the file, the byte and its offset), or compressed
            data that is truncated or corrupt.
    """
    offset, pending, has_text = 0, b"", False
    try:
        with fsspec.open(str(path), "rb", compression="infer") as f:
            while limit is None or offset < limit:
                chunk = f.read(_SCAN_CHUNK)
                data = pending + chunk
                try:
                    _, consumed = codecs.utf_8_decode(data, "strict", not chunk)
                except UnicodeDecodeError as err:
                    where = "decompressed byte" if infer_compression(path) else "byte"
                    raise ValueError(
                        f"{argument} {path}: not valid UTF-8 text: {where} {offset + err.start} is "
                        f"0x{data[err.start]:02x} ({err.reason}); convert the file to UTF-8"
                    ) from None
                has_text = has_text or not data[:consumed].isspace() and consumed > 0
                offset, pending = offset + consumed, data[consumed:]
                if not chunk:
                    break
    except (EOFError, lzma.LZMAError, zlib.error, OSError) as err:
        if isinstance(err, (FileNotFoundError, PermissionError, IsADirectoryError)):
            raise
        raise ValueError(f"{argument} {path}: truncated or corrupt compressed data ({err})") from None
    return has_text


def infer_compression(path: str | os.PathLike) -> str | None:
    """The compression suffix of a file name (`.xz`, `.gz`, ...), or None."""
    name = Path(path).name.lower()
    return next((suffix for suffix in COMPRESSION_SUFFIXES if name.endswith(suffix)), None)


def check_data_files(
    files: Sequence[str | os.PathLike], argument: str = "--train_file", check_encoding: bool | int = True
) -> tuple[str, list[str]]:
    """Check local data files before anything reads them: existence, type, readability, size, format, encoding.

    Text, JSON lines and CSV files (compressed or not) must be valid UTF-8 (`check_text_encoding`); a
    plain text file must hold more than whitespace. Parquet files are binary and left to `datasets`.

    Args:
        files: paths (absolute, or relative to the current working directory).
        argument: the command-line argument the files came from, used in error messages.
        check_encoding: check the whole of each file (True), only its first N bytes (an int, e.g.
            `STREAMING_SCAN_BYTES` for streamed data), or not at all (False).

    Returns:
        `(builder, absolute_paths)`: the `datasets` builder name and the resolved paths.

    Raises:
        FileNotFoundError: a file does not exist.
        ValueError: no file given, a directory given as a file, an unreadable or empty (0 bytes) file,
            files mixing formats, invalid UTF-8 (naming the byte offset), or a text file of whitespace only.
    """
    if not files:
        raise ValueError(f"{argument}: no file given")
    resolved, builders = [], set()
    for file in files:
        path = Path(file).expanduser()
        if path.is_dir():
            raise ValueError(f"{argument} {file!s}: is a directory, not a file (give the files in it)")
        if not path.is_file():
            raise FileNotFoundError(f"{argument} {file!s}: no such file")
        try:
            with open(path, "rb") as f:
                f.read(1)
        except OSError as err:
            raise ValueError(f"{argument} {file!s}: cannot be read ({err.strerror or err})") from None
        if path.stat().st_size == 0:
            raise ValueError(f"{argument} {file!s}: the file is empty")
        resolved.append(str(path.resolve()))
        builders.add(infer_builder(path))
    if len(builders) > 1:
        raise ValueError(f"{argument}: files mix formats {sorted(builders)}; give files of one format")
    builder = builders.pop()
    if check_encoding is not False and builder != "parquet":
        limit = None if check_encoding is True else int(check_encoding)
        for file in files:
            has_text = check_text_encoding(Path(file).expanduser(), argument, limit)
            if builder == "text" and not has_text and limit is None:
                raise ValueError(f"{argument} {file!s}: no text (the file holds only whitespace)")
    return builder, resolved


#: What each `datasets` builder reads, for messages.
FORMAT_NAMES = {"json": "JSON lines", "csv": "CSV", "parquet": "Parquet", "text": "text"}

#: What reading data raises where a record cannot be parsed: pyarrow's errors (a line that is not JSON, a damaged
#: Parquet file), pandas' CSV parser, bytes that are not UTF-8 (past the part of a stream checked before reading),
#: and `datasets`' wrapper of them.
READ_ERRORS = (pyarrow.ArrowException, pandas.errors.ParserError, UnicodeDecodeError, DatasetGenerationError)


class DataReadError(ValueError):
    """Data that cannot be parsed, in one line naming where it came from (`unreadable_data`)."""


def unreadable_data(err: BaseException, source: str, builder: str | None = None) -> DataReadError:
    """The one-line error for data that `datasets` (pyarrow, pandas) cannot parse.

    Args:
        err: what reading raised (`datasets`' `DatasetGenerationError` wraps the parser's error, whose first line
            is kept: `JSON parse error: Missing a name for object member. in row 50`).
        source: the data, as the message names it (`--train_file books.jsonl`).
        builder: the `datasets` builder (`json`, `csv`, ...), None if unknown.

    Returns:
        A `DataReadError` (a ValueError) to raise.
    """
    cause = err
    while isinstance(cause, DatasetGenerationError) and cause.__cause__ is not None:
        cause = cause.__cause__
    text = str(cause).strip().splitlines()
    reason = f"{type(cause).__name__}: {text[0]}" if text else type(cause).__name__
    as_format = f" as {FORMAT_NAMES.get(builder, builder)}" if builder else ""
    return DataReadError(f"{source}: cannot be read{as_format} ({reason})")


def load_local_files(
    files: Sequence[str | os.PathLike],
    argument: str = "--train_file",
    streaming: bool = False,
    cache_dir: str | None = None,
    sample_by: str = "line",
    check: bool = True,
) -> datasets.Dataset | datasets.IterableDataset:
    """Load local files as one `datasets` split.

    Plain text files are read with line breaks kept (as transformers' `run_clm.py` does with
    `keep_linebreaks=True`), one row per line (`sample_by="line"`, bounded memory when streaming)
    or one row per file (`sample_by="document"`: a text file is one document, which is what
    document-level packing with separator tokens needs). Other formats give one row per record.

    Args:
        files: local paths, all of one format (see `infer_builder`).
        argument: the command-line argument the files came from, used in error messages.
        streaming: return an `IterableDataset` that reads lazily (bounded memory).
        cache_dir: `datasets` cache folder.
        sample_by: for plain text files, `"line"`, `"paragraph"` or `"document"`.
        check: run `check_data_files` first (False: the caller already did).

    Returns:
        A `datasets.Dataset` (or `IterableDataset` when streaming) with the files' columns.

    Raises:
        FileNotFoundError, ValueError: see `check_data_files`.
        DataReadError: a record the format's parser refuses (a line that is not JSON), naming the files; a stream
            raises it only where it is read (`check_text_column`, `parsed_rows`).
    """
    if check:
        builder, paths = check_data_files(files, argument, True if not streaming else STREAMING_SCAN_BYTES)
    else:
        builder, paths = infer_builder(files[0]), [str(Path(f).expanduser().resolve()) for f in files]
    kwargs = {"keep_linebreaks": True, "sample_by": sample_by} if builder == "text" else {}
    try:
        return datasets.load_dataset(
            builder, data_files={"data": paths}, split="data", streaming=streaming, cache_dir=cache_dir, **kwargs
        )
    except READ_ERRORS as err:  # a record the format's parser refuses (a line that is not JSON)
        named = str(files[0]) if len(files) == 1 else [str(f) for f in files]
        raise unreadable_data(err, f"{argument} {named}", builder) from None


def column_names(dataset: datasets.Dataset | datasets.IterableDataset) -> list[str]:
    """Return the column names of a (possibly streaming) dataset, peeking at one row if needed.

    Args:
        dataset: a `Dataset` or `IterableDataset`.

    Returns:
        The list of column names (empty for an empty streaming dataset).
    """
    if dataset.column_names is not None:
        return list(dataset.column_names)
    for row in dataset.take(1):
        return list(row)
    return []


def check_text_column(dataset: datasets.Dataset | datasets.IterableDataset, text_column_name: str, source: str) -> None:
    """Raise a clear error when `text_column_name` is not a column of `dataset`, or holds no strings.

    Args:
        dataset: the loaded split.
        text_column_name: the column expected to hold the text.
        source: what the data came from (file names or dataset name), for the message.

    Raises:
        ValueError: the column does not exist (the message lists the columns that do), or its type is not a string
            (numbers, lists of strings: the tokenizer and the text cleaning take one string per document), naming
            its type (the dataset's feature, else the first row's value's Python type); or a stream's first
            records cannot be parsed (`unreadable_data`).
    """
    try:  # a stream is read here for the first time
        names = column_names(dataset)
        features = dataset.features
        if text_column_name in names and (features is None or text_column_name not in features):
            first = next(iter(dataset.take(1)))[text_column_name]  # a stream whose features are unknown until read
    except READ_ERRORS as err:
        raise unreadable_data(err, source) from None
    if text_column_name not in names:
        raise ValueError(
            f"--text_column_name {text_column_name!r} is not a column of {source}; its columns are {names}"
        )
    if features is not None and text_column_name in features:
        feature = features[text_column_name]
        if isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string", "null"):
            return
        kind = str(feature)
    else:
        if first is None or isinstance(first, str):
            return
        kind = type(first).__name__
    raise ValueError(
        f"--text_column_name {text_column_name!r}: the column of {source} holds {kind} values, not text (one string "
        "per document)"
    )


def check_distinct_files(
    train_file: Sequence[str | os.PathLike] | None,
    validation_file: Sequence[str | os.PathLike] | None = None,
    arguments: tuple[str, str] = ("--train_file", "--validation_file"),
) -> None:
    """Refuse a data file given twice, however written (`a.jsonl`, `./a.jsonl`, an absolute path).

    Nothing is read: the paths are compared resolved.

    Args:
        train_file: the training files.
        validation_file: the validation files.
        arguments: the names of the two, for messages (the study's keys are `train_file` / `validation_file`).

    Raises:
        ValueError: a file twice in `train_file` or in `validation_file` (its rows would count twice; split
            off for validation, one copy would be trained on), or a validation file that is one of the training
            files (the validation metrics would be measured on text the model trains on).
    """
    seen: list[dict[Path, str]] = [{}, {}]
    for files, argument, given in zip((train_file, validation_file), arguments, seen):
        for file in files or []:
            path = Path(file).expanduser().resolve()
            if path in given:
                raise ValueError(f"{argument} {file!s}: given twice (as {given[path]} too); give each file once")
            given[path] = str(file)
    trained, held_out = seen
    for path, file in held_out.items():
        if path in trained:
            raise ValueError(
                f"{arguments[1]} {file}: is also {arguments[0]} {trained[path]}; "
                "the validation metrics would be measured on text the model trains on"
            )


def check_input_files(
    train_file: Sequence[str] | None, validation_file: Sequence[str] | None = None, streaming: bool = False
) -> None:
    """Check every local training and validation file (`check_data_files`) before any of them is loaded.

    Streamed data is checked on its first `STREAMING_SCAN_BYTES` bytes per file, other data in full. The
    command lines also refuse a file given twice (`check_distinct_files`); this function does not, so that a
    program may load one file as both splits.

    Raises:
        FileNotFoundError, ValueError: see `check_data_files`.
    """
    check_encoding = STREAMING_SCAN_BYTES if streaming else True
    for files, argument in ((train_file, "--train_file"), (validation_file, "--validation_file")):
        if files:
            check_data_files(files, argument, check_encoding)


def load_raw_datasets(
    train_file: Sequence[str] | None = None,
    validation_file: Sequence[str] | None = None,
    dataset_name: str | None = None,
    dataset_config_name: str | None = None,
    text_column_name: str = "text",
    validation_split_percentage: int = 5,
    streaming: bool = False,
    cache_dir: str | None = None,
    sample_by: str = "document",
    check_files: bool = True,
) -> datasets.DatasetDict | datasets.IterableDatasetDict:
    """Load `train` and `validation` splits from local files or a hub dataset.

    Mirrors transformers' `run_clm_no_trainer.py`: local files when `train_file` is given, else
    `datasets.load_dataset(dataset_name, dataset_config_name)`; when no validation data is given,
    the first `validation_split_percentage` % of the training rows (documents) become validation.

    Args:
        train_file: local training files (text / JSON lines / parquet / csv, optionally compressed).
        validation_file: local validation files, same rules.
        dataset_name: a hub dataset name (used when `train_file` is not given).
        dataset_config_name: the hub dataset's configuration.
        text_column_name: the column holding the text; checked on every split.
        validation_split_percentage: percentage of training documents held out when there is no
            validation data (integer in [1, 50]).
        streaming: load lazily (`IterableDatasetDict`); without validation data, every k-th training
            document (k = `round(100 / validation_split_percentage)`) is held out instead of the first ones.
        cache_dir: `datasets` cache folder.
        sample_by: how plain text files are split into rows (see `load_local_files`); the default
            `"document"` makes each text file one document.
        check_files: check the local files first (`check_input_files`; False: the caller did).

    Returns:
        A `DatasetDict` (or `IterableDatasetDict`) with `train` and `validation` splits.

    Raises:
        ValueError: neither files nor a dataset name, a missing text column, a bad local file (see
            `check_data_files`; all files are checked before any is loaded), or a bad percentage.
        FileNotFoundError: a local file does not exist.
    """
    if not train_file and not dataset_name:
        raise ValueError("give --train_file (local files) or --dataset_name (a hub dataset)")
    if not 1 <= validation_split_percentage <= 50:
        raise ValueError(f"--validation_split_percentage must be in [1, 50], got {validation_split_percentage}")
    container = datasets.IterableDatasetDict if streaming else datasets.DatasetDict
    if check_files:
        check_input_files(train_file, validation_file, streaming)
    if train_file:
        raw = container(train=load_local_files(train_file, "--train_file", streaming, cache_dir, sample_by, False))
        sources = {"train": f"--train_file {list(train_file)}"}
        if validation_file:
            raw["validation"] = load_local_files(
                validation_file, "--validation_file", streaming, cache_dir, sample_by, False
            )
            sources["validation"] = f"--validation_file {list(validation_file)}"
    else:
        raw = datasets.load_dataset(dataset_name, dataset_config_name, streaming=streaming, cache_dir=cache_dir)
        if "train" not in raw:
            raise ValueError(f"--dataset_name {dataset_name}: no 'train' split (splits: {list(raw)})")
        raw = container({k: v for k, v in raw.items() if k in ("train", "validation")})
        sources = {split: f"--dataset_name {dataset_name}" for split in raw}
        if validation_file:
            raw["validation"] = load_local_files(
                validation_file, "--validation_file", streaming, cache_dir, sample_by, False
            )
            sources["validation"] = f"--validation_file {list(validation_file)}"
    if "validation" not in raw and streaming:
        # The stream's length is unknown: hold out every k-th document (k = 100 / percentage), read lazily.
        every = max(2, round(100 / validation_split_percentage))
        train = raw["train"]
        raw = datasets.IterableDatasetDict(
            validation=train.filter(lambda _, i: i % every == 0, with_indices=True),
            train=train.filter(lambda _, i: i % every != 0, with_indices=True),
        )
        sources["validation"] = f"every {every}th document of {sources['train']}"
    if "validation" not in raw:
        train = raw["train"]
        n_val = max(1, len(train) * validation_split_percentage // 100)
        if len(train) < 2:
            raise ValueError(
                f"{sources['train']}: {len(train)} document(s) cannot be split into train and validation; "
                "give --validation_file"
            )
        raw = datasets.DatasetDict(validation=train.select(range(n_val)), train=train.select(range(n_val, len(train))))
        sources["validation"] = f"the first {validation_split_percentage}% of {sources['train']}"
    for split in sorted(raw, key=lambda split: split != "train"):  # the training data named first
        check_text_column(raw[split], text_column_name, sources[split])
    return raw


def parsed_rows(dataset: datasets.Dataset | datasets.IterableDataset, source: str) -> Iterator[dict[str, Any]]:
    """The rows of `dataset`; a record that cannot be parsed (a streamed line that is not JSON) raises one line.

    Args:
        dataset: a `Dataset` or (streamed) `IterableDataset`.
        source: what the data came from (`--train_file books.jsonl`), for the message.

    Yields:
        The rows, as `dataset` yields them.

    Raises:
        DataReadError: naming `source` and the parser's error (`unreadable_data`), instead of pyarrow's or pandas'
            error from inside `datasets`.
    """
    rows = iter(dataset)
    while True:
        try:
            row = next(rows)
        except StopIteration:
            return
        except READ_ERRORS as err:
            raise unreadable_data(err, source) from None
        yield row


def iter_texts(
    dataset: datasets.Dataset | datasets.IterableDataset,
    text_column_name: str = "text",
    batch_size: int = 64,
    clean: bool = True,
    source: str = "the data",
):
    """Yield batches of cleaned, non-empty texts from a dataset (streaming-friendly, bounded memory).

    Args:
        dataset: a `Dataset` or `IterableDataset` with a text column.
        text_column_name: the text column.
        batch_size: number of rows per yielded batch.
        clean: apply `clean_text` to each row.
        source: what the data came from (`--train_file books.jsonl`), for messages.

    Yields:
        Lists of at most `batch_size` strings.

    Raises:
        DataReadError: a streamed record the format's parser refuses (a line that is not JSON), naming `source`.
    """
    batch: list[str] = []
    for row in parsed_rows(dataset, source):
        text = row[text_column_name]
        if text is None:
            continue
        text = clean_text(text) if clean else text
        if text:
            batch.append(text)
        if len(batch) == batch_size:
            yield batch
            batch = []
    if batch:
        yield batch
