"""The nine GLUE tasks (Wang et al. 2019) as one table, and loading them from the GLUE TSV layout or the hub.

`GLUE_TASKS` maps a task name (`cola`, `sst2`, `mrpc`, `stsb`, `qqp`, `mnli`, `qnli`, `rte`, `wnli`) to
its `GlueTask`: folder and file names of the original GLUE distribution (`download_glue_data.py`), the
TSV columns holding the text(s) and the label, the label set (`None` = regression, STS-B) and the
official metrics. Loaded datasets have the column names and integer label ids of the hub's
`nyu-mll/glue`, whichever source they come from, so the two are interchangeable.

TSV quirks handled here (see `shared/data/README.md`): CoLA has no header; MRPC's header starts with a
UTF-8 BOM; RTE/QNLI/MNLI labels are strings; many rows contain unbalanced `"` (read with quoting off).
With quoting off a text cannot hold a tab: a row with more fields than its header is refused.
"""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import datasets

from ..choices import choice_hint
from .loading import READ_ERRORS, unreadable_data

#: the hub dataset read when no local files are given.
GLUE_HUB_DATASET = "nyu-mll/glue"

__all__ = ["GLUE_TASKS", "GlueTask", "get_glue_task", "glue_files", "load_glue", "read_glue_tsv"]


@dataclasses.dataclass(frozen=True)
class GlueTask:
    """One GLUE task: where its files are, which columns to read, its labels and metrics.

    Attributes:
        name: the task's key in `GLUE_TASKS` (the hub's config name).
        folder: the task's folder in the GLUE layout (`CoLA`, `SST-2`, ...).
        train_file: training TSV in `folder`.
        validation_files: dev split name -> TSV in `folder` (MNLI has matched and mismatched dev sets).
        text_columns: `(hub column, TSV column)` for the one or two input texts.
        label_column: TSV column of the label.
        tsv_labels: the label strings as written in the TSV, in the order of the hub's label ids;
            None for regression (STS-B: a float score in [0, 5]).
        label_names: the hub's names for the label ids (None for regression).
        metrics: the official metrics, names as in `evaluate`'s `glue` metric; the first is the main one.
        header: TSV column names for files without a header row (CoLA), else None.
    """

    name: str
    folder: str
    train_file: str
    validation_files: dict[str, str]
    text_columns: tuple[tuple[str, str], ...]
    label_column: str
    tsv_labels: tuple[str, ...] | None
    label_names: tuple[str, ...] | None
    metrics: tuple[str, ...]
    header: tuple[str, ...] | None = None

    @property
    def is_regression(self) -> bool:
        """True for STS-B (a real-valued similarity score), False for classification tasks."""
        return self.tsv_labels is None

    @property
    def num_labels(self) -> int:
        """Number of model outputs: 1 for regression, else the number of classes."""
        return 1 if self.tsv_labels is None else len(self.tsv_labels)

    @property
    def main_metric(self) -> str:
        """The metric that ranks checkpoints (best-epoch selection): the first of `metrics`."""
        return self.metrics[0]

    @property
    def text_names(self) -> tuple[str, ...]:
        """The hub's column names of the input text(s)."""
        return tuple(hub for hub, _ in self.text_columns)


GLUE_TASKS: dict[str, GlueTask] = {
    task.name: task
    for task in (
        GlueTask("cola", "CoLA", "train.tsv", {"validation": "dev.tsv"}, (("sentence", "sentence"),), "label",
                 ("0", "1"), ("unacceptable", "acceptable"), ("matthews_correlation",),
                 header=("source", "label", "original_mark", "sentence")),
        GlueTask("sst2", "SST-2", "train.tsv", {"validation": "dev.tsv"}, (("sentence", "sentence"),), "label",
                 ("0", "1"), ("negative", "positive"), ("accuracy",)),
        GlueTask("mrpc", "MRPC", "train.tsv", {"validation": "dev.tsv"},
                 (("sentence1", "#1 String"), ("sentence2", "#2 String")), "Quality",
                 ("0", "1"), ("not_equivalent", "equivalent"), ("accuracy", "f1")),
        GlueTask("stsb", "STS-B", "train.tsv", {"validation": "dev.tsv"},
                 (("sentence1", "sentence1"), ("sentence2", "sentence2")), "score",
                 None, None, ("pearson", "spearmanr")),
        GlueTask("qqp", "QQP", "train.tsv", {"validation": "dev.tsv"},
                 (("question1", "question1"), ("question2", "question2")), "is_duplicate",
                 ("0", "1"), ("not_duplicate", "duplicate"), ("accuracy", "f1")),
        GlueTask("mnli", "MNLI", "train.tsv",
                 {"validation_matched": "dev_matched.tsv", "validation_mismatched": "dev_mismatched.tsv"},
                 (("premise", "sentence1"), ("hypothesis", "sentence2")), "gold_label",
                 ("entailment", "neutral", "contradiction"), ("entailment", "neutral", "contradiction"),
                 ("accuracy",)),
        GlueTask("qnli", "QNLI", "train.tsv", {"validation": "dev.tsv"},
                 (("question", "question"), ("sentence", "sentence")), "label",
                 ("entailment", "not_entailment"), ("entailment", "not_entailment"), ("accuracy",)),
        GlueTask("rte", "RTE", "train.tsv", {"validation": "dev.tsv"},
                 (("sentence1", "sentence1"), ("sentence2", "sentence2")), "label",
                 ("entailment", "not_entailment"), ("entailment", "not_entailment"), ("accuracy",)),
        GlueTask("wnli", "WNLI", "train.tsv", {"validation": "dev.tsv"},
                 (("sentence1", "sentence1"), ("sentence2", "sentence2")), "label",
                 ("0", "1"), ("not_entailment", "entailment"), ("accuracy",)),
    )
}  # fmt: skip


def get_glue_task(name: str) -> GlueTask:
    """Return the `GlueTask` named `name` (case-insensitive; `sst-2`, `sts-b` accepted).

    Raises:
        ValueError: an unknown task name; the message lists the nine tasks.
    """
    key = name.lower().replace("-", "")
    if key not in GLUE_TASKS:
        raise ValueError(
            f"unknown GLUE task {name!r}; {choice_hint(name, sorted(GLUE_TASKS), 'hfzoo.data.glue.GLUE_TASKS')}"
        )
    return GLUE_TASKS[key]


def read_glue_tsv(path: str | Path, task: GlueTask | str, labelled: bool = True) -> datasets.Dataset:
    """Read one TSV of the GLUE layout into a dataset with the hub's columns (texts, `label`, `idx`).

    Args:
        path: the TSV file (UTF-8, optional BOM, tab-separated, no quoting: every row has at most as
            many fields as the header, so no text may hold a tab).
        task: the task (or its name) whose layout the file has.
        labelled: read the label column (train/dev files); False for unlabelled files (label -1).

    Returns:
        A `datasets.Dataset` with the task's text columns (str), `label` (int64 class id, float32
        score for STS-B, -1 when unlabelled) and `idx` (int64 row number, from 0).

    Raises:
        FileNotFoundError: `path` does not exist.
        ValueError: a header without a needed column, a row with too few fields or with more fields than
            the header (a text holding a tab: quoting is off, so it would be cut at the tab), or a label
            outside the task's label set (or not a number in [0, 5] for STS-B); the message names the file
            and line (and the two field counts).
    """
    task = get_glue_task(task) if isinstance(task, str) else task
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GLUE {task.name}: no file {path}")
    with path.open(encoding="utf-8-sig", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    header, first_line = (list(task.header), 1) if task.header else (rows.pop(0) if rows else [], 2)
    needed = [tsv for _, tsv in task.text_columns] + ([task.label_column] if labelled else [])
    missing = [name for name in needed if name not in header]
    if missing:
        raise ValueError(f"{path}: GLUE {task.name} file lacks column(s) {missing}; its header is {header}")
    index = {name: header.index(name) for name in needed}
    width = max(index.values()) + 1
    columns: dict[str, list] = {hub: [] for hub, _ in task.text_columns}
    labels: list = []
    for line, row in enumerate(rows, start=first_line):
        if not row:
            continue
        if len(row) > len(header):
            expected = f"the layout has {len(header)} (no header)" if task.header else f"the header has {len(header)}"
            raise ValueError(
                f"{path}:{line}: row has {len(row)} tab-separated fields, {expected} (GLUE {task.name}); quoting is "
                "off, so a tab inside a text (even a quoted one) splits it: replace that tab with a space"
            )
        if len(row) < width:
            raise ValueError(
                f"{path}:{line}: {len(row)} tab-separated fields, GLUE {task.name} needs at least {width} "
                f"(columns {needed})"
            )
        for hub, tsv in task.text_columns:
            columns[hub].append(row[index[tsv]])
        if labelled:
            labels.append(_parse_label(row[index[task.label_column]], task, f"{path}:{line}"))
    if not labelled:
        labels = [-1] * len(next(iter(columns.values())))
    features = datasets.Features(
        {
            **{hub: datasets.Value("string") for hub in columns},
            "label": datasets.Value("float32" if task.is_regression else "int64"),
            "idx": datasets.Value("int64"),
        }
    )
    return datasets.Dataset.from_dict({**columns, "label": labels, "idx": list(range(len(labels)))}, features=features)


def _parse_label(value: str, task: GlueTask, where: str) -> int | float:
    value = value.strip()
    if task.tsv_labels is None:
        try:
            score = float(value)
        except ValueError:
            score = float("nan")
        if not 0.0 <= score <= 5.0:
            raise ValueError(f"{where}: GLUE {task.name} score {value!r} is not a number in [0, 5]")
        return score
    if value not in task.tsv_labels:
        raise ValueError(f"{where}: GLUE {task.name} label {value!r} is not one of {list(task.tsv_labels)}")
    return task.tsv_labels.index(value)


def glue_files(
    task: GlueTask | str,
    data_dir: str | Path | None = None,
    train_file: str | Path | None = None,
    validation_file: str | Path | None = None,
) -> dict[str, Path] | None:
    """The files `load_glue` reads for a task; those of `data_dir` are checked to exist (nothing is read).

    Args:
        task: the task or its name.
        data_dir: folder in the GLUE layout.
        train_file: a training file (overrides `data_dir`'s).
        validation_file: a dev file (overrides `data_dir`'s; for MNLI it becomes the only dev split,
            named `validation`).

    Returns:
        `{split: path}` with `train` and the dev split(s) (`validation`, or MNLI's `validation_matched`
        and `validation_mismatched`); None when no source is given (`load_glue` then loads the hub's
        `nyu-mll/glue`).

    Raises:
        ValueError: an unknown task; a training file without a dev file or the reverse (and no `data_dir`).
        FileNotFoundError: `data_dir` lacks one of the task's files (the message lists what is expected).
    """
    task = get_glue_task(task) if isinstance(task, str) else task
    if data_dir is None and train_file is None and validation_file is None:
        return None
    files: dict[str, Path] = {}
    if data_dir is not None:
        folder = Path(data_dir) / task.folder
        expected = {"train": folder / task.train_file} | {
            split: folder / name for split, name in task.validation_files.items()
        }
        if train_file is not None:
            expected.pop("train")
        if validation_file is not None:
            expected = {k: v for k, v in expected.items() if k == "train"}
        absent = [str(p) for p in expected.values() if not p.is_file()]
        if absent:
            raise FileNotFoundError(
                f"--data_dir {data_dir}: GLUE {task.name} needs {[str(p) for p in expected.values()]}; missing {absent}"
            )
        files.update(expected)
    if train_file is not None:
        files["train"] = Path(train_file)
    if validation_file is not None:
        files["validation"] = Path(validation_file)
    if "train" not in files or not any(k.startswith("validation") for k in files):
        raise ValueError(f"GLUE {task.name}: give both a training and a validation file (or --data_dir)")
    return files


def load_glue(
    task: GlueTask | str,
    data_dir: str | Path | None = None,
    train_file: str | Path | None = None,
    validation_file: str | Path | None = None,
) -> datasets.DatasetDict:
    """Load a GLUE task's train and dev splits, from a folder in the GLUE layout, single files, or the hub.

    Sources, first match wins: explicit `train_file` / `validation_file` (TSV in the task's layout,
    or CSV / JSON lines with the hub's column names); `data_dir` (a folder with `<task folder>/train.tsv`
    and the dev file(s), e.g. `shared/data/glue`); otherwise `datasets.load_dataset("nyu-mll/glue", task)`.
    `glue_files` says which files that is.

    Args:
        task: the task or its name.
        data_dir: folder in the GLUE layout (see `glue_files`).
        train_file: a training file (see `glue_files`).
        validation_file: a dev file (see `glue_files`).

    Returns:
        A `DatasetDict` with `train` and the task's validation split(s) (`validation`, or MNLI's
        `validation_matched` and `validation_mismatched`), columns as `read_glue_tsv`.

    Raises:
        ValueError: an unknown task; files that `read_glue_tsv` refuses; a CSV / JSON-lines file that cannot be
            parsed (`hfzoo.data.loading.DataReadError`), lacks a column, holds no strings in a text column or a
            label outside the task's set; see `glue_files`.
        FileNotFoundError: a missing file (see `glue_files`); no local files given and `nyu-mll/glue` neither
            reachable on the hub nor in the datasets cache.
    """
    task = get_glue_task(task) if isinstance(task, str) else task
    files = glue_files(task, data_dir, train_file, validation_file)
    if files is None:
        try:
            loaded = datasets.load_dataset(GLUE_HUB_DATASET, task.name)
        except ConnectionError as err:  # offline, or the hub unreachable, with nothing in the datasets cache
            raise FileNotFoundError(
                f"GLUE {task.name}: {GLUE_HUB_DATASET} is neither reachable on the hub nor in the datasets cache "
                f"({err}); give --data_dir, a folder in the GLUE layout (<dir>/{task.folder}/train.tsv, ...), or "
                "--train_file and --validation_file"
            ) from err
        return datasets.DatasetDict({k: v for k, v in loaded.items() if not k.startswith("test")})
    return datasets.DatasetDict({split: _read_any(path, task) for split, path in files.items()})


def _is_score(value) -> bool:
    """Whether `value` is an STS-B score: a number in [0, 5]."""
    try:
        return 0.0 <= float(value) <= 5.0
    except (TypeError, ValueError):
        return False


def _read_any(path: Path, task: GlueTask) -> datasets.Dataset:
    """Read a TSV in the GLUE layout, or a CSV / JSON-lines file with the hub's column names."""
    if path.suffix == ".tsv":
        return read_glue_tsv(path, task)
    if path.suffix not in (".csv", ".json", ".jsonl"):
        raise ValueError(f"{path}: expected a .tsv (GLUE layout), .csv or .json/.jsonl file")
    if not path.is_file():
        raise FileNotFoundError(f"GLUE {task.name}: no file {path}")
    builder = "csv" if path.suffix == ".csv" else "json"
    try:
        dataset = datasets.load_dataset(builder, data_files=str(path), split="train")
    except READ_ERRORS as err:  # a line that is not JSON, an open CSV quote
        raise unreadable_data(err, str(path), builder) from None
    missing = [c for c in (*task.text_names, "label") if c not in dataset.column_names]
    if missing:
        raise ValueError(f"{path}: GLUE {task.name} file lacks column(s) {missing}; it has {dataset.column_names}")
    for name in task.text_names:
        feature = dataset.features[name]
        if not (isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")):
            raise ValueError(f"{path}: GLUE {task.name} column {name!r} holds {feature} values, not text")
    if task.is_regression:
        bad = [v for v in dataset["label"] if not _is_score(v)]
    else:
        bad = [v for v in dataset["label"] if v not in range(task.num_labels)]
    if bad:
        raise ValueError(f"{path}: GLUE {task.name} label {bad[0]!r} is outside the task's label set")
    if "idx" not in dataset.column_names:
        dataset = dataset.add_column("idx", list(range(len(dataset))))
    return dataset.select_columns([*task.text_names, "label", "idx"])
