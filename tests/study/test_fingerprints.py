"""`hfzoo.study.fingerprints`: a folder continues only its own study, recognised by its settings and data."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
from helpers.study import copy_inputs, expect_refusal, read_results, tiny_study, without_timing

from hfzoo.integrity import file_sha256
from hfzoo.study.fingerprints import prepare_output_dir
from hfzoo.study.runner import main
from hfzoo.study.settings import load_settings


def test_an_output_folder_with_another_study_is_refused_unless_overwritten(inputs, tmp_path, capsys):
    out = tmp_path / "out"
    other = load_settings(tiny_study(inputs, tmp_path / "other.yaml", max_train_steps=32, tokenizer_name=None))
    prepare_output_dir(out, other, overwrite=False)
    (out / "runs" / "old").mkdir(parents=True)
    study = tiny_study(inputs, tmp_path / "study.yaml", tokenizer_name=None)
    message = expect_refusal(["--study", str(study), "--output_dir", str(out)], capsys)
    assert "holds a study with other settings (max_train_steps: 32 there, 16 here)" in message
    assert (out / "runs" / "old").is_dir() and not (out / "tokenizer").exists()
    # A subset of the same study (other variants or seeds) is the same study: accepted.
    subset = tiny_study(inputs, tmp_path / "s.yaml", max_train_steps=32, tokenizer_name=None, seeds=[7])
    prepare_output_dir(out, load_settings(subset), overwrite=False)
    # --overwrite_output_dir replaces it.
    prepare_output_dir(out, load_settings(study), overwrite=True)
    assert not (out / "runs").exists()
    assert json.loads((out / "study.json").read_text())["settings"]["max_train_steps"] == 16


def test_study_json_records_the_paths_as_given_and_the_runs_get_them_resolved(inputs, tmp_path, monkeypatch, capsys):
    """Relative paths stay relative in `study.json`, beside the data's sizes and digests; the recipes get them absolute."""
    from hfzoo.study import execution, processes

    relative = copy_inputs(inputs, tmp_path)
    monkeypatch.chdir(tmp_path)
    tiny_study(relative, tmp_path / "study.yaml")
    launched = []

    def first_stage_stops_the_study(module, argv, launcher):
        launched.append(argv)
        raise processes.StudyInterrupted("stopped")

    monkeypatch.setattr(execution, "run_stage", first_stage_stops_the_study)
    with pytest.raises(SystemExit) as exc:
        main(["--study", "study.yaml", "--output_dir", "out"])
    assert exc.value.code == 75
    flags = launched[0]
    assert flags[flags.index("--train_file") + 1] == str(tmp_path / "data" / "books.jsonl.xz")
    assert flags[flags.index("--tokenizer_name") + 1] == str(tmp_path / "data" / "tokenizer")

    saved = json.loads((tmp_path / "out" / "study.json").read_text())
    assert {k: saved["settings"][k] for k in ("train_file", "tokenizer_name", "glue_data_dir", "paper_table")} == {
        "train_file": ["data/books.jsonl.xz"],
        "tokenizer_name": "data/tokenizer",
        "glue_data_dir": "data/glue",
        "paper_table": "data/table1.tsv",
    }
    books, table = tmp_path / "data" / "books.jsonl.xz", tmp_path / "data" / "table1.tsv"
    assert saved["data"]["train_file"] == [{"size": books.stat().st_size, "sha256": file_sha256(books)}]
    assert saved["data"]["paper_table"] == {"size": table.stat().st_size, "sha256": file_sha256(table)}
    assert sorted(saved["data"]["glue_data_dir"]["files"]) == ["RTE/dev.tsv", "RTE/train.tsv", "SST-2/dev.tsv",
                                                               "SST-2/train.tsv"]  # fmt: skip
    assert sorted(saved["data"]["tokenizer_name"]["files"]) == sorted(p.name for p in Path("data/tokenizer").iterdir())
    assert saved["data"]["config_name"] is None and saved["data"]["validation_file"] is None  # a preset; null


def test_a_moved_study_continues_with_its_data_at_other_paths(inputs, uninterrupted, tmp_path, monkeypatch, capfd):
    """The study folder and its data copied elsewhere, named relative to another working directory, then
    absolute: the same study (the same data), so it continues and reports, and runs nothing again."""
    moved = tmp_path / "elsewhere"
    relative = copy_inputs(inputs, moved)
    shutil.copytree(uninterrupted, moved / "out")
    monkeypatch.chdir(moved)
    tiny_study(relative, moved / "study.yaml")
    capfd.readouterr()
    main(["--study", "study.yaml", "--output_dir", "out"])
    assert "=== run" not in capfd.readouterr().out  # every run was finished: none is repeated
    saved = json.loads((moved / "out" / "study.json").read_text())
    assert (
        saved["settings"]["train_file"] == ["data/books.jsonl.xz"] and saved["settings"]["glue_data_dir"] == "data/glue"
    )
    assert saved["data"] == json.loads((uninterrupted / "study.json").read_text())["data"]

    monkeypatch.chdir(tmp_path)
    tiny_study({k: str(moved / v) for k, v in relative.items()}, tmp_path / "study.yaml")
    main(["--study", "study.yaml", "--output_dir", str(moved / "out"), "--report_only"])
    reference = without_timing(read_results(uninterrupted))
    report = without_timing(read_results(moved / "out"))
    assert report["settings"]["train_file"] == [str(moved / "data" / "books.jsonl.xz")]
    assert {k: v for k, v in report.items() if k != "settings"} == {
        k: v for k, v in reference.items() if k != "settings"
    }


@pytest.mark.parametrize(
    "changed, change, spelling, expected",
    [
        ("train", "flip a byte", "absolute", "(file 1: same size ({size} bytes) but sha256 "),
        ("train", "append", "relative", "(file 1: size {size} bytes there, {grown} here)"),
        ("glue", "append", "absolute", "(SST-2/train.tsv: size {size} bytes there, {grown} here)"),
    ],
)
def test_a_study_whose_data_differs_is_refused(
    changed, change, spelling, expected, inputs, tmp_path, monkeypatch, capsys
):
    """The folder's data, found elsewhere with a difference (however the path is spelled): refused, naming it."""
    for place in ("a", "b"):
        relative = copy_inputs(inputs, tmp_path / place)
    monkeypatch.chdir(tmp_path / "a")
    out = tmp_path / "out"
    prepare_output_dir(out, load_settings(tiny_study(relative, tmp_path / "a.yaml", tokenizer_name=None)), False)

    monkeypatch.chdir(tmp_path / "b")
    file = Path("data/books.jsonl.xz") if changed == "train" else Path("data/glue/SST-2/train.tsv")
    data = bytearray(file.read_bytes())
    if change == "append":
        data += b"one more row\t1\n"
    else:
        data[len(data) // 2] ^= 1
    size = file.stat().st_size
    file.write_bytes(bytes(data))
    given = relative if spelling == "relative" else {k: str(tmp_path / "b" / v) for k, v in relative.items()}
    study = tiny_study(given, tmp_path / "b.yaml", tokenizer_name=None)
    message = expect_refusal(["--study", str(study), "--output_dir", str(out)], capsys)
    setting, there, here = (
        ("train_file", [relative["train"]], [given["train"]])
        if changed == "train"
        else ("glue_data_dir", relative["glue"], given["glue"])
    )
    shown = f"holds a study with other data ({setting}: {there!r} there, {here!r} here "
    assert shown + expected.format(size=size, grown=len(data)) in message, message
    assert "use --overwrite_output_dir to replace it" in message
    assert not (out / "tokenizer").exists() and not (out / "runs").exists()


def test_a_study_json_without_data_is_accepted_and_completed(inputs, tmp_path):
    """A `study.json` of an older version (absolute paths, no data recorded) still matches its study."""

    settings = load_settings(tiny_study(inputs, tmp_path / "study.yaml"))
    old = {k: v for k, v in dataclasses.asdict(settings).items() if k not in ("variants", "seeds")}
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "study.json").write_text(json.dumps({"settings": old}))
    prepare_output_dir(tmp_path / "out", settings, overwrite=False)
    assert json.loads((tmp_path / "out" / "study.json").read_text())["data"]["train_file"][0]["sha256"] == file_sha256(
        inputs["train"]
    )
