"""GLUE task table and TSV loading: all nine tasks in their original layout, real files, bad input."""

from __future__ import annotations

import re

import pytest
from helpers.glue_files import LAYOUTS, write_glue_dir, write_tsv

from hfzoo.data.glue import GLUE_TASKS, get_glue_task, load_glue, read_glue_tsv

HUB_COLUMNS = {
    "cola": ["sentence"], "sst2": ["sentence"], "mrpc": ["sentence1", "sentence2"],
    "stsb": ["sentence1", "sentence2"], "qqp": ["question1", "question2"], "mnli": ["premise", "hypothesis"],
    "qnli": ["question", "sentence"], "rte": ["sentence1", "sentence2"], "wnli": ["sentence1", "sentence2"],
}  # fmt: skip
HUB_LABEL_NAMES = {
    "cola": ["unacceptable", "acceptable"], "sst2": ["negative", "positive"],
    "mrpc": ["not_equivalent", "equivalent"], "qqp": ["not_duplicate", "duplicate"],
    "mnli": ["entailment", "neutral", "contradiction"], "qnli": ["entailment", "not_entailment"],
    "rte": ["entailment", "not_entailment"], "wnli": ["not_entailment", "entailment"], "stsb": None,
}  # fmt: skip
METRICS = {
    "cola": ("matthews_correlation",), "sst2": ("accuracy",), "mrpc": ("accuracy", "f1"),
    "stsb": ("pearson", "spearmanr"), "qqp": ("accuracy", "f1"), "mnli": ("accuracy",), "qnli": ("accuracy",),
    "rte": ("accuracy",), "wnli": ("accuracy",),
}  # fmt: skip


def test_table_has_the_nine_tasks_with_official_metrics_and_hub_labels():
    assert set(GLUE_TASKS) == set(METRICS)
    for name, task in GLUE_TASKS.items():
        assert task.metrics == METRICS[name]
        assert list(task.text_names) == HUB_COLUMNS[name]
        assert (list(task.label_names) if task.label_names else None) == HUB_LABEL_NAMES[name]
        assert task.num_labels == (1 if name == "stsb" else len(HUB_LABEL_NAMES[name]))
    assert set(GLUE_TASKS["mnli"].validation_files) == {"validation_matched", "validation_mismatched"}
    assert get_glue_task("SST-2") is GLUE_TASKS["sst2"] and get_glue_task("STS-B") is GLUE_TASKS["stsb"]


@pytest.mark.parametrize("task", list(GLUE_TASKS))
def test_every_task_loads_from_its_glue_layout(task, tmp_path):
    root = write_glue_dir(tmp_path / "glue", task)
    loaded = load_glue(task, data_dir=root)
    assert set(loaded) == {"train", *GLUE_TASKS[task].validation_files}
    for split in loaded.values():
        assert split.column_names == [*HUB_COLUMNS[task], "label", "idx"]
        expected = LAYOUTS[task]["rows"]
        assert len(split) == len(expected)
        for row, (texts, _, label) in zip(split, expected):
            assert [row[c] for c in HUB_COLUMNS[task]] == list(texts)  # quotes kept verbatim
            assert row["label"] == pytest.approx(label)
    assert loaded["train"].features["label"].dtype == ("float32" if task == "stsb" else "int64")


@pytest.mark.slow
def test_real_glue_files_have_official_sizes_and_label_counts(data_dir):
    glue = data_dir / "glue"
    expected = {"cola": (8551, 1043, {0: 322, 1: 721}), "sst2": (67349, 872, {0: 428, 1: 444}),
                "mrpc": (3668, 408, {0: 129, 1: 279}), "stsb": (5749, 1500, None),
                "rte": (2490, 277, {0: 146, 1: 131}), "wnli": (635, 71, {0: 40, 1: 31})}  # fmt: skip
    for task, (n_train, n_dev, dev_counts) in expected.items():
        loaded = load_glue(task, data_dir=glue)
        assert (len(loaded["train"]), len(loaded["validation"])) == (n_train, n_dev), task
        if dev_counts:
            labels = loaded["validation"]["label"]
            assert {k: labels.count(k) for k in dev_counts} == dev_counts, task
    # MRPC's BOM does not leak into the first column; CoLA's first row is data, not a header.
    assert load_glue("mrpc", data_dir=glue)["validation"][0]["sentence1"].startswith("He said the foodservice")
    assert (
        load_glue("cola", data_dir=glue)["validation"][0]["sentence"]
        == "The sailors rode the breeze clear of the rocks."
    )
    qnli = read_glue_tsv(glue / "QNLI" / "dev.tsv", "qnli")
    assert len(qnli) == 5463 and set(qnli["label"]) == {0, 1}


def test_unknown_task_is_refused():
    with pytest.raises(ValueError, match=r"unknown GLUE task 'sst3'; choose one of \['cola'"):
        get_glue_task("sst3")


def test_missing_task_files_are_listed(tmp_path):
    root = write_glue_dir(tmp_path / "glue", "mnli")
    (root / "MNLI" / "dev_mismatched.tsv").unlink()
    with pytest.raises(FileNotFoundError, match="missing .*dev_mismatched.tsv"):
        load_glue("mnli", data_dir=root)
    with pytest.raises(FileNotFoundError, match="RTE/train.tsv"):
        load_glue("rte", data_dir=root)


def test_missing_column_is_refused(tmp_path):
    path = write_tsv(tmp_path / "dev.tsv", "rte", header=["index", "sentence1", "premise", "label"])
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['sentence2'\]"):
        read_glue_tsv(path, "rte")


def test_short_row_is_refused_with_its_line(tmp_path):
    path = write_tsv(tmp_path / "train.tsv", "sst2")
    path.write_text(path.read_text() + "no label here\n")
    with pytest.raises(ValueError, match=r"train.tsv:4: 1 tab-separated fields"):
        read_glue_tsv(path, "sst2")


@pytest.mark.parametrize("task", list(GLUE_TASKS))
def test_row_with_more_fields_than_the_header_is_refused(task, tmp_path):
    """A quoted text holding a tab: quoting is off, so it splits, which would cut the text or shift the columns."""
    good, (texts, label, _) = LAYOUTS[task]["rows"][:2]
    tabbed = ('"He said\thello."', *texts[1:])  # the row's first text, with a tab inside quotes
    path = write_tsv(tmp_path / "dev.tsv", task, rows=[good, (tabbed, label, None)])
    fields = len(LAYOUTS[task]["row"](texts, label))
    line, expected = (
        (2, f"the layout has {fields} \\(no header\\)") if task == "cola" else (3, f"the header has {fields}")
    )
    for labelled in (True, False):
        with pytest.raises(
            ValueError, match=rf"dev.tsv:{line}: row has {fields + 1} tab-separated fields, {expected} "
        ):
            read_glue_tsv(path, task, labelled=labelled)


@pytest.mark.parametrize(
    ("task", "label", "match"),
    [("rte", "contradiction", "label 'contradiction' is not one of"), ("sst2", "2", "label '2' is not one of"),
     ("stsb", "5.5", "score '5.5' is not a number in"), ("stsb", "high", "score 'high'")],
)  # fmt: skip
def test_label_outside_the_label_set_is_refused(task, label, match, tmp_path):
    texts = LAYOUTS[task]["rows"][0][0]
    path = write_tsv(tmp_path / "dev.tsv", task, rows=[(texts, label, None)])
    with pytest.raises(ValueError, match=match):
        read_glue_tsv(path, task)


def test_csv_and_json_files_with_hub_columns(tmp_path):
    import json

    (tmp_path / "train.jsonl").write_text(
        "\n".join(json.dumps({"sentence1": "a", "sentence2": "b", "label": i % 2}) for i in range(4)) + "\n"
    )
    (tmp_path / "dev.csv").write_text("sentence1,sentence2,label\nx,y,1\n")
    loaded = load_glue("rte", train_file=tmp_path / "train.jsonl", validation_file=tmp_path / "dev.csv")
    assert len(loaded["train"]) == 4 and loaded["validation"][0] == {
        "sentence1": "x",
        "sentence2": "y",
        "label": 1,
        "idx": 0,
    }
    (tmp_path / "bad.csv").write_text("sentence1,sentence2,label\nx,y,7\n")
    with pytest.raises(ValueError, match="label 7 is outside"):
        load_glue("rte", train_file=tmp_path / "train.jsonl", validation_file=tmp_path / "bad.csv")


def test_csv_and_json_files_that_cannot_be_used_are_refused_naming_the_file(tmp_path):
    """A line that is not JSON, numbers in a text column and a score that is no number ended in tracebacks."""
    import json

    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"sentence1": "a", "sentence2": "b", "label": i % 2}) + "\n" for i in range(4)))
    files = {
        "broken.jsonl": (json.dumps({"sentence1": "a", "sentence2": "b", "label": 0}) + "\n{not json\n", "rte"),
        "numbers.csv": ("sentence1,sentence2,label\n1,2,0\n3,4,1\n", "rte"),
        "words.csv": ("sentence1,sentence2,label\nx,y,high\n", "stsb"),
    }
    expected = {
        "broken.jsonl": "broken.jsonl: cannot be read as JSON lines (ArrowInvalid: JSON parse error: ",
        "numbers.csv": "numbers.csv: GLUE rte column 'sentence1' holds Value('int64') values, not text",
        "words.csv": "words.csv: GLUE stsb label 'high' is outside the task's label set",
    }
    for name, (text, task) in files.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(ValueError, match=re.escape(expected[name])):
            load_glue(task, train_file=train, validation_file=tmp_path / name)


def test_without_files_the_hub_dataset_is_used_without_its_test_splits(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(path, name):
        calls.append((path, name))
        split = datasets.Dataset.from_dict({"sentence": ["a"], "label": [1], "idx": [0]})
        return datasets.DatasetDict({"train": split, "validation": split, "test": split})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    loaded = load_glue("SST-2")
    assert calls == [("nyu-mll/glue", "sst2")] and set(loaded) == {"train", "validation"}


def test_without_files_an_unreachable_hub_is_refused_naming_the_local_options(monkeypatch, tmp_path):
    """Offline with an empty datasets cache, `datasets` itself fails; the error says which arguments avoid the hub."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "datasets")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(FileNotFoundError) as err:
        load_glue("rte")
    message = str(err.value)
    assert message.startswith("GLUE rte: nyu-mll/glue is neither reachable on the hub nor in the datasets cache (")
    assert message.endswith("give --data_dir, a folder in the GLUE layout (<dir>/RTE/train.tsv, ...), or "
                            "--train_file and --validation_file")  # fmt: skip
    assert "\n" not in message
