"""`hfzoo-study` (Narang et al.'s modification study at small scale): kill and restart, outputs, bad input, statistics.

A tiny study (2 variants x 2 seeds, 16 pretraining steps of a 2 + 2 layer model on 4 Gutenberg books, two
tiny GLUE tasks) runs uninterrupted in this process; the same study killed (SIGKILL, or stopped by
SIGTERM) in the middle of its second run's pretraining and started again must finish with the same
`results.json` (wall-clock figures aside). The shipped default study file must parse and validate.
"""

from __future__ import annotations

import copy
import dataclasses
import fcntl
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers.glue_files import LAYOUTS, write_tsv
from PIL import Image
from scipy import stats

from hfzoo.data.glue import GLUE_TASKS
from hfzoo.data.loading import clean_text
from hfzoo.integrity import file_sha256
from hfzoo.models.narang import TABLE_1_ROWS
from hfzoo.study.protocol import NO_PRETRAINING
from hfzoo.study.report import GLU_VARIANTS, spearman_with_interval
from hfzoo.study.runner import load_settings, main, prepare_output_dir, run_dir
from hfzoo.tokenization import train_bpe_tokenizer
from hfzoo.training.precision import resolve_mixed_precision

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_STUDY = REPO_ROOT / "recipes" / "studies" / "narang_small.yaml"
VARIANTS = ["Vanilla Transformer", "SwiGLU"]
#: The runs of the tiny study: every variant and seed, then the "No pretraining" row once per seed.
PLANNED = [(v, s) for v in VARIANTS for s in (0, 1)] + [(NO_PRETRAINING, s) for s in (0, 1)]
DELETE = object()  # a `tiny_study` change that removes the key
PAPER_ROWS = """Model\tParams\tOps\tStep/s\tEarly loss\tFinal loss\tSGLUE\tXSum\tWebQ\tWMT EnDe
Vanilla Transformer\t223M\t11.1T\t3.50\t2.182 ± 0.005\t1.838\t70.97\t17.78\t23.02\t26.62
SwiGLU\t223M\t11.1T\t3.53\t2.127 ± 0.003\t1.789\t74.21\t18.20\t24.34\t27.02
"""


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, gutenberg_books, small_jsonl_xz) -> dict[str, str]:
    """A tokenizer, the paper's table (two rows) and a two-task GLUE folder, for a tiny study."""
    root = tmp_path_factory.mktemp("study_inputs")
    tokenizer = train_bpe_tokenizer(
        [[clean_text(b["text"]) for b in gutenberg_books]], vocab_size=512, model_family="encoder-decoder"
    )
    tokenizer.save_pretrained(root / "tokenizer")
    (root / "table1.tsv").write_text(PAPER_ROWS, encoding="utf-8")
    for task in ("sst2", "rte"):
        spec = GLUE_TASKS[task]
        write_tsv(root / "glue" / spec.folder / spec.train_file, task, rows=LAYOUTS[task]["rows"] * 10)
        write_tsv(root / "glue" / spec.folder / "dev.tsv", task, rows=LAYOUTS[task]["rows"] * 4)
    return {
        "tokenizer": str(root / "tokenizer"),
        "paper": str(root / "table1.tsv"),
        "glue": str(root / "glue"),
        "train": str(small_jsonl_xz),
    }


def tiny_study(inputs: dict[str, str], path: Path, **changes) -> Path:
    """The default study file with a tiny model, data and GLUE tasks; `changes` on top (`DELETE` removes a key)."""
    values = yaml.safe_load(DEFAULT_STUDY.read_text())
    values.update(
        config_overrides={
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_attention_heads": 2,
            "head_dim": 16,
            "num_hidden_layers": 2,
            "num_decoder_layers": 2,
        },
        variants=VARIANTS,
        seeds=[0, 1],
        tokenizer_name=inputs["tokenizer"],
        tokenizer_train_file=None,
        tokenizer_max_characters=200_000,
        train_file=[inputs["train"]],
        validation_split_percentage=25,
        block_size=32,
        train_batch_tokens=128,
        max_train_steps=16,
        num_warmup_steps=2,
        max_eval_samples=8,
        per_device_eval_batch_size=8,
        preprocessing_num_workers=None,
        glue_data_dir=inputs["glue"],
        glue_tasks=["sst2", "rte"],
        glue_max_train_samples=12,
        glue_train_batch_size=4,
        paper_table=inputs["paper"],
    )
    for key, value in changes.items():
        if value is DELETE:
            values.pop(key)
        else:
            values[key] = value
    path.write_text(yaml.safe_dump(values, allow_unicode=True))
    return path


def without_timing(results: dict) -> dict:
    """`results.json` without the wall-clock figures (which differ between two runs of the same study)."""
    results = copy.deepcopy(results)
    results.pop("timing", None)
    for record in results["runs"]:
        record.pop("timing")
    for summary in results["summary"].values():
        summary.pop("steps_per_second")
    return results


def read_results(output_dir: Path) -> dict:
    return json.loads((output_dir / "results.json").read_text())


def parse_markdown_table(text: str) -> list[dict[str, str]]:
    """The first Markdown table of `text` as rows of `{header: cell}`."""
    lines = [line for line in text.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert re.fullmatch(r"\|(-+:?\|)+", lines[1].replace(" ", "")), lines[1]
    rows = []
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != len(header):
            break  # the next table
        rows.append(dict(zip(header, cells)))
    return rows


@pytest.fixture(scope="module")
def uninterrupted(inputs, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("study_a")
    study = tiny_study(inputs, root / "study.yaml")
    records = main(["--study", str(study), "--output_dir", str(root / "out")])
    assert [(r["variant"], r["seed"]) for r in records] == PLANNED
    return root / "out"


@pytest.mark.slow
@pytest.mark.parametrize("signal_name", ["SIGKILL", "SIGTERM"])
def test_killed_study_restarts_and_finishes_with_the_same_results(signal_name, inputs, uninterrupted, tmp_path):
    study = tiny_study(inputs, tmp_path / "study.yaml")
    argv = ["--study", str(study), "--output_dir", str(tmp_path / "out")]
    # The signal at the 24th optimizer step of the study: step 8 of 16 of the second run's pretraining.
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tests" / "helpers" / "kill_study_during_run.py"), signal_name, "24", *argv],
        capture_output=True,
        text=True,
        timeout=600,
    )
    first, second = run_dir(tmp_path / "out", VARIANTS[0], 0), run_dir(tmp_path / "out", VARIANTS[0], 1)
    if signal_name == "SIGKILL":
        assert proc.returncode == -9, proc.stderr[-3000:]
        assert not (second / "pretrain" / "all_results.json").exists()
    else:  # the recipe finishes the step, writes a checkpoint and stops; the study stops with it
        assert proc.returncode == 75, proc.stderr[-3000:]
        assert "Vanilla Transformer, seed 1; the study stopped there" in proc.stderr
        assert "Run the same command again" in proc.stderr
        assert not (second / "error.txt").exists()
    assert (first / "result.json").is_file() and not (second / "result.json").exists()
    assert (second / "config.json").is_file()
    assert not run_dir(tmp_path / "out", VARIANTS[1], 0).exists()  # no later run was started
    assert [r["seed"] for r in read_results(tmp_path / "out")["runs"]] == [0]  # the report of the finished run

    main(argv)  # the same command again: finishes the study, the killed run from its start
    assert without_timing(read_results(tmp_path / "out")) == without_timing(read_results(uninterrupted))


def test_outputs_of_a_study(uninterrupted):
    results = read_results(uninterrupted)
    assert results["unfinished"] == [] and len(results["runs"]) == 6
    for record in results["runs"][:4]:
        folder = run_dir(uninterrupted, record["variant"], record["seed"])
        for name in (
            "config.json",
            "result.json",
            "pretrain/model.safetensors",
            "pretrain/train_history.json",
            "glue/sst2/all_results.json",
            "glue/rte/all_results.json",
        ):
            assert (folder / name).is_file(), name
        assert record["early_step"] == 2 and [s for s, _ in record["eval_losses"]] == list(range(0, 17, 2))
        assert (
            record["eval_losses"][1][1] == record["early_loss"] and record["eval_losses"][-1][1] == record["final_loss"]
        )
        assert record["final_loss"] < record["init_loss"]
        assert record["total_flops"] == record["flops_per_step"] * 16 > record["flops_per_token"] > 0
        assert record["glue_average"] == pytest.approx(
            (record["glue"]["sst2"]["score"] + record["glue"]["rte"]["score"]) / 2
        )
        assert record["glue"]["sst2"]["train_examples"] == 12  # the fixed subset of the 20 rows
        assert record["timing"]["steps_per_second"] > 0
    # Every run finetunes on the same subset, a seeded sample of the training file with its header.
    subset = (uninterrupted / "glue_train_subsets" / "sst2.tsv").read_text().splitlines()
    assert subset[0] == "sentence\tlabel" and len(subset) == 13
    # The variants differ only in the Table 1 row: SwiGLU's d_ff is 2/3 of the base's 64, rounded to 8s.
    swiglu = next(r for r in results["runs"] if r["variant"] == "SwiGLU")
    assert swiglu["config_changes"] == {"gated_mlp": True, "hidden_act": "silu", "intermediate_size": 40}
    # Pretraining saw the same data for both variants of a seed, evaluated on identically corrupted blocks.
    vanilla = next(r for r in results["runs"] if r["variant"] == VARIANTS[0] and r["seed"] == 0)
    assert vanilla["train_tokens"] == swiglu["train_tokens"]

    table = parse_markdown_table((uninterrupted / "results.md").read_text())
    assert [r["Model"] for r in table] == ["Vanilla Transformer", "", "SwiGLU", ""]
    assert [r[""] for r in table] == ["hfzoo", "paper", "hfzoo", "paper"]
    summary = results["summary"]["SwiGLU"]
    assert table[2]["Final loss"] == f"{summary['final_loss']:.3f} ± {summary['final_loss_std']:.3f}"
    assert table[3]["Final loss"] == "1.789" and table[3]["GLUE avg / SGLUE"] == "74.21"
    assert table[3]["Better than vanilla (>2σ)"] == "early, final"  # 2.127 < 2.182 - 2 x 0.005
    assert {"SST-2", "RTE", "Params", "Ops", "Step/s", "Early loss"} <= set(table[0])
    assert "Seed-to-seed spread" in (uninterrupted / "results.md").read_text()
    # The precision every run trained in (the study file's `auto`, resolved on this CPU) and the CPU's class.
    choice = resolve_mixed_precision(results["settings"]["mixed_precision"], device_type="cpu")
    assert results["precision"]["mixed_precision"] == [choice.mixed_precision]
    assert results["precision"]["host_capability"] == [choice.record()["host_capability"]]
    assert all(r["mixed_precision"] == choice.mixed_precision for r in results["runs"])  # the no-pretraining rows too
    assert f"on {choice.record()['host_capability']}." in (uninterrupted / "results.md").read_text()

    for name in ("loss_curves.png", "final_loss_vs_paper.png", "quality_vs_cost.png"):
        with Image.open(uninterrupted / name) as image:
            image.verify()
            assert image.format == "PNG"
        with Image.open(uninterrupted / name) as image:
            assert image.size[0] > 300 and any(k.startswith("hfzoo:") for k in image.text)
    with Image.open(uninterrupted / "loss_curves.png") as image:
        curves = json.loads(image.text["hfzoo:curves"])
    assert set(curves) == set(VARIANTS) and len(curves["SwiGLU"]) == 9


def test_the_report_is_written_under_the_study_lock(inputs, uninterrupted, tmp_path, monkeypatch):
    """Study processes sharing a folder never write the report files at the same time."""
    import shutil

    from hfzoo.study import report as study_report

    out = tmp_path / "out"
    shutil.copytree(uninterrupted, out)
    study = tiny_study(inputs, tmp_path / "study.yaml")
    original, lock_held = study_report.write_report, []

    def write_report_checking_the_lock(output_dir, settings, records):
        with open(Path(output_dir) / ".study.lock", "a+") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock_held.append(True)
            else:
                fcntl.flock(handle, fcntl.LOCK_UN)
                lock_held.append(False)
        return original(output_dir, settings, records)

    monkeypatch.setattr(study_report, "write_report", write_report_checking_the_lock)
    main(["--study", str(study), "--output_dir", str(out)])  # every run finished: only the report is rewritten
    main(["--study", str(study), "--output_dir", str(out), "--report_only"])
    assert lock_held == [True, True]
    assert without_timing(read_results(out)) == without_timing(read_results(uninterrupted))


@pytest.mark.slow
def test_finished_stages_are_reused_and_locked_runs_left_to_their_process(inputs, uninterrupted, tmp_path):
    """A run whose record is gone redoes only its unfinished stages; a run locked by another process is skipped."""
    import shutil

    out = tmp_path / "out"
    shutil.copytree(uninterrupted, out)
    reference = without_timing(read_results(uninterrupted))
    study = tiny_study(inputs, out.parent / "study.yaml")
    redo, locked = run_dir(out, "SwiGLU", 0), run_dir(out, "SwiGLU", 1)
    model_time = (redo / "pretrain" / "model.safetensors").stat().st_mtime_ns
    for folder in (redo, locked):
        (folder / "result.json").unlink()
    shutil.rmtree(redo / "glue" / "rte")
    with open(locked / ".lock", "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # as a second study process working on that run would
        main(["--study", str(study), "--output_dir", str(out)])
    assert (redo / "glue" / "rte" / "all_results.json").is_file()
    assert (redo / "pretrain" / "model.safetensors").stat().st_mtime_ns == model_time  # pretraining not repeated
    assert read_results(out)["unfinished"] == ["SwiGLU (seed 1)"] and not (locked / "result.json").exists()
    assert "## Unfinished runs" in (out / "results.md").read_text()
    main(["--study", str(study), "--output_dir", str(out)])  # lock released: the run is finished (stages reused)
    assert without_timing(read_results(out)) == reference


@pytest.mark.slow
def test_parallel_runs_share_the_study_and_give_the_same_results(inputs, uninterrupted, tmp_path, capfd):
    """`--parallel_runs 2`: this process and a child split the runs, each run once, same results."""
    study = tiny_study(inputs, tmp_path / "study.yaml")
    main(["--study", str(study), "--output_dir", str(tmp_path / "out"), "--parallel_runs", "2"])
    started = re.findall(r"=== run \d+/6: (.+), seed (\d) \(.*, study process (\d+)\)", capfd.readouterr().out)
    assert sorted((v, int(s)) for v, s, _ in started) == sorted(PLANNED)
    assert len({pid for _, _, pid in started}) == 2  # both processes ran some of the runs
    assert without_timing(read_results(tmp_path / "out")) == without_timing(read_results(uninterrupted))


def expect_refusal(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    message = exc.value.code if isinstance(exc.value.code, str) else capsys.readouterr().err
    assert "\n" not in message.strip(), f"error is not one line: {message!r}"
    return message


@pytest.mark.parametrize(
    "changes, flags, expected",
    [
        (
            {"variants": ["Vanilla Transformer", "Vanila Transformer"]},
            [],
            "variants: unknown row 'Vanila Transformer': did you mean 'Vanilla Transformer' or",
        ),
        ({"variants": ["QK-norm", "Squared RELU"]}, [], "unknown row 'Squared RELU': did you mean 'Squared ReLU'?"),
        (  # a study-wide Muon setting with a row that trains with AdamW
            {"variants": ["Muon", "QK-norm"], "pretrain_args": {"muon_learning_rate": 0.01}},
            [],
            "variant 'QK-norm': the pretraining arguments are refused: hfzoo-pretrain: error: --muon_learning_rate 0.01 needs --optim muon",
        ),
        ({}, ["--variants", "SwiGLUE"], "unknown row 'SwiGLUE': did you mean 'SwiGLU'"),
        ({"glue_tasks": DELETE}, [], "missing keys ['glue_tasks'] (every key of the study file is required)"),
        ({"learning_rat": 0.1}, [], "unknown keys ['learning_rat']"),
        ({"glue_tasks": ["sst2", "mrpc"]}, [], "glue_tasks: mrpc: files absent: ["),
        ({"glue_tasks": ["sst3"]}, [], "unknown GLUE task 'sst3'"),
        ({"seeds": []}, [], "seeds: the study has no seeds"),
        ({}, ["--max_train_steps", "0"], "max_train_steps=0: needs at least 8 steps"),
        ({"max_train_steps": "many"}, [], "max_train_steps='many' should be an int"),
        ({"train_file": ["/nonexistent/books.jsonl"]}, [], "train_file: /nonexistent/books.jsonl: no such file"),
        (
            {"variants": ["18 layers, $d_{ff} = 2048, H = 8$"]},
            [],
            "num_attention_heads=2 x 2/3 = 1.333 is not a whole number",
        ),
        ({"config_overrides": {"hidden_size": 32, "hiden_layers": 2}}, [], "unknown key 'hiden_layers'"),
        ({"train_batch_tokens": 100}, [], "train_batch_tokens=100 is not a multiple of block_size"),
        ({"glue_args": {"lora_dropout": 2}}, [], "the GLUE arguments are refused"),
        ({"lr_scheduler_type": "sometimes"}, [], "the pretraining arguments are refused"),
        ({}, ["--family", "gpt"], "family='gpt': choose one of ['encoder-decoder', 'decoder', 'encoder']"),
        (
            {"variants": ["Vanilla Transformer", "Funnel Transformer"]},
            ["--family", "decoder"],
            "variant 'Funnel Transformer' in the decoder family: changes ['decoder_layer_stack'], which only an "
            "encoder-decoder has; the row has no decoder form",
        ),
        (
            {"variants": ["Transparent attention"]},
            ["--family", "encoder"],
            "variant 'Transparent attention' in the encoder family: transparent_attention=True is defined for the "
            "encoder-decoder (hfzoo_encoder_decoder) only",
        ),
        ({"config_name": "decoder-tiny", "config_overrides": {}}, [], "config_name 'decoder-tiny' is a hfzoo_decoder"),
    ],
    ids=[
        "unknown-variant",
        "unknown-modern-row",
        "muon-flag-for-an-adamw-row",
        "unknown-variant-flag",
        "missing-key",
        "unknown-key",
        "absent-glue-files",
        "unknown-glue-task",
        "zero-seeds",
        "zero-steps",
        "wrong-type",
        "absent-data",
        "row-does-not-scale",
        "bad-override",
        "batch-arithmetic",
        "bad-glue-args",
        "bad-pretrain-args",
        "unknown-family",
        "encoder-decoder-only-row",
        "cross-attention-row",
        "base-of-another-family",
    ],
)
def test_bad_input_is_refused_before_anything_is_trained(changes, flags, expected, inputs, tmp_path, capsys):
    # tokenizer_name null: had the checks passed, the study would first have trained a tokenizer
    study = tiny_study(inputs, tmp_path / "study.yaml", **{"tokenizer_name": None, **changes})
    message = expect_refusal(["--study", str(study), "--output_dir", str(tmp_path / "out"), *flags], capsys)
    assert message.startswith("error: ") and expected in message, message
    assert not (tmp_path / "out" / "tokenizer").exists() and not (tmp_path / "out" / "runs").exists()


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


def copy_inputs(inputs: dict[str, str], folder: Path) -> dict[str, str]:
    """The tiny study's inputs copied into `folder/data`, named relative to `folder` (`data/<name>`)."""
    (folder / "data").mkdir(parents=True)
    copies = {}
    for key, source in inputs.items():
        name = Path(source).name
        (shutil.copytree if Path(source).is_dir() else shutil.copy)(source, folder / "data" / name)
        copies[key] = f"data/{name}"
    return copies


def test_study_json_records_the_paths_as_given_and_the_runs_get_them_resolved(inputs, tmp_path, monkeypatch, capsys):
    """Relative paths stay relative in `study.json`, beside the data's sizes and digests; the recipes get them absolute."""
    from hfzoo.training import study as study_module

    relative = copy_inputs(inputs, tmp_path)
    monkeypatch.chdir(tmp_path)
    tiny_study(relative, tmp_path / "study.yaml")
    launched = []

    def first_stage_stops_the_study(module, argv, launcher):
        launched.append(argv)
        raise study_module.StudyInterrupted("stopped")

    monkeypatch.setattr(study_module, "run_stage", first_stage_stops_the_study)
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
    import dataclasses

    settings = load_settings(tiny_study(inputs, tmp_path / "study.yaml"))
    old = {k: v for k, v in dataclasses.asdict(settings).items() if k not in ("variants", "seeds")}
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "study.json").write_text(json.dumps({"settings": old}))
    prepare_output_dir(tmp_path / "out", settings, overwrite=False)
    assert json.loads((tmp_path / "out" / "study.json").read_text())["data"]["train_file"][0]["sha256"] == file_sha256(
        inputs["train"]
    )


def test_spearman_with_interval_known_answers():
    x = np.arange(10.0)
    # any monotone relation: rho 1 (-1 decreasing), in every resample too
    assert spearman_with_interval(x, 3 * x + 1) == pytest.approx((1.0, 1.0, 1.0))
    assert spearman_with_interval(x, -(x**3)) == pytest.approx((-1.0, -1.0, -1.0))
    # rho = 1 - 6 sum d^2 / (n (n^2 - 1)): two neighbouring ranks swapped twice: sum d^2 = 4, n = 10 -> 1 - 24/990
    y = np.array([1, 0, 2, 3, 4, 5, 6, 7, 9, 8], dtype=float)
    rho, low, high = spearman_with_interval(x, y)
    assert rho == pytest.approx(1 - 24 / 990) and low <= rho <= high <= 1.0
    assert (rho, low, high) == spearman_with_interval(x, y)  # the resampling is seeded: reproducible
    # the interval is scipy's percentile bootstrap of scipy's spearmanr (here evaluated one resample at a time)
    reference = stats.bootstrap(
        (x, y),
        lambda a, b: stats.spearmanr(a, b).statistic,
        paired=True,
        vectorized=False,
        n_resamples=999,
        method="percentile",
        rng=np.random.default_rng(0),
    )
    assert spearman_with_interval(x, y, n_resamples=999)[1:] == pytest.approx(tuple(reference.confidence_interval))
    # independent noise: an interval that contains 0
    rng = np.random.default_rng(1)
    _, low, high = spearman_with_interval(rng.normal(size=30), rng.normal(size=30))
    assert low < 0 < high
    assert all(math.isnan(v) for v in spearman_with_interval([1.0, 2.0], [2.0, 1.0]))  # two pairs: no rank test


def test_the_default_study_file_validates(data_dir, monkeypatch):
    """The shipped study: >= 15 Table 1 rows incl. vanilla, 3 GLU variants, RMSNorm, depth, sharing, embeddings, experts."""
    from hfzoo.study.runner import check_settings

    monkeypatch.chdir(REPO_ROOT)  # its paths are relative to the repository root
    settings = load_settings(DEFAULT_STUDY)
    assert len(settings.variants) >= 15 and len(settings.seeds) >= 3
    assert set(settings.variants) <= set(TABLE_1_ROWS) and "Vanilla Transformer" in settings.variants
    assert len(set(GLU_VARIANTS) & set(settings.variants)) >= 3 and "RMS Norm" in settings.variants
    assert any("layers" in v for v in settings.variants) and "Block sharing" in settings.variants
    assert any("mbedding" in v for v in settings.variants)
    assert {"Mixture of experts", "Switch Transformer"} & set(settings.variants)
    if not Path(settings.paper_table).is_file():
        pytest.skip(f"reference table not found at {settings.paper_table}")
    check_settings(settings)  # every variant builds on the base; the data, GLUE and paper files exist


def test_eval_seed_fixes_the_validation_corruption(inputs, tmp_path):
    """`--eval_seed` (the study's `eval_seed`) decides the held-out blocks' span corruption, not `--seed`."""
    from hfzoo.pretraining.loop import main as pretrain

    def init_loss(*extra: str) -> float:
        out = tmp_path / "-".join(extra)
        pretrain(["--objective", "span", "--train_file", inputs["train"], "--tokenizer_name", inputs["tokenizer"],
                  "--config_name", "encoder-decoder-tiny", "--config_overrides", "hidden_size=32,intermediate_size=64",
                  "--block_size", "32", "--max_train_steps", "1", "--max_eval_samples", "8",
                  "--validation_split_percentage", "25", "--output_dir", str(out), *extra])  # fmt: skip
        return json.loads((out / "all_results.json").read_text())["init_eval_loss"]

    default = init_loss("--seed", "3")
    assert init_loss("--seed", "3", "--eval_seed", "3") == default  # default: --seed
    assert init_loss("--seed", "3", "--eval_seed", "4") != default  # other corruption of the same blocks


# ------------------------------------------------------------------ busy machine: data once, time, baselines


def test_the_data_is_tokenized_once_per_study(inputs, tmp_path, monkeypatch):
    """The study tokenizes and packs the books once, before its runs; no run, later process or rerun tokenizes."""
    from transformers import PreTrainedTokenizerBase

    from hfzoo.study import runner

    relative = copy_inputs(inputs, tmp_path)  # a fresh path: nothing of it is in datasets' cache yet
    study = tiny_study(
        {k: str(tmp_path / v) for k, v in relative.items()},
        tmp_path / "study.yaml",
        variants=["Vanilla Transformer"],
        glue_tasks=["rte"],
    )
    calls, per_stage = [], []
    original_call, original_stage = PreTrainedTokenizerBase.__call__, runner.run_stage

    def counting_call(self, *args, **kwargs):
        if kwargs.get("return_attention_mask") is False:  # the packing's tokenize_function (GLUE keeps masks)
            calls.append(1)
        return original_call(self, *args, **kwargs)

    def counting_stage(module, argv, launcher):
        before = len(calls)
        original_stage(module, argv, launcher)
        per_stage.append((module, len(calls) - before))

    monkeypatch.setattr(PreTrainedTokenizerBase, "__call__", counting_call)
    monkeypatch.setattr(runner, "run_stage", counting_stage)
    out = tmp_path / "out"
    main(["--study", str(study), "--output_dir", str(out)])
    prepared = len(calls)
    assert prepared > 0  # the study's preparation tokenized the data ...
    pretraining = [n for module, n in per_stage if module == "hfzoo.pretraining"]
    assert pretraining == [0, 0]  # ... and both runs' pretraining loaded it from the cache
    preparation = json.loads((out / "preparation.json").read_text())["data"]
    assert preparation["train_blocks"] > 0 and preparation["validation_blocks"] > 0

    # a later study process on the folder (another seed), and a rerun of the finished study: no tokenization
    main(["--study", str(study), "--output_dir", str(out), "--seeds", "2"])
    main(["--study", str(study), "--output_dir", str(out)])
    assert len(calls) == prepared
    assert [module for module, _ in per_stage].count("hfzoo.pretraining") == 3


def test_time_accounting_of_runs_and_study(uninterrupted):
    """Each run's wall time splits into parts that sum to it; training time is the loop's summed step times."""
    results = read_results(uninterrupted)
    parts = ("train_steps", "pretrain_evaluation", "pretrain_other", "finetuning", "other")
    for record in results["runs"]:
        timing = record["timing"]
        assert set(timing["seconds"]) == set(parts)
        assert sum(timing["seconds"].values()) == pytest.approx(timing["run_seconds"], rel=1e-9)
        assert all(0.0 <= f <= 1.0 for f in timing["fractions"].values()), timing["fractions"]
        assert sum(timing["fractions"].values()) == pytest.approx(1.0)
        assert timing["seconds"]["finetuning"] > 0
        if record["variant"] == NO_PRETRAINING:
            assert timing["seconds"]["train_steps"] == 0 and "train_tflops" not in timing
            continue
        history = json.loads(
            (run_dir(uninterrupted, record["variant"], record["seed"]) / "pretrain" / "train_history.json").read_text()
        )
        measured = sum(r["step_seconds"] for r in history["log_history"])
        assert timing["seconds"]["train_steps"] > 0
        assert timing["seconds"]["train_steps"] == pytest.approx(measured, rel=0.02, abs=0.05)
        assert timing["seconds"]["pretrain_evaluation"] > 0
        assert timing["train_tflops"] == pytest.approx(record["total_flops"] / timing["train_step_seconds"] / 1e12)
    study = results["timing"]["study"]
    assert study["run_seconds"] == pytest.approx(sum(r["timing"]["run_seconds"] for r in results["runs"]))
    for part in parts:
        assert study["seconds"][part] == pytest.approx(sum(r["timing"]["seconds"][part] for r in results["runs"]))
    assert sum(study["fractions"].values()) == pytest.approx(1.0)
    pretrained = [r for r in results["runs"] if r["variant"] != NO_PRETRAINING]
    assert study["train_tflops"] == pytest.approx(
        sum(r["total_flops"] for r in pretrained) / sum(r["timing"]["train_step_seconds"] for r in pretrained) / 1e12
    )
    report = (uninterrupted / "results.md").read_text()
    section = report[report.index("## Where the time went") :]
    rows = parse_markdown_table(section)
    assert [r["Run"] for r in rows] == [v for v, _ in PLANNED] + ["All runs"]
    assert rows[-1]["training steps"] == f"{100 * study['fractions']['train_steps']:.1f}%"


def test_the_no_pretraining_row(uninterrupted):
    """The vanilla model finetuned from its seeded random initialisation: in the results and the downstream table,
    with every variant's gain over it, and outside the loss comparison with the paper."""
    import torch
    from accelerate.utils import set_seed
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    results = read_results(uninterrupted)
    rows = [r for r in results["runs"] if r["variant"] == NO_PRETRAINING]
    assert [r["seed"] for r in rows] == [0, 1]
    for record in rows:
        folder = run_dir(uninterrupted, NO_PRETRAINING, record["seed"])
        assert record["train_steps"] == 0 and record["total_flops"] == 0 and math.isnan(record["final_loss"])
        assert not (folder / "pretrain").exists() and set(record["glue"]) == {"sst2", "rte"}
        # never trained: its weights are those the seed initialises, not the vanilla run's pretrained ones
        config = AutoConfig.from_pretrained(folder / "init")
        set_seed(record["seed"])
        fresh = AutoModelForSeq2SeqLM.from_config(config, attn_implementation="eager").state_dict()
        saved = load_file(folder / "init" / "model.safetensors")
        assert saved and all(torch.equal(saved[k], fresh[k]) for k in saved)
        pretrained = load_file(run_dir(uninterrupted, VARIANTS[0], record["seed"]) / "pretrain" / "model.safetensors")
        assert any(not torch.equal(saved[k], pretrained[k]) for k in saved)
        argv = json.loads((folder / "glue" / "rte" / "all_results.json").read_text())
        assert argv["train_examples"] == 12
    assert NO_PRETRAINING not in results["summary"]
    downstream = results["downstream"]
    base = statistics_mean([r["glue_average"] for r in rows])
    assert downstream["no_pretraining"]["glue_average"] == pytest.approx(base)
    for variant in VARIANTS:
        gain = downstream["gains"][variant]["glue_average"]
        assert gain == pytest.approx(results["summary"][variant]["glue_average"] - base)
    report = (uninterrupted / "results.md").read_text()
    table = parse_markdown_table(report[report.index("## Downstream: gain over no pretraining") :])
    assert [r["Model"] for r in table] == [NO_PRETRAINING, *VARIANTS]
    assert table[2]["gain"] == f"{downstream['gains']['SwiGLU']['glue_average']:+.1f}"
    main_table = parse_markdown_table(report)
    assert NO_PRETRAINING not in [r["Model"] for r in main_table]


def test_a_study_without_glue_tasks_pretrains_only(inputs, tmp_path):
    """`glue_tasks: []`: no finetuning and no "No pretraining" runs; the report has no downstream column or row."""
    study = tiny_study(inputs, tmp_path / "study.yaml", variants=VARIANTS, seeds=[0, 1], glue_tasks=[])
    out = tmp_path / "out"
    records = main(["--study", str(study), "--output_dir", str(out)])
    assert [(r["variant"], r["seed"]) for r in records] == [(v, s) for v in VARIANTS for s in (0, 1)]
    assert all(r["glue"] == {} and r["final_loss"] < r["init_loss"] for r in records)
    assert not any((run_dir(out, v, s) / "glue").exists() for v in VARIANTS for s in (0, 1))
    results = read_results(out)
    assert results["downstream"] is None and set(results["agreement"]) == {"Early loss", "Final loss"}
    report = (out / "results.md").read_text()
    assert "no finetuning (the study lists no GLUE tasks)." in report and "## Downstream" not in report
    table = parse_markdown_table(report)
    assert list(table[0]) == ["Model", "", "Params", "Ops", "Step/s", "Early loss", "Final loss",
                              "Better than vanilla (>2σ)"]  # fmt: skip
    vanilla = [r["final_loss"] for r in records[:2]]
    assert table[0]["Final loss"] == f"{np.mean(vanilla):.3f} ± {np.std(vanilla, ddof=1):.3f}"


def statistics_mean(values: list[float]) -> float:
    return sum(values) / len(values)


def test_parallel_runs_auto_sizing():
    """`auto` sizes from free memory, the per-run estimate and the cores (numbers injected: no GPU here)."""
    from hfzoo.study.parallel import CUDA_PROCESS_BYTES, estimate_run_bytes, plan_parallel_runs

    gib = 2**30
    # one H100 with 80 GiB free, 16 cores: memory allows 57 runs of 1.25 GiB; the cores cap it at 16
    plan = plan_parallel_runs(device="cuda", per_run_bytes=int(1.25 * gib), free_memory_bytes=80 * gib, cpu_cores=16)
    assert (plan.processes, plan.threads) == (16, 1) and "CPU cores" in plan.reason
    # 10 GiB free: floor(0.9 x 10 / 1.25) = 7 processes, 16 // 7 = 2 threads each
    plan = plan_parallel_runs(device="cuda", per_run_bytes=int(1.25 * gib), free_memory_bytes=10 * gib, cpu_cores=16)
    assert (plan.processes, plan.threads) == (7, 2) and "memory" in plan.reason
    # CPU: one single-threaded process per core while the RAM allows, at least one
    plan = plan_parallel_runs(device="cpu", per_run_bytes=gib, free_memory_bytes=64 * gib, cpu_cores=2)
    assert (plan.processes, plan.threads) == (2, 1)
    assert plan_parallel_runs(device="cpu", per_run_bytes=2 * gib, free_memory_bytes=gib, cpu_cores=8).processes == 1
    plan = plan_parallel_runs(device="cpu", per_run_bytes=gib, free_memory_bytes=64 * gib, cpu_cores=8, runs=3)
    assert (plan.processes, plan.threads) == (3, 2) and "runs left" in plan.reason  # no more processes than runs
    with pytest.raises(ValueError, match="per_run_bytes and cpu_cores must be positive"):
        plan_parallel_runs(device="cpu", per_run_bytes=0, free_memory_bytes=gib, cpu_cores=2)
    # the estimate: Korthikanti et al.'s s b h (34 + 5 a s / h) bytes per 16-bit layer, 16 bytes per parameter,
    # 3 fp32 copies of the logits, and the fixed per-process cost
    b, s_in, s_out, h, a, v = 16, 128, 30, 128, 2, 4096
    layers = 4 * s_in * b * h * (34 + 5 * a * s_in / h) + 4 * s_out * b * h * (34 + 5 * a * s_out / h)
    expected = CUDA_PROCESS_BYTES + 16 * 2_370_000 + layers + 12 * b * s_out * v
    kwargs = dict(batch_size=b, input_length=s_in, target_length=s_out, hidden_size=h, num_heads=a, encoder_layers=4,
                  decoder_layers=4, vocab_size=v, device="cuda")  # fmt: skip
    assert estimate_run_bytes(2_370_000, half_precision=True, **kwargs) == int(expected)
    assert estimate_run_bytes(2_370_000, half_precision=False, **kwargs) == int(expected + layers)


def test_parallel_runs_auto_resolves_here_and_bad_values_are_refused(inputs, tmp_path, capsys):
    from hfzoo.study.parallel import cpu_cores
    from hfzoo.study.runner import check_settings, resolve_parallel_runs, resolve_paths

    settings = resolve_paths(load_settings(tiny_study(inputs, tmp_path / "study.yaml")))
    plan = resolve_parallel_runs(settings, 1, check_settings(settings)["tokenizer_fields"])
    assert plan.device == "cpu" and 1 <= plan.processes <= cpu_cores() and plan.threads >= 1
    assert plan.processes * plan.threads <= cpu_cores()
    study = str(tmp_path / "study.yaml")
    for value in ("0", "many", "-2"):
        with pytest.raises(SystemExit) as exc:
            main(["--study", study, "--output_dir", str(tmp_path / "out"), "--parallel_runs", value])
        assert exc.value.code == 2
        message = capsys.readouterr().err.strip()
        assert "\n" not in message and "argument --parallel_runs: expected a positive integer or 'auto'" in message
    assert not (tmp_path / "out").exists()


def test_the_gpu_study_file_has_the_default_protocol_and_rows(data_dir, monkeypatch):
    """`narang_gpu.yaml`: the default study's rows, seeds, data, objective and finetuning; only the scale differs."""
    from hfzoo.study.runner import check_settings

    monkeypatch.chdir(REPO_ROOT)
    small, gpu = load_settings(DEFAULT_STUDY), load_settings(REPO_ROOT / "recipes" / "studies" / "narang_gpu.yaml")
    scale = {"config_overrides", "train_batch_tokens", "max_train_steps", "learning_rate", "num_warmup_steps"}
    differ = {k for k in vars(small) if getattr(small, k) != getattr(gpu, k)}
    assert {"config_overrides", "max_train_steps"} <= differ <= scale, differ  # a larger model trained longer
    assert gpu.max_train_steps % 8 == 0 and gpu.num_warmup_steps < gpu.max_train_steps
    if not Path(gpu.paper_table).is_file():
        pytest.skip(f"reference table not found at {gpu.paper_table}")
    check_settings(gpu)  # every row scales to the wider base; the data, GLUE and paper files exist


def test_a_constant_prediction_scores_zero_correlation_not_nan():
    """STS-B's Pearson/Spearman of a constant prediction is NaN in scipy; the task score counts it as 0."""
    from hfzoo.metrics import load_glue_metric
    from hfzoo.study.runner import _glue_task_score

    metric = load_glue_metric("stsb")
    with np.errstate(all="ignore"), pytest.warns(stats.ConstantInputWarning):
        constant = metric.compute(predictions=[2.5] * 8, references=[0.0, 1, 2, 3, 4, 5, 1.5, 2.5])
    assert math.isnan(constant["pearson"])
    score, metrics = _glue_task_score("stsb", {f"eval_{k}": v for k, v in constant.items()})
    assert score == 0.0 and metrics == {"pearson": 0.0, "spearmanr": 0.0}
    varied = metric.compute(predictions=[0.1, 1, 2.2, 3, 3.9, 5, 1.4, 2.4], references=[0.0, 1, 2, 3, 4, 5, 1.5, 2.5])
    score, _ = _glue_task_score("stsb", {f"eval_{k}": v for k, v in varied.items()})
    assert score == pytest.approx(50 * (varied["pearson"] + varied["spearmanr"])) and score > 90


MODERN_STUDY = REPO_ROOT / "recipes" / "studies" / "modern.yaml"
#: The tiny modern study: the baseline, one config row, the optimizer row, and every switch with Muon.
MODERN_VARIANTS = ["Vanilla Transformer", "QK-norm", "Muon", "All together"]


@pytest.mark.slow
def test_a_study_of_todays_modifications_runs_end_to_end(inputs, tmp_path, monkeypatch):
    """Config rows get their switches, the Muon rows train with Muon, and the report lists rows without paper figures."""
    import hfzoo.pretraining.loop as loop
    from hfzoo.models.modern import MODERN_ROWS
    from hfzoo.training.optimization import MuonWithAdamW

    built = []  # (the pretrained model's config, its optimizer), one per pretraining run, in study order

    def recording_create_optimizer(model, **kwargs):
        optimizer = loop_create_optimizer(model, **kwargs)
        built.append((model.config, optimizer))
        return optimizer

    loop_create_optimizer = loop.create_optimizer
    monkeypatch.setattr(loop, "create_optimizer", recording_create_optimizer)
    study = tiny_study(inputs, tmp_path / "study.yaml", variants=MODERN_VARIANTS, seeds=[0])
    records = main(["--study", str(study), "--output_dir", str(tmp_path / "out")])
    assert [r["variant"] for r in records] == [*MODERN_VARIANTS, NO_PRETRAINING]

    switches = {"qk_norm", "hidden_act", "attn_logit_softcapping", "final_logit_softcapping", "value_residual",
                "unet_skips"}  # fmt: skip
    assert set(MODERN_ROWS["All together"]) == switches
    assert len(built) == len(MODERN_VARIANTS)
    for record, (config, optimizer) in zip(records, built):
        row = MODERN_ROWS.get(record["variant"], {})
        assert record["config_changes"] == row
        saved = json.loads((run_dir(tmp_path / "out", record["variant"], 0) / "pretrain" / "config.json").read_text())
        for key in switches:  # the row's value where it sets one, the baseline's elsewhere
            expected = row.get(key, getattr(built[0][0], key))
            assert getattr(config, key) == expected and saved[key] == expected, (record["variant"], key)
        uses_muon = record["variant"] in ("Muon", "All together")
        assert record["pretrain_changes"] == ({"optim": "muon"} if uses_muon else {})
        assert isinstance(optimizer, MuonWithAdamW) == uses_muon, record["variant"]
        if uses_muon:  # Muon stepped: every hidden matrix it owns has a momentum buffer
            owned = [p for group in optimizer.muon.param_groups for p in group["params"]]
            assert owned and all("momentum_buffer" in optimizer.muon.state[p] for p in owned)
        assert record["final_loss"] < record["init_loss"]
    assert records[-1]["pretrain_changes"] == {}
    # All together's model has more parameters than vanilla (QK-norm scales, value and skip weights) only
    assert records[3]["parameters"] > records[0]["parameters"] == records[2]["parameters"]

    # The rows missing from the paper's table get our figures only and stay out of the comparison with it.
    table = parse_markdown_table((tmp_path / "out" / "results.md").read_text())
    assert [(r["Model"], r[""]) for r in table] == [
        ("Vanilla Transformer", "hfzoo"),
        ("", "paper"),
        *[(v, "hfzoo") for v in MODERN_VARIANTS[1:]],
    ]
    assert (
        "Not in the paper's table (our row only, left out of the agreement with the paper): QK-norm, Muon, "
        "All together." in (tmp_path / "out" / "results.md").read_text()
    )
    results = read_results(tmp_path / "out")
    assert set(results["summary"]) >= set(MODERN_VARIANTS)
    agreement = results["agreement"].values()
    assert {c["variants"] for c in agreement} == {1} and all(math.isnan(c["rho"]) for c in agreement)  # vanilla only


def test_the_modern_study_file_has_the_gpu_protocol_and_todays_rows(data_dir, monkeypatch):
    """`modern.yaml`: narang_gpu.yaml's scale and protocol; the vanilla row, every modern switch alone, all together."""
    from hfzoo.models.modern import MODERN_ROWS
    from hfzoo.study.runner import check_settings

    monkeypatch.chdir(REPO_ROOT)
    gpu, modern = load_settings(REPO_ROOT / "recipes" / "studies" / "narang_gpu.yaml"), load_settings(MODERN_STUDY)
    differ = {k for k in vars(gpu) if getattr(gpu, k) != getattr(modern, k)}
    assert differ == {"variants"}, differ
    assert modern.variants == ["Vanilla Transformer", *MODERN_ROWS]
    if not Path(modern.paper_table).is_file():
        pytest.skip(f"reference table not found at {modern.paper_table}")
    check_settings(modern)  # every row builds on the base and its pretraining arguments pass the recipe's checks


def test_the_small_modern_study_file_has_the_cpu_scale_and_todays_rows(data_dir, monkeypatch):
    """`modern_small.yaml`: narang_small.yaml's scale and protocol with modern.yaml's rows, pretraining only."""
    from hfzoo.study.runner import check_settings

    monkeypatch.chdir(REPO_ROOT)
    small = load_settings(DEFAULT_STUDY)
    modern = load_settings(MODERN_STUDY)
    modern_small = load_settings(REPO_ROOT / "recipes" / "studies" / "modern_small.yaml")
    differ = {k for k in vars(small) if getattr(small, k) != getattr(modern_small, k)}
    assert differ == {"variants", "glue_tasks"}, differ
    assert modern_small.variants == modern.variants and modern_small.glue_tasks == []
    if not Path(modern_small.paper_table).is_file():
        pytest.skip(f"reference table not found at {modern_small.paper_table}")
    for family in ("encoder-decoder", "decoder", "encoder"):
        check_settings(dataclasses.replace(modern_small, family=family))


@pytest.mark.slow
@pytest.mark.parametrize("family", ["decoder", "encoder"])
def test_the_rows_run_in_the_decoder_and_encoder_families(family, inputs, tmp_path):
    """`--family`: every row pretrains as one stack of the base's width with the layers of both its stacks (causal LM
    for the decoder, masked LM for the encoder) with the family's own tokenizer, then finetunes; the report says so."""
    from transformers import AutoConfig, AutoTokenizer

    from hfzoo.models.flops import count_training_flops
    from hfzoo.study.protocol import FAMILIES
    from hfzoo.tokenization import FAMILY_SPECIAL_TOKENS

    variants = ["Vanilla Transformer", "All together"]
    study = tiny_study(inputs, tmp_path / "study.yaml", variants=variants, seeds=[0], tokenizer_name=None,
                       tokenizer_train_file=[inputs["train"]], tokenizer_vocab_size=384, glue_tasks=["sst2"])  # fmt: skip
    out = tmp_path / "out"
    records = main(["--study", str(study), "--output_dir", str(out), "--family", family])
    assert [r["variant"] for r in records] == [*variants, NO_PRETRAINING]
    assert json.loads((out / "study.json").read_text())["settings"]["family"] == family

    tokenizer = AutoTokenizer.from_pretrained(out / "tokenizer")  # the study's own, with the family's tokens
    for role, token in FAMILY_SPECIAL_TOKENS[family]["special_tokens"].items():
        assert getattr(tokenizer, role) == token
    architecture = {"decoder": "HfzooDecoderForCausalLM", "encoder": "HfzooEncoderForMaskedLM"}[family]
    for record in records:
        folder = run_dir(out, record["variant"], 0)
        model_dir = folder / ("init" if record["variant"] == NO_PRETRAINING else "pretrain")
        config = AutoConfig.from_pretrained(model_dir)
        assert config.model_type == FAMILIES[family].model_type and config.num_hidden_layers == 4  # 2 + 2
        assert config.architectures == [architecture] and config.vocab_size == len(tokenizer)
        assert 0 <= record["glue"]["sst2"]["score"] <= 100
        if record["variant"] == NO_PRETRAINING:
            continue
        assert record["final_loss"] < record["init_loss"]
        assert record["flops_per_token"] == count_training_flops(config, 32).per_token  # one stack, 32 tokens
        if record["variant"] == "All together":
            assert config.qk_norm == "rms_norm" and config.unet_skips and config.value_residual
    assert f"Every run: {FAMILIES[family].loss} pretraining of the {family}" in (out / "results.md").read_text()


def test_a_run_folder_is_reused_only_for_the_row_it_trained(inputs, tmp_path, capsys, monkeypatch):
    """Two rows with one folder name: a finished run of one is never reported under the other's name."""
    from hfzoo.study import runner

    held, wanted = "Factorized & shared embeddings", "+ Factorized & shared embeddings"
    assert run_dir(tmp_path, held, 0) == run_dir(tmp_path, wanted, 0)  # the folder names collide
    out = tmp_path / "out"
    first = tiny_study(inputs, tmp_path / "a.yaml", variants=[held], seeds=[0], glue_tasks=[], max_train_steps=8)
    assert [r["variant"] for r in main(["--study", str(first), "--output_dir", str(out)])] == [held]
    folder = run_dir(out, held, 0)
    key = json.loads((folder / "run.json").read_text())
    assert (key["variant"], key["family"], key["seed"]) == (held, "encoder-decoder", 0)
    assert key["config"]["embedding_size"] == 8 and key["config"]["hidden_size"] == 32
    results = (out / "results.json").read_text()

    def no_stage(module, argv, launcher):
        raise AssertionError(f"{module} started: the refusal must come before any work")

    monkeypatch.setattr(runner, "run_stage", no_stage)
    second = tiny_study(inputs, tmp_path / "b.yaml", variants=[wanted], seeds=[0], glue_tasks=[], max_train_steps=8)
    message = expect_refusal(["--study", str(second), "--output_dir", str(out)], capsys)
    assert f"{folder} holds the run of row {held!r}, not of the requested row {wanted!r}" in message, message
    assert (out / "results.json").read_text() == results
    # A folder written before run.json existed: its result.json names the row.
    (folder / "run.json").unlink()
    message = expect_refusal(["--study", str(second), "--output_dir", str(out)], capsys)
    assert f"holds the run of row {held!r}, not of the requested row {wanted!r}" in message, message
    # The same row with another resolved config (here written by hand) is refused too, naming the field.
    key["config"]["embedding_size"] = 16
    (folder / "run.json").write_text(json.dumps(key))
    message = expect_refusal(["--study", str(first), "--output_dir", str(out)], capsys)
    assert "with another config (embedding_size=16 there, 8 requested)" in message, message
    key["config"]["embedding_size"] = 8
    (folder / "run.json").write_text(json.dumps(key))
    assert [r["variant"] for r in main(["--study", str(first), "--output_dir", str(out)])] == [held]


def test_unknown_rows_name_the_closest_and_row_refusals_advise_what_a_study_can_change(inputs, tmp_path, capsys):
    study = tiny_study(inputs, tmp_path / "s.yaml", tokenizer_name=None, variants=["+ Factorized & shared embedding"])
    message = expect_refusal(["--study", str(study), "--output_dir", str(tmp_path / "out")], capsys)
    assert "did you mean '+ Factorized & shared embeddings' or 'Factorized & shared embeddings'" in message, message
    assert "Vanilla Transformer" not in message and len(message) < 400, message
    study = tiny_study(inputs, tmp_path / "t.yaml", tokenizer_name=None, variants=["Transparent attention"])
    message = expect_refusal(["--study", str(study), "--output_dir", str(tmp_path / "out"), "--family", "encoder"],
                             capsys)  # fmt: skip
    assert "transparent_attention=False" not in message, message
    assert message.endswith("leave the row out of variants, or study it with family 'encoder-decoder'"), message
    assert not (tmp_path / "out").exists()


def test_the_launchers_config_is_checked_before_anything_is_trained(inputs, tmp_path, capsys):
    config = yaml.safe_load((REPO_ROOT / "accelerate_configs" / "fsdp2.yaml").read_text())
    config["deepspeed_config"] = {"zero_stage": 2}
    (tmp_path / "launch.yaml").write_text(yaml.safe_dump(config))
    study = tiny_study(inputs, tmp_path / "study.yaml", tokenizer_name=None)
    launcher = f"accelerate launch --config_file {tmp_path / 'launch.yaml'}"
    message = expect_refusal(["--study", str(study), "--output_dir", str(tmp_path / "out"), "--launcher", launcher,
                              "--num_processes", "2"], capsys)  # fmt: skip
    assert message == (f"error: {tmp_path / 'launch.yaml'}: deepspeed_config: settings of DEEPSPEED, but "
                       "distributed_type is FSDP (accelerate would ignore them); remove the section or set "
                       "distributed_type: DEEPSPEED")  # fmt: skip
    assert not (tmp_path / "out").exists()
