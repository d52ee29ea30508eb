"""Local data of hfzoo's lm-evaluation-harness tasks: the loaders their YAML files name with `!function`.

The harness loads this file by path (`!function tasks.NAME` in a task file of this folder) and calls a
task's `custom_dataset` with the task's metadata, where hfzoo passes `data_dir` (the folder of
`../shared/data`'s layout, `--data_dir` / `HFZOO_DATA_DIR`). Every loader reads local files with a
`datasets` builder (`json`, `text`, `csv` with `data_files`), so nothing touches the Hugging Face Hub.

- `hfzoo_gutenberg`: the 9 held-out books of the Gutenberg recipe (the first 5% of the 184 books of
  `gutenberg/pg_top100_en.00.jsonl.xz`, as `hfzoo-pretrain` holds them out), cleaned (`clean_text`).
- `hfzoo_wikitext2`: `wikitext-2/wiki.valid.tokens` (tokenized v1) as one document, as `hfzoo-evaluate-lm` reads it.
- `hfzoo_sst2`: GLUE SST-2 dev, `glue/SST-2/dev.tsv` (872 labelled sentences).
"""

from __future__ import annotations

import csv
from pathlib import Path

import datasets

from hfzoo.data.loading import clean_text

#: The file each task reads, relative to the data folder.
TASK_FILES = {
    "hfzoo_gutenberg": "gutenberg/pg_top100_en.00.jsonl.xz",
    "hfzoo_wikitext2": "wikitext-2/wiki.valid.tokens",
    "hfzoo_sst2": "glue/SST-2/dev.tsv",
}
#: Held-out Gutenberg books: `hfzoo-pretrain`'s default split holds out the first 5% of the training
#: documents (`len * 5 // 100`), 9 of shard 00's 184 books.
GUTENBERG_HELD_OUT_PERCENT = 5


def _path(data_dir: str | Path | None, task: str) -> str:
    """The file of `task` under `data_dir`; a missing one is an error naming it."""
    if data_dir is None:
        raise ValueError(f"{task}: no data folder given (metadata data_dir; hfzoo passes --data_dir / HFZOO_DATA_DIR)")
    path = Path(data_dir).expanduser() / TASK_FILES[task]
    if not path.is_file():
        raise FileNotFoundError(f"{task}: {path} does not exist (expected the layout of ../shared/data)")
    return str(path.resolve())


def gutenberg_held_out(data_dir: str | None = None, **_: object) -> datasets.DatasetDict:
    """The held-out Gutenberg books, cleaned: a `test` split with a `text` column (one book per row)."""
    books = datasets.load_dataset("json", data_files={"test": _path(data_dir, "hfzoo_gutenberg")}, split="test")
    books = books.select(range(max(1, len(books) * GUTENBERG_HELD_OUT_PERCENT // 100)))
    books = books.map(lambda row: {"text": clean_text(row["text"])}, remove_columns=books.column_names)
    return datasets.DatasetDict(test=books.filter(lambda row: bool(row["text"].strip())))


def wikitext2_validation(data_dir: str | None = None, **_: object) -> datasets.DatasetDict:
    """WikiText-2 validation as one document: a `test` split with one `text` row."""
    path = _path(data_dir, "hfzoo_wikitext2")
    text = datasets.load_dataset(
        "text", data_files={"test": path}, split="test", sample_by="document", keep_linebreaks=True
    )
    return datasets.DatasetDict(test=text)


def sst2_dev(data_dir: str | None = None, **_: object) -> datasets.DatasetDict:
    """GLUE SST-2 dev: a `validation` split with `sentence` and `label` (0 negative, 1 positive)."""
    path = _path(data_dir, "hfzoo_sst2")
    # GLUE TSVs hold unbalanced quotes: read without quoting, as the GLUE distribution is meant to be read
    rows = datasets.load_dataset(
        "csv", data_files={"validation": path}, split="validation", sep="\t", quoting=csv.QUOTE_NONE
    )
    return datasets.DatasetDict(validation=rows)
