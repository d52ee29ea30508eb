"""recipes/finetune_glue.py and glue_sweep.py end to end on tiny checkpoints of every family, and bad input."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers.glue_files import LAYOUTS, write_glue_dir, write_tsv
from helpers.paths import minilm_dir
from helpers.pretraining import restored_steps, tag_saved_history
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertForMaskedLM,
)

import hfzoo  # noqa: F401
from hfzoo.data.glue import GLUE_TASKS, load_glue
from hfzoo.finetuning.adapters import build_peft_config, count_parameters, load_peft_model, wrap_with_peft
from hfzoo.finetuning.glue import DEFAULT_MAX_LENGTH, parse_glue_args, resolve_max_length
from hfzoo.finetuning.glue import main as finetune
from hfzoo.finetuning.loop import GLUE_STATE
from hfzoo.metrics import load_glue_metric
from hfzoo.models.flops import count_classification_flops
from hfzoo.models.presets import build_config
from hfzoo.training.checkpointing import MANIFEST, verify_checkpoint, write_manifest
from hfzoo.training.faults import CheckpointError

REPO = Path(__file__).resolve().parents[2]
TINY = "hidden_size=32,intermediate_size=64,num_attention_heads=4,max_position_embeddings=160"


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """Tiny randomly initialised checkpoints of the three families and a stock BERT, with MiniLM's tokenizer."""
    tokenizer = AutoTokenizer.from_pretrained(minilm_dir())
    root = tmp_path_factory.mktemp("ckpt")
    special = dict(vocab_size=tokenizer.vocab_size, pad_token_id=tokenizer.pad_token_id,
                   eos_token_id=tokenizer.sep_token_id)  # fmt: skip
    for preset in ("encoder-tiny", "decoder-tiny", "encoder-decoder-tiny"):
        extra = {"decoder_start_token_id": tokenizer.cls_token_id} if preset == "encoder-decoder-tiny" else {}
        config = build_config(preset, TINY, **special, **extra)
        torch.manual_seed(0)
        AutoModel.from_config(config).save_pretrained(root / preset)  # a pretrained body, no task head
        tokenizer.save_pretrained(root / preset)
    bert = BertForMaskedLM(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                                      num_attention_heads=4, intermediate_size=64))  # fmt: skip
    bert.save_pretrained(root / "bert")
    tokenizer.save_pretrained(root / "bert")
    return {**{p: root / p for p in ("encoder-tiny", "decoder-tiny", "encoder-decoder-tiny")}, "bert": root / "bert"}


@pytest.fixture(scope="module")
def glue_dir(tmp_path_factory) -> Path:
    """Every task in the GLUE layout, 8 copies of the layout rows per file (two batches of 4 per epoch... and more)."""
    root = tmp_path_factory.mktemp("glue")
    for task in GLUE_TASKS:
        spec = GLUE_TASKS[task]
        rows = LAYOUTS[task]["rows"] * 8
        write_tsv(root / spec.folder / spec.train_file, task, rows=rows)
        for name in spec.validation_files.values():
            write_tsv(root / spec.folder / name, task, rows=rows[:6])
    return root


def argv(ckpt: Path, data: Path, out: Path, task: str, *extra: str) -> list[str]:
    """fp32 (not the default `auto`): the checks recompute the dev metrics in fp32 from the saved weights."""
    return ["--task_name", task, "--model_name_or_path", str(ckpt), "--data_dir", str(data), "--output_dir",
            str(out), "--per_device_train_batch_size", "4", "--max_train_steps", "3", "--max_length", "32",
            "--learning_rate", "1e-3", "--mixed_precision", "no", *extra]  # fmt: skip


@pytest.mark.parametrize(
    ("family", "task", "method"),
    [("encoder-tiny", "mrpc", "lora"), ("decoder-tiny", "sst2", "prefix"), ("encoder-decoder-tiny", "stsb", "prefix"),
     ("encoder-decoder-tiny", "rte", "lora"), ("encoder-tiny", "cola", "none"), ("bert", "wnli", "lora")],
)  # fmt: skip
def test_recipe_end_to_end(family, task, method, checkpoints, glue_dir, tmp_path):
    out = tmp_path / "run"
    results = finetune(argv(checkpoints[family], glue_dir, out, task, "--peft", method))
    saved = json.loads((out / "all_results.json").read_text())
    assert saved == json.loads(json.dumps(results))
    assert saved["train_steps"] == 3 and saved["task"] == task and saved["peft"] == method
    assert (saved["mixed_precision"], saved["mixed_precision_reason"]) == ("no", "--mixed_precision no as given")
    for metric in GLUE_TASKS[task].metrics:
        assert (
            isinstance(saved[f"eval_{metric}"], float) and saved[f"eval_{metric}"] == saved[f"last_epoch_eval_{metric}"]
        )
    evaluation = json.loads((out / "eval_results.json").read_text())
    assert evaluation == {k: v for k, v in saved.items() if k.startswith("eval_") or k == "epoch"}
    assert set(evaluation) == {"epoch", "eval_loss", *(f"eval_{m}" for m in GLUE_TASKS[task].metrics)}
    assert 0 < saved["trainable_fraction"] <= 1 and (saved["trainable_fraction"] == 1) == (method == "none")
    assert (out / ("adapter_model.safetensors" if method != "none" else "model.safetensors")).is_file()
    assert (out / "tokenizer.json").is_file()
    if task in ("mrpc", "stsb"):
        # What was saved is what was evaluated: the reloaded model reproduces the dev metric.
        model = load_peft_model(out, checkpoints[family], num_labels=GLUE_TASKS[task].num_labels)
        tokenizer = AutoTokenizer.from_pretrained(out)
        dev = load_glue(task, data_dir=glue_dir)["validation"]
        # The BERT tokenizer's segment ids only for the encoder: the other families have no segment embeddings.
        enc = tokenizer(*[list(dev[c]) for c in GLUE_TASKS[task].text_names], truncation=True, max_length=32,
                        padding=True, return_tensors="pt", return_token_type_ids=family.startswith(("encoder-tiny", "bert")))  # fmt: skip
        with torch.no_grad():
            logits = model(**enc).logits
        predictions = logits.squeeze(-1) if task == "stsb" else logits.argmax(-1)
        metric = load_glue_metric(task).compute(predictions=predictions.numpy(), references=list(dev["label"]))
        for name, value in metric.items():
            assert value == pytest.approx(saved[f"eval_{name}"], abs=1e-5), name


def test_mnli_reports_matched_and_mismatched(checkpoints, glue_dir, tmp_path):
    results = finetune(argv(checkpoints["encoder-tiny"], glue_dir, tmp_path / "mnli", "mnli"))
    assert {k for k in results if k.startswith("eval_")} == {
        "eval_accuracy",
        "eval_loss",
        "eval_accuracy_mm",
        "eval_loss_mm",
    }


def test_lora_trains_under_three_percent_of_minilm(tmp_path):
    from hfzoo.convert import convert_bert_checkpoint

    path = convert_bert_checkpoint(minilm_dir(), tmp_path / "minilm")
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=2)
    trainable, total = count_parameters(wrap_with_peft(model, build_peft_config("lora", model.config)))
    assert 0.005 < trainable / total < 0.03


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("task", "unknown GLUE task 'sst3'"),
        ("missing-file", "missing .*RTE/dev.tsv"),
        ("missing-column", r"lacks column\(s\) \['sentence2'\]"),
        ("bad-label", "label 'maybe' is not one of"),
        ("no-config", r"--model_name_or_path \S+/not-a-model: Unrecognized model in \S+/not-a-model"),
        ("prefix-too-long", r"--num_virtual_tokens 150 \+ --max_length 32 = 182 positions exceeds"),
        (
            "max-length",
            r"--max_length 1000 is longer than the model's max_position_embeddings=\d+; use --max_length <=",
        ),
    ],
)
def test_bad_input_fails_before_training(change, message, checkpoints, glue_dir, tmp_path, capsys):
    data = tmp_path / "glue"
    write_glue_dir(data, "rte")
    task, extra, ckpt = "rte", [], checkpoints["encoder-tiny"]
    if change == "task":
        task = "sst3"
    elif change == "missing-file":
        (data / "RTE" / "dev.tsv").unlink()
    elif change == "missing-column":
        write_tsv(data / "RTE" / "dev.tsv", "rte", header=["index", "sentence1", "hypothesis", "label"])
    elif change == "bad-label":
        write_tsv(data / "RTE" / "train.tsv", "rte", rows=[(("a", "b"), "maybe", None)])
    elif change == "no-config":  # a folder, but not a checkpoint
        ckpt = tmp_path / "not-a-model"
        ckpt.mkdir()
    elif change == "max-length":  # refused even though truncation would keep RTE's short examples within it
        extra = ["--max_length", "1000"]
    else:
        extra = ["--peft", "prefix", "--num_virtual_tokens", "150"]
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        finetune(argv(ckpt, data, out, task, *extra))
    assert exit_info.value.code != 0
    import re

    assert re.search(message, str(exit_info.value)), str(exit_info.value)
    assert "\n" not in str(exit_info.value)
    assert not out.exists()  # nothing trained or written


def test_ids_or_labels_the_model_cannot_take_are_refused_before_training(checkpoints, tmp_path, capsys):
    data = tmp_path / "glue"
    write_glue_dir(data, "rte")
    small = tmp_path / "small-vocab"  # the tokenizer's ids reach far beyond this model's 1,000 rows
    config = AutoConfig.from_pretrained(checkpoints["encoder-tiny"], vocab_size=1000)
    AutoModel.from_config(config).save_pretrained(small)
    AutoTokenizer.from_pretrained(checkpoints["encoder-tiny"]).save_pretrained(small)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        finetune(argv(small, data, out, "rte"))
    assert re.search(r"GLUE train split: token id \d+ is outside \[0, vocab_size=1000\)", str(exit_info.value))
    assert not out.exists()


def test_an_encoder_decoder_without_its_end_of_sequence_token_in_the_data_is_refused_before_training(
    checkpoints, tmp_path
):
    """Its classifier pools the decoder's state at the last eos; the loop's forwards no longer check that."""
    data = tmp_path / "glue"
    write_glue_dir(data, "rte")
    model_dir = tmp_path / "eos-never-appended"  # the tokenizer ends rows with [SEP]; the config names [MASK]
    tokenizer = AutoTokenizer.from_pretrained(checkpoints["encoder-decoder-tiny"])
    config = AutoConfig.from_pretrained(checkpoints["encoder-decoder-tiny"], eos_token_id=tokenizer.mask_token_id)
    AutoModel.from_config(config).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        finetune(argv(model_dir, data, out, "rte"))
    message = str(exit_info.value)
    assert f"GLUE train split: row 0 has no end-of-sequence token (eos_token_id={tokenizer.mask_token_id})" in message
    assert "\n" not in message
    assert not out.exists()


def test_the_eos_check_numbers_rows_across_the_datasets_chunks():
    """A dataset of several Arrow chunks (concatenated splits): the row without eos is named by its index."""
    from types import SimpleNamespace

    from datasets import Dataset, concatenate_datasets

    from hfzoo.finetuning.glue import check_encoded_inputs

    config = SimpleNamespace(vocab_size=10, num_labels=2, is_encoder_decoder=True, eos_token_id=1)
    first = Dataset.from_dict({"input_ids": [[5, 1], [2, 3, 1]], "labels": [0, 1]})
    second = Dataset.from_dict({"input_ids": [[4, 4], [1], [6, 1]], "labels": [1, 0, 1]})  # chunk-relative: row 3
    train = concatenate_datasets([first, second])
    assert len(train.data.column("input_ids").chunks) == 2
    with pytest.raises(ValueError, match=r"^GLUE train split: row 2 has no end-of-sequence token \(eos_token_id=1\)"):
        check_encoded_inputs({"train": train}, config, pad_token_id=0)
    every_row = Dataset.from_dict({"input_ids": [[1], [4, 1]], "labels": [1, 0]})
    check_encoded_inputs({"train": concatenate_datasets([first, every_row])}, config, pad_token_id=0)


def test_the_input_checks_judge_the_rows_a_select_or_shuffle_kept():
    """A selected or shuffled dataset shares its parent's Arrow table: the checks read its own rows, in its order."""
    from types import SimpleNamespace

    from datasets import Dataset

    from hfzoo.finetuning.glue import check_encoded_inputs

    config = SimpleNamespace(vocab_size=10, num_labels=2, is_encoder_decoder=True, eos_token_id=1)
    parent = Dataset.from_dict({"input_ids": [[5, 1], [4, 4], [2, 1], [3, 12]], "labels": [0, 1, 1, 7]})
    check_encoded_inputs({"train": parent.select([2, 0])}, config, pad_token_id=0)  # rows 1 and 3 left out
    with pytest.raises(ValueError, match=r"^GLUE train split: row 2 has no end-of-sequence token"):
        check_encoded_inputs({"train": parent.select([2, 0, 1])}, config, pad_token_id=0)
    with pytest.raises(ValueError, match=r"^GLUE validation split: token id 12 is outside \[0, vocab_size=10\)"):
        check_encoded_inputs({"train": parent.select([0]), "validation": parent.select([3])}, config, pad_token_id=0)


def test_the_loop_trains_and_evaluates_without_the_models_own_value_checks(checkpoints, glue_dir, tmp_path,
                                                                            monkeypatch):  # fmt: skip
    from hfzoo.modules import heads

    # The classification head asks whether to check its labels' values in every forward with labels (training
    # and evaluation): inside caller_checked_ids() the answer is no (check_encoded_inputs checked them before).
    answers, real = [], heads.model_value_checks_enabled
    monkeypatch.setattr(heads, "model_value_checks_enabled", lambda: answers.append(real()) or answers[-1])
    finetune(argv(checkpoints["encoder-tiny"], glue_dir, tmp_path / "run", "rte"))
    assert len(answers) >= 3 + 1 and not any(answers)  # 3 training steps, a dev batch


def test_max_length_defaults_to_what_the_position_table_holds():
    small = build_config("encoder-tiny", "max_position_embeddings=64")
    large = build_config("encoder-tiny", "max_position_embeddings=512")
    assert resolve_max_length(small, None) == 64 < DEFAULT_MAX_LENGTH
    assert resolve_max_length(large, None) == DEFAULT_MAX_LENGTH
    assert resolve_max_length(small, 64) == 64 and resolve_max_length(large, 300) == 300
    with pytest.raises(ValueError, match="--max_length 65 is longer than the model's max_position_embeddings=64"):
        resolve_max_length(small, 65)


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [
        ("--weight_decay", "-0.1", "--weight_decay: must be a finite number >= 0, got -0.1"),
        ("--torch_compile_backend", "indcutor", "unknown torch.compile backend 'indcutor'; known backends: "),
        ("--seed", "-7", "--seed: must be an integer in [0, 4294967295], got -7"),
        ("--learning_rate", "inf", "--learning_rate: must be a finite number > 0, got inf"),
        ("--max_grad_norm", "nan", "--max_grad_norm: must be a finite number, got nan"),
    ],
    ids=["weight-decay", "compile-backend", "seed", "lr-inf", "max-grad-norm-nan"],
)
def test_bad_flag_values_are_refused_when_parsed(flag, value, message, checkpoints, glue_dir, tmp_path, capsys):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        finetune(argv(checkpoints["encoder-tiny"], glue_dir, out, "sst2", flag, value))
    assert exit_info.value.code == 2
    error = capsys.readouterr().err.strip()
    assert message in error and "\n" not in error
    assert not out.exists()


#: The required arguments of a parse-only check.
PARSE_BASE = ["--task_name", "sst2", "--model_name_or_path", "m", "--output_dir", "o"]


def parse_refusal(argv: list[str], capsys) -> str:
    """argparse's error (exit status 2) for `parse_glue_args(argv)`."""
    with pytest.raises(SystemExit) as exit_info:
        parse_glue_args(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--num_virtual_tokens", "5"], "--num_virtual_tokens: --peft prefix only; with --peft lora they would be"),
        (["--peft", "prefix", "--lora_r", "4", "--target_modules", "q_proj"], "--lora_r, --target_modules: --peft lora only"),
        (["--peft", "none", "--prefix_projection"], "--prefix_projection: --peft prefix only; with --peft none"),
        (["--peft", "prefix", "--prefix_hidden_size", "32"], "--prefix_hidden_size is the hidden size of --prefix_projection's"),
    ],
    ids=["prefix-flag-with-lora", "lora-flags-with-prefix", "prefix-flag-with-full", "hidden-size-without-mlp"],
)  # fmt: skip
def test_a_peft_flag_that_the_method_would_ignore_is_refused(flags, message, capsys):
    base = PARSE_BASE
    assert message in parse_refusal(base + flags, capsys)
    # each method's flags, and the defaults of those not given
    lora = parse_glue_args(base + ["--lora_r", "4"])
    assert (lora.lora_r, lora.lora_alpha, lora.lora_dropout, lora.num_virtual_tokens) == (4, 16, 0.1, 20)
    prefix = parse_glue_args([*base, "--peft", "prefix", "--num_virtual_tokens", "5", "--prefix_projection",
                              "--prefix_hidden_size", "32"])  # fmt: skip
    assert (prefix.num_virtual_tokens, prefix.prefix_projection, prefix.prefix_hidden_size) == (5, True, 32)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--hub_model_id", "me/x"], "--hub_model_id me/x needs --push_to_hub (without it, it would be ignored)"),
        (["--hub_token", "hf_secret"], "--hub_token *** needs --push_to_hub"),
        (["--hub_private_repo"], "--hub_private_repo needs --push_to_hub (without it, it would be ignored)"),
        (["--report_to", "wandb"], "--report_to wandb needs --with_tracking"),
        (["--torch_compile_scope", "model"], "--torch_compile_scope model needs --torch_compile (or --torch_compile_mode"),
        (["--overwrite_output_dir", "--resume_from_checkpoint", "latest"], "--overwrite_output_dir starts over and"),
    ],
    ids=["hub-id", "hub-token", "hub-private-repo", "report-to", "compile-scope", "overwrite-and-resume"],
)  # fmt: skip
def test_a_flag_without_the_flag_it_acts_with_is_refused(flags, message, capsys):
    base = PARSE_BASE
    error = parse_refusal(base + flags, capsys)
    assert message in error and "hf_secret" not in error
    assert parse_glue_args([*base, "--with_tracking"]).report_to == "tensorboard"  # the default, filled in
    assert parse_glue_args([*base, "--torch_compile_backend", "eager", "--torch_compile_scope", "model"])


def test_report_to_names_installed_trackers_or_is_refused(monkeypatch, capsys):
    """As `Trainer` refuses a missing integration: accelerate would only warn and the run would log nothing."""
    import accelerate.tracking
    from accelerate.utils import LoggerType

    from hfzoo.training.arguments import report_to_trackers

    monkeypatch.setattr(accelerate.tracking, "get_available_trackers", lambda: [LoggerType.TENSORBOARD])
    base = [*PARSE_BASE, "--with_tracking"]
    assert parse_glue_args([*base, "--report_to", "tensorboard"]).report_to == "tensorboard"
    assert report_to_trackers("tensorboard, all,tensorboard") == ["tensorboard", "all"]
    cases = {
        "wandb": "--report_to wandb: the package of wandb is not installed (pip install wandb); installed trackers: "
        "['tensorboard']",
        "tensorbord": "--report_to tensorbord: 'tensorbord' is not a tracker; choose one of ['aim', ",
        "tensorboard,mlfow": "'mlfow' is not a tracker; choose one of ['aim', 'comet_ml', 'mlflow', ",
        ",": "--report_to ',': names no tracker; give one such as tensorboard",
    }
    for report_to, message in cases.items():
        assert message in parse_refusal([*base, "--report_to", report_to], capsys), report_to
    monkeypatch.setattr(accelerate.tracking, "get_available_trackers", lambda: [])
    assert 'tensorboard is not installed (pip install "hfzoo[tracking]"); installed trackers: none' in parse_refusal(
        base, capsys
    )
    assert "--report_to all: no tracker is installed" in parse_refusal([*base, "--report_to", "all"], capsys)
    assert parse_glue_args(PARSE_BASE).report_to is None  # without --with_tracking nothing is asked


def test_a_dev_file_that_is_the_training_file_is_refused(tmp_path, capsys):
    """The dev metric would be measured on the examples the model was finetuned on."""
    (tmp_path / "rte.tsv").write_text("")
    files = ["--train_file", str(tmp_path / "rte.tsv"), "--validation_file", f"{tmp_path}/./rte.tsv"]
    error = parse_refusal([*PARSE_BASE, *files], capsys)
    assert f"--validation_file {tmp_path}/./rte.tsv: is also --train_file {tmp_path}/rte.tsv" in error


@pytest.mark.slow
def test_sweep_writes_markdown_and_json_tables(checkpoints, glue_dir, tmp_path):
    out = tmp_path / "sweep"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, str(REPO / "recipes" / "glue_sweep.py"), "--model_name_or_path",
           str(checkpoints["encoder-tiny"]), "--data_dir", str(glue_dir), "--tasks", "rte", "stsb", "--peft", "lora",
           "--output_dir", str(out), "--", "--max_train_steps", "2", "--per_device_train_batch_size", "4"]  # fmt: skip
    subprocess.run(cmd, check=True, env=env, cwd=tmp_path, capture_output=True)
    table = json.loads((out / "results.json").read_text())
    assert [(r["task"], r["metric"]) for r in table["rows"]] == [
        ("rte", "accuracy"), ("stsb", "pearson"), ("stsb", "spearmanr")]  # fmt: skip
    for row in table["rows"]:
        assert {"value", "trainable_parameters", "train_steps", "train_seconds"} <= set(row)
    markdown = (out / "results.md").read_text().splitlines()
    assert markdown[0].startswith("| task | metric | value |") and len(markdown) == 2 + 3
    bars = json.loads(read_png_text(out / "results.png")["hfzoo:bars"])
    assert bars == {f"{r['task']} {r['metric']}": r["value"] for r in table["rows"]}


def test_a_sweep_run_again_keeps_its_finished_tasks_and_runs_the_rest(checkpoints, tmp_path, monkeypatch, capsys):
    """Interrupted sweeps go on where they stopped; other arguments or --overwrite_output_dir are not silently mixed."""
    import hfzoo.finetuning.sweep as sweep_module

    data, out = tmp_path / "glue", tmp_path / "sweep"
    write_glue_dir(data, "rte")
    write_glue_dir(data, "stsb")
    trained, stop_at = [], {"stsb"}

    def finetune(argv):
        task = argv[argv.index("--task_name") + 1]
        if task in stop_at:
            raise KeyboardInterrupt  # the sweep is stopped while this task trains
        trained.append(task)
        return real_finetune(argv)

    real_finetune = sweep_module.finetune
    monkeypatch.setattr(sweep_module, "finetune", finetune)

    def sweep(*extra):
        trained.clear()
        return sweep_module.main([
            "--model_name_or_path", str(checkpoints["encoder-tiny"]), "--data_dir", str(data), "--peft", "lora",
            "--output_dir", str(out), "--tasks", "rte", "stsb", "--", "--max_train_steps", "2",
            "--checkpointing_steps", "1", *extra,
        ])  # fmt: skip

    with pytest.raises(KeyboardInterrupt):
        sweep()
    first_rte = json.loads((out / "results.json").read_text())["tasks"]
    assert trained == ["rte"] and [r["task"] for r in first_rte] == ["rte"]

    stop_at.clear()
    results = sweep()
    assert trained == ["stsb"]  # rte is kept, not trained again
    assert [r["task"] for r in results] == ["rte", "stsb"] and results[0] == first_rte[0]
    table = json.loads((out / "results.json").read_text())
    assert [(r["task"], r["metric"]) for r in table["rows"]] == [("rte", "accuracy"), ("stsb", "pearson"),
                                                                 ("stsb", "spearmanr")]  # fmt: skip

    # an argument one record lacks (added by a later hfzoo) or has alone (since removed) is not a difference
    edited = json.loads((out / "results.json").read_text())
    del edited["tasks"][0]["arguments"]["checkpoints_total_limit"]
    edited["tasks"][0]["arguments"]["retired_flag"] = 1
    (out / "results.json").write_text(json.dumps(edited))
    assert [r["task"] for r in sweep()] == ["rte", "stsb"] and trained == []

    # stsb stopped after its last checkpoint, before the table recorded it: refused, then continued on request
    (out / "results.json").write_text(json.dumps({"tasks": table["tasks"][:1], "rows": table["rows"][:1]}))
    with pytest.raises(SystemExit, match="task stsb: .* holds the checkpoints of an interrupted or earlier run"):
        sweep()
    capsys.readouterr()
    results = sweep("--resume_from_checkpoint", "latest")
    assert trained == ["stsb"] and results[1]["train_steps"] == 2
    assert f"resumed from {out / 'stsb' / 'checkpoints' / 'step_2'} at step 2" in capsys.readouterr().out

    with pytest.raises(SystemExit, match=r"task rte was finished by an earlier run of this sweep with other "
                                         r"arguments \(--learning_rate 5e-05 there, 0.001 here\)"):  # fmt: skip
        sweep("--learning_rate", "1e-3")
    assert trained == []
    sweep("--overwrite_output_dir")
    assert trained == ["rte", "stsb"]


def test_a_sweep_of_other_tasks_keeps_the_rows_of_the_tasks_it_does_not_name(checkpoints, tmp_path, monkeypatch):
    """A sweep into a folder where an earlier one finished other tasks adds its rows to theirs; an earlier task run
    with other arguments than this run would give it is refused (one table, one configuration)."""
    import hfzoo.finetuning.sweep as sweep_module

    data, out = tmp_path / "glue", tmp_path / "sweep"
    for task in ("rte", "stsb", "mrpc"):
        write_glue_dir(data, task)
    trained = []

    def finetune(argv):
        trained.append(argv[argv.index("--task_name") + 1])
        return real_finetune(argv)

    real_finetune = sweep_module.finetune
    monkeypatch.setattr(sweep_module, "finetune", finetune)

    def sweep(*tasks, extra=()):
        trained.clear()
        return sweep_module.main([
            "--model_name_or_path", str(checkpoints["encoder-tiny"]), "--data_dir", str(data), "--peft", "lora",
            "--output_dir", str(out), "--tasks", *tasks, "--", "--max_train_steps", "2", *extra,
        ])  # fmt: skip

    def table_tasks():
        table = json.loads((out / "results.json").read_text())
        return [r["task"] for r in table["tasks"]], sorted({r["task"] for r in table["rows"]})

    sweep("rte")
    first_rte = json.loads((out / "results.json").read_text())["tasks"][0]
    assert [r["task"] for r in sweep("stsb")] == ["stsb"] and trained == ["stsb"]
    assert table_tasks() == (["rte", "stsb"], ["rte", "stsb"])
    assert json.loads((out / "results.json").read_text())["tasks"][0] == first_rte
    assert "| rte | accuracy |" in (out / "results.md").read_text()

    with pytest.raises(SystemExit, match=r"task rte \(not in --tasks\) was finished by an earlier run of this sweep "
                                         r"with other arguments \(--learning_rate 5e-05 there, 0.001 here\)"):  # fmt: skip
        sweep("mrpc", extra=("--learning_rate", "1e-3"))
    assert trained == [] and table_tasks()[0] == ["rte", "stsb"]
    sweep("mrpc", extra=("--learning_rate", "1e-3", "--overwrite_output_dir"))  # the tables start over
    assert trained == ["mrpc"] and table_tasks()[0] == ["mrpc"] and (out / "rte" / "all_results.json").is_file()


def test_sweep_refuses_a_later_task_folder_with_an_earlier_runs_checkpoints_before_its_first_task(
    checkpoints, tmp_path
):
    from hfzoo.finetuning.sweep import main as sweep

    data, out = tmp_path / "glue", tmp_path / "sweep"
    write_glue_dir(data, "rte")
    write_glue_dir(data, "stsb")
    earlier = out / "stsb" / "checkpoints" / "step_2"  # a complete checkpoint: it has its manifest
    earlier.mkdir(parents=True)
    (earlier / MANIFEST).write_text("{}")
    sweep_argv = ["--model_name_or_path", str(checkpoints["encoder-tiny"]), "--data_dir", str(data), "--peft", "lora",
                  "--output_dir", str(out), "--tasks", "rte", "stsb", "--", "--max_train_steps", "1"]  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        sweep(sweep_argv)
    assert str(exit_info.value).startswith(
        f"error: task stsb: {out / 'stsb'} holds the checkpoints of an interrupted or earlier run (checkpoints/step_2); "
        "give -- --resume_from_checkpoint latest to continue it"
    )
    assert not (out / "rte").exists()  # no task ran


@pytest.mark.parametrize(
    ("extra", "expected"),
    [([], ["sweep-rte", "sweep-stsb"]), (["--hub_model_id", "me/glue"], ["me/glue-rte", "me/glue-stsb"])],
)
def test_sweep_uploads_every_task_to_its_own_repository(extra, expected, checkpoints, tmp_path, monkeypatch):
    """One repository per task, named after the sweep (its folder or --hub_model_id), not the task's folder alone."""
    from types import SimpleNamespace

    from huggingface_hub import HfApi

    from hfzoo.finetuning.sweep import main as sweep

    created, uploaded = [], []
    monkeypatch.setattr(
        HfApi, "create_repo", lambda self, repo_id, **kw: created.append(repo_id) or SimpleNamespace(repo_id=repo_id)
    )
    monkeypatch.setattr(
        HfApi, "upload_folder", lambda self, **kw: uploaded.append((kw["repo_id"], kw["folder_path"])) or SimpleNamespace(commit_url="u")
    )  # fmt: skip
    data, out = tmp_path / "glue", tmp_path / "sweep"
    write_glue_dir(data, "rte")
    write_glue_dir(data, "stsb")
    sweep([
        "--model_name_or_path", str(checkpoints["encoder-tiny"]), "--data_dir", str(data), "--peft", "lora",
        "--output_dir", str(out), "--tasks", "rte", "stsb", "--", "--max_train_steps", "1", "--push_to_hub", *extra,
    ])  # fmt: skip
    assert created == [*expected, *[name for name in expected for _ in range(2)]]  # all before any task; each
    # task's again at its start and before its upload
    assert [(repo, Path(folder)) for repo, folder in uploaded] == [
        (expected[0], out / "rte"),
        (expected[1], out / "stsb"),
    ]


def test_a_hub_token_reaches_no_file_and_no_output_of_a_sweep(checkpoints, tmp_path, monkeypatch, capsys):
    """The sweep prints each task's command line with the token hidden; no tracker file or card holds it."""
    from types import SimpleNamespace

    from huggingface_hub import HfApi

    from hfzoo.finetuning.sweep import main as sweep

    tokens = []
    monkeypatch.setattr(HfApi, "create_repo", lambda self, repo_id, **kw: SimpleNamespace(repo_id=repo_id))
    monkeypatch.setattr(
        HfApi, "upload_folder", lambda self, **kw: tokens.append(self.token) or SimpleNamespace(commit_url="u")
    )
    data, out = tmp_path / "glue", tmp_path / "sweep"
    write_glue_dir(data, "rte")
    sweep([
        "--model_name_or_path", str(checkpoints["encoder-tiny"]), "--data_dir", str(data), "--peft", "lora",
        "--output_dir", str(out), "--tasks", "rte", "--", "--max_train_steps", "1", "--with_tracking", "--push_to_hub",
        "--hub_token", "hf_secret_xyz",
    ])  # fmt: skip
    assert tokens == ["hf_secret_xyz"]  # the upload had it
    captured = capsys.readouterr()
    assert "--hub_token '***'" in captured.out and list(out.rglob("hparams.yml"))
    leaks = [p for p in out.rglob("*") if p.is_file() and b"hf_secret_xyz" in p.read_bytes()]
    assert not leaks and "hf_secret_xyz" not in captured.out + captured.err


@pytest.mark.parametrize(
    ("tasks", "extra", "message"),
    [
        (["rte", "mnli"], [], "GLUE mnli needs"),
        (["rte", "stsb"], ["--task_name", "cola"], "--task_name cola after `--`: each task's comes from --tasks"),
        (["rte", "stsb"], ["--task", "cola"], "--task_name cola after `--`"),  # argparse's abbreviation
        (["rte", "stsb"], ["--output_dir=/nowhere/else"], "--output_dir /nowhere/else after `--`: each task writes"),
        (["rte", "stsb"], ["--train_file", "x.tsv"], "--train_file x.tsv after `--`: one file cannot serve"),
        (["rte", "stsb"], ["--peft", "none"], "--peft none after `--`: give the sweep's --peft"),
        (["rte", "stsb"], ["--push_to_hub", "--hub_model_id", "me/" + "x" * 96], "--push_to_hub: task rte's repository would be 'me/" + "x" * 96 + "-rte' (after --hub_model_id me/"),
        (["rte", "stsb"], ["--lora_dropout", "1.5"], "--lora_dropout must be in [0, 1), got 1.5"),
        (["rte", "stsb"], ["--lora_r", "0"], "argument --lora_r: must be a positive integer, got 0"),
        (["rte", "RTE"], [], "--tasks names a task twice: ['rte', 'RTE']"),
        (["rte", "sst3"], [], "--tasks: unknown GLUE task 'sst3'"),
    ],
    ids=["later-task-missing-data", "task-name", "abbreviated", "output-dir", "train-file", "peft", "hub-model-id", "bad-value",
         "argparse-error", "twice", "unknown-task"],
)  # fmt: skip
def test_sweep_refuses_bad_input_before_its_first_task(tasks, extra, message, checkpoints, tmp_path, capsys):
    """Every task's flags and files are checked before the first trains; flags the sweep sets are refused after --."""
    from hfzoo.finetuning.sweep import main as sweep

    data = tmp_path / "glue"
    write_glue_dir(data, "rte")
    write_glue_dir(data, "stsb")
    out = tmp_path / "sweep"
    sweep_argv = ["--model_name_or_path", str(checkpoints["encoder-tiny"]), "--data_dir", str(data), "--peft", "lora",
                  "--output_dir", str(out), "--tasks", *tasks, "--", "--max_train_steps", "1", *extra]  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        sweep(sweep_argv)
    error = str(exit_info.value.code) + capsys.readouterr().err
    assert message in error, error
    assert not out.exists()  # no task ran


@pytest.mark.slow
def test_accelerate_launch(checkpoints, glue_dir, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "1", "--cpu",
           str(REPO / "recipes" / "finetune_glue.py"),
           *argv(checkpoints["encoder-tiny"], glue_dir, tmp_path / "run", "rte", "--with_tracking")]  # fmt: skip
    subprocess.run(cmd, check=True, env=env, cwd=tmp_path, capture_output=True)
    assert json.loads((tmp_path / "run" / "all_results.json").read_text())["train_steps"] == 3
    assert list((tmp_path / "run").rglob("events.out.tfevents.*"))


def test_max_grad_norm_clips_the_updates(checkpoints, glue_dir, tmp_path):
    """A tiny clipping norm leaves the weights where they were (AdamW's step shrinks below eps); the default 1.0 does not."""
    from safetensors.torch import load_file

    base = load_file(checkpoints["encoder-tiny"] / "model.safetensors")
    moved = {}
    for norm in ("1e-12", "1.0"):
        out = tmp_path / norm
        finetune(argv(checkpoints["encoder-tiny"], glue_dir, out, "sst2", "--peft", "none", "--max_grad_norm", norm))
        trained = load_file(out / "model.safetensors")
        body = {k.removeprefix("model."): v for k, v in trained.items()}  # the head's model wraps the body as `model`
        shared = [k for k in base if k in body]
        assert len(shared) == len(base)
        moved[norm] = max((body[k].float() - base[k].float()).abs().max().item() for k in shared)
    assert moved["1e-12"] < 1e-5 < 1e-4 < moved["1.0"]


def read_png_text(path: Path) -> dict[str, str]:
    """The text chunks of a PNG file (the figure is read back, not regenerated)."""
    from PIL import Image

    with Image.open(path) as image:
        assert image.format == "PNG" and image.size[0] > 300 and image.size[1] > 200
        assert len(set(image.convert("L").tobytes())) > 10  # something is drawn
        return dict(image.text)


def test_progress_bar_history_and_training_curves(checkpoints, glue_dir, tmp_path, capsys):
    out = tmp_path / "run"
    results = finetune(argv(checkpoints["encoder-tiny"], glue_dir, out, "mrpc", "--logging_steps", "1",
                            "--max_train_steps", "6", "--peak_tflops", "0.5"))  # fmt: skip
    err = capsys.readouterr().err
    assert re.search(r"mrpc \(lora\): +100%.*\| 6/6 .*tflops=.*mfu=", err), err[-2000:]  # tqdm's bar, final state
    history = json.loads((out / "train_history.json").read_text())
    assert [r["step"] for r in history["log_history"]] == [1, 2, 3, 4, 5, 6]
    assert [(r["epoch"], r["step"]) for r in history["eval_history"]] == [(1, 4), (2, 6)]
    curves = json.loads(read_png_text(out / "training_curves.png")["hfzoo:curves"])
    assert list(curves) == ["training loss", "validation loss", "learning rate", "tokens/s"]
    assert curves["training loss"] == [[r["step"], r["train_loss"]] for r in history["log_history"]]
    assert curves["validation loss"] == [[r["step"], r["eval_loss"]] for r in history["eval_history"]]
    assert [s for s, _ in curves["learning rate"]] == [1, 2, 3, 4, 5, 6]
    assert all(v > 0 for _, v in curves["tokens/s"]) and len(curves["tokens/s"]) == 6
    # Throughput: the classifier's model FLOPs of each row's real tokens (`count_classification_flops`; LoRA's
    # products not counted), so a window's FLOPs per token lie between the least and the most a sequence of
    # T <= 32 tokens spends per token; TFLOP/s and MFU against --peak_tflops in every record and the results.
    config = AutoConfig.from_pretrained(checkpoints["encoder-tiny"], num_labels=2)
    per_token = [count_classification_flops(config, length).per_token for length in range(1, 33)]
    low, high = min(per_token), max(per_token)
    for record in history["log_history"]:
        assert low <= record["flops_per_token"] <= high
        assert record["tflops"] == pytest.approx(record["tokens_per_second"] * record["flops_per_token"] / 1e12)
        assert record["mfu"] == pytest.approx(record["tflops"] / 0.5)
    assert low <= results["flops_per_token"] <= high
    assert results["train_mfu"] == pytest.approx(results["train_tflops"] / 0.5) and results["peak_tflops"] == 0.5


def _trainable(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(path / ("adapter_model.safetensors" if (path / "adapter_model.safetensors").is_file()
                             else "model.safetensors"))  # fmt: skip


@pytest.mark.parametrize("resume_step, order", [(2, ()), (4, ()), (2, ("--group_by_length",))])
def test_resume_from_checkpoint_continues_exactly(resume_step, order, checkpoints, glue_dir, tmp_path):
    """Mid-epoch (step 2) and at the end of an epoch before its evaluation (step 4): the same weights and metrics.

    Also with the length-grouped order, which its own sampler draws per epoch.
    """
    common = ("--logging_steps", "1", "--max_train_steps", "6", "--checkpointing_steps", "2", "--lora_dropout", "0.2",
              "--checkpoints_total_limit", "3", *order)  # fmt: skip
    full = finetune(argv(checkpoints["encoder-tiny"], glue_dir, tmp_path / "full", "mrpc", *common))
    assert sorted(p.name for p in (tmp_path / "full" / "checkpoints").iterdir()) == ["step_2", "step_4", "step_6"]
    checkpoint = tmp_path / "full" / "checkpoints" / f"step_{resume_step}"
    tag_saved_history(checkpoint, GLUE_STATE)
    resumed = finetune(argv(checkpoints["encoder-tiny"], glue_dir, tmp_path / "resumed", "mrpc", *common,
                            "--resume_from_checkpoint", str(checkpoint)))  # fmt: skip
    for key in ("eval_accuracy", "eval_f1", "eval_loss", "last_epoch_eval_loss", "best_epoch", "final_train_loss"):
        assert resumed[key] == full[key], key
    a, b = _trainable(tmp_path / "full"), _trainable(tmp_path / "resumed")
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    # it really resumed: the steps up to the checkpoint are its records, the others trained, none twice
    assert restored_steps(tmp_path / "resumed") == (list(range(1, 7)), list(range(1, resume_step + 1)))
    history = {n: json.loads((tmp_path / n / "train_history.json").read_text()) for n in ("full", "resumed")}
    for records in (history["full"]["log_history"], history["resumed"]["log_history"]):
        for record in records:
            assert record.pop("tokens_per_second") > 0 and record.pop("tflops") > 0  # wall-clock dependent
            record.pop("mfu")
            record.pop("restored", None)
    assert history["resumed"] == history["full"]  # the resumed run carries the earlier records along


def test_resume_latest_without_checkpoint_starts_fresh_and_bad_folder_is_refused(checkpoints, glue_dir, tmp_path):
    results = finetune(argv(checkpoints["encoder-tiny"], glue_dir, tmp_path / "run", "rte",
                            "--resume_from_checkpoint", "latest"))  # fmt: skip
    assert results["train_steps"] == 3
    with pytest.raises(SystemExit, match="not a GLUE checkpoint folder"):
        finetune(argv(checkpoints["encoder-tiny"], glue_dir, tmp_path / "other", "rte",
                      "--resume_from_checkpoint", str(tmp_path / "run")))  # fmt: skip


@pytest.mark.parametrize(
    ("limit", "kept"), [((), ["step_4", "step_6"]), (("--checkpoints_total_limit", "1"), ["step_6"])]
)
def test_only_the_newest_checkpoints_are_kept(limit, kept, checkpoints, glue_dir, tmp_path):
    """--checkpoints_total_limit (default 2, as pretraining's): a long run with frequent checkpoints fills no disk."""
    out, root = tmp_path / "run", tmp_path / "run" / "checkpoints"
    (root / "step_1.tmp").mkdir(parents=True)  # a save killed before it finished, in an earlier run
    finetune(argv(checkpoints["encoder-tiny"], glue_dir, out, "rte", "--max_train_steps", "6",
                  "--checkpointing_steps", "2", *limit))  # fmt: skip
    assert sorted(p.name for p in root.iterdir()) == kept
    resumed = finetune(argv(checkpoints["encoder-tiny"], glue_dir, out, "rte", "--max_train_steps", "6",
                            "--checkpointing_steps", "2", "--resume_from_checkpoint", "latest", *limit))  # fmt: skip
    assert resumed["train_steps"] == 6


def test_a_fresh_run_beside_an_earlier_runs_checkpoints_is_refused_unless_told_to_overwrite(
    checkpoints, glue_dir, tmp_path
):
    """Else `--resume_from_checkpoint latest` would later continue the earlier run's higher steps."""
    out, root = tmp_path / "run", tmp_path / "run" / "checkpoints"
    finetune(argv(checkpoints["encoder-tiny"], glue_dir, out, "rte", "--max_train_steps", "4",
                  "--checkpointing_steps", "2"))  # fmt: skip
    assert sorted(p.name for p in root.iterdir()) == ["step_2", "step_4"]
    with pytest.raises(SystemExit) as exit_info:
        finetune(argv(checkpoints["encoder-tiny"], glue_dir, out, "rte", "--checkpointing_steps", "2"))
    assert str(exit_info.value) == (
        f"error: --output_dir {out} holds the checkpoints of an earlier run (checkpoints/step_2, checkpoints/step_4); "
        "give --resume_from_checkpoint latest to continue it, --overwrite_output_dir to delete them and start over, or "
        "another --output_dir"
    )
    results = finetune(argv(checkpoints["encoder-tiny"], glue_dir, out, "rte", "--checkpointing_steps", "2",
                            "--overwrite_output_dir"))  # fmt: skip
    assert results["train_steps"] == 3 and sorted(p.name for p in root.iterdir()) == ["step_2"]  # this run's


def test_damaged_checkpoints_are_named_and_latest_resumes_from_the_newest_intact_one(
    checkpoints, glue_dir, tmp_path, caplog
):
    """Each checkpoint's manifest lists its files; a resume checks them, as pretraining's (docs/reliability.md)."""
    common = ("--max_train_steps", "6", "--checkpointing_steps", "2", "--logging_steps", "1",
              "--checkpoints_total_limit", "3")  # fmt: skip
    out, root = tmp_path / "run", tmp_path / "run" / "checkpoints"
    full = finetune(argv(checkpoints["encoder-tiny"], glue_dir, out, "mrpc", *common))
    for step in (2, 4, 6):
        folder = root / f"step_{step}"
        listed = set(json.loads((folder / MANIFEST).read_text())["files"])
        assert listed == {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} - {MANIFEST}
        assert GLUE_STATE in listed and "model.safetensors" in listed
    legacy = tmp_path / "legacy" / "step_2"  # written before checkpoints had manifests: accepted, with a warning
    shutil.copytree(root / "step_2", legacy)
    (legacy / MANIFEST).unlink()
    verify_checkpoint(legacy, state_file=GLUE_STATE)
    with pytest.raises(CheckpointError, match="incomplete"):  # a folder without its loop state is an unfinished save
        verify_checkpoint(legacy)
    weights_6 = root / "step_6" / "model.safetensors"
    with open(weights_6, "r+b") as f:  # one bit flipped: the same size
        f.seek(weights_6.stat().st_size - 10)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 1]))
    optimizer_4 = root / "step_4" / "optimizer.bin"
    os.truncate(optimizer_4, 100)
    with pytest.raises(SystemExit, match=re.escape(f"{weights_6}: corrupt (its sha256 differs from {MANIFEST})")):
        finetune(argv(checkpoints["encoder-tiny"], glue_dir, tmp_path / "other", "mrpc", *common,
                      "--resume_from_checkpoint", str(root / "step_6")))  # fmt: skip
    tag_saved_history(root / "step_2", GLUE_STATE)
    with caplog.at_level("WARNING", logger="hfzoo.training.checkpointing"):
        resumed = finetune(argv(checkpoints["encoder-tiny"], glue_dir, out, "mrpc", *common,
                                "--resume_from_checkpoint", "latest"))  # fmt: skip
    warnings = [r.getMessage() for r in caplog.records]
    assert any(w.startswith(f"skipping checkpoint {root / 'step_6'}: {weights_6}: corrupt") for w in warnings)
    assert any(w.startswith(f"skipping checkpoint {root / 'step_4'}: {optimizer_4}: truncated") for w in warnings)
    assert restored_steps(out)[1] == [1, 2]  # from step_2, the newest intact one
    for key in ("eval_accuracy", "eval_f1", "eval_loss", "final_train_loss"):
        assert resumed[key] == full[key], key


@pytest.mark.parametrize(
    ("change", "value"), [("--per_device_train_batch_size", "8"), ("--gradient_accumulation_steps", "2")]
)
def test_a_resume_with_other_batch_settings_is_refused_before_any_data_is_read(
    change, value, checkpoints, glue_dir, tmp_path
):
    """The data position counts each process's batches: other batch settings would train on other examples."""
    common = ("--max_train_steps", "4", "--checkpointing_steps", "2")
    finetune(argv(checkpoints["encoder-tiny"], glue_dir, tmp_path / "full", "mrpc", *common))
    checkpoint = tmp_path / "full" / "checkpoints" / "step_2"
    assert json.loads((checkpoint / GLUE_STATE).read_text())["batch_layout"] == {
        "num_processes": 1, "per_device_train_batch_size": 4, "gradient_accumulation_steps": 1}  # fmt: skip
    resumed = argv(checkpoints["encoder-tiny"], glue_dir, tmp_path / "other", "mrpc", *common,
                   "--resume_from_checkpoint", str(checkpoint))  # fmt: skip
    if change in resumed:
        resumed[resumed.index(change) + 1] = value
    else:
        resumed += [change, value]
    with pytest.raises(SystemExit) as exc:
        finetune(resumed)
    message = str(exc.value.code)
    assert (
        f"--resume_from_checkpoint {checkpoint}: written with num_processes 1, per_device_train_batch_size 4, "
        in message
    )
    assert f"{change.removeprefix('--')} {value}" in message and "\n" not in message.strip()
    assert not (tmp_path / "other" / "all_results.json").exists()


def test_a_resume_with_other_optimizer_settings_is_refused_before_any_data_is_read(
    checkpoints, glue_dir, tmp_path, monkeypatch
):
    """The checkpoint's optimizer state restores its learning rate and weight decay: this run's would be ignored."""
    from hfzoo.finetuning import glue

    common = ("--max_train_steps", "2", "--checkpointing_steps", "1")
    finetune(argv(checkpoints["encoder-tiny"], glue_dir, tmp_path / "full", "mrpc", *common))
    checkpoint = tmp_path / "full" / "checkpoints" / "step_1"
    assert json.loads((checkpoint / GLUE_STATE).read_text())["optimizer_arguments"] == {
        "optim": "adamw_torch", "learning_rate": 1e-3, "weight_decay": 0.0}  # fmt: skip
    resumed = argv(checkpoints["encoder-tiny"], glue_dir, tmp_path / "other", "mrpc", *common, "--weight_decay", "0.3",
                   "--resume_from_checkpoint", str(checkpoint))  # fmt: skip
    resumed[resumed.index("--learning_rate") + 1] = "0.5"
    monkeypatch.setattr(glue, "load_glue_data", lambda *a, **k: pytest.fail("the data was read before the check"))
    with pytest.raises(SystemExit) as exc:
        finetune(resumed)
    assert str(exc.value.code) == (
        f"error: --resume_from_checkpoint {checkpoint}: written with --learning_rate 0.001, --weight_decay 0.0; this "
        "run has --learning_rate 0.5, --weight_decay 0.3: a resume restores the checkpoint's optimizer with its "
        "hyperparameters, so this run's would be ignored (resume with the checkpoint's values, or start a new run "
        "from its weights)"
    )


def test_a_resume_with_another_task_data_or_adapter_is_refused_before_any_data_is_read(
    checkpoints, glue_dir, tmp_path, monkeypatch
):
    """Another binary task resumed silently on the other task's examples, another LoRA rank failed in
    `load_state_dict`: each is refused in one line naming the flags; the GLUE folder may move."""
    from hfzoo.finetuning import glue

    common = ("--max_train_steps", "2", "--checkpointing_steps", "1", "--peft", "lora")
    finetune(argv(checkpoints["encoder-tiny"], glue_dir, tmp_path / "full", "mrpc", *common))
    checkpoint = tmp_path / "full" / "checkpoints" / "step_1"
    state = json.loads((checkpoint / GLUE_STATE).read_text())
    assert state["data_arguments"]["task_name"] == "mrpc" and state["adapter_arguments"]["peft"] == "lora"

    def resumed(*changes: str) -> list[str]:
        args = argv(checkpoints["encoder-tiny"], glue_dir, tmp_path / "other", "mrpc", *common,
                    "--resume_from_checkpoint", str(checkpoint))  # fmt: skip
        for flag, value in zip(changes[::2], changes[1::2], strict=True):
            if flag in args:
                args[args.index(flag) + 1] = value
            else:
                args += [flag, value]
        return args

    monkeypatch.setattr(glue, "load_glue_data", lambda *a, **k: pytest.fail("the data was read before the check"))
    for changes, expected in [
        (("--task_name", "rte"), "written with --task_name mrpc; this run has --task_name rte: the resumed run would "
                                 "go on at the checkpoint's position in other examples"),
        (("--max_length", "16", "--seed", "3"), "written with --max_length 32, --seed 42; this run has --max_length "
                                                "16, --seed 3: "),
        (("--lora_r", "4"), "--lora_r 4: the checkpoint holds the trained weights of its own adapter"),
        (("--peft", "none"), "; this run has --peft none: the checkpoint holds the trained weights"),
    ]:  # fmt: skip
        with pytest.raises(SystemExit) as exc:
            finetune(resumed(*changes))
        message = str(exc.value.code)
        assert (
            message.startswith(f"error: --resume_from_checkpoint {checkpoint}: written with ") and "\n" not in message
        )
        assert expected in message, (changes, message)
    monkeypatch.undo()

    moved = tmp_path / "moved-glue"
    shutil.copytree(glue_dir, moved)
    args = resumed()
    args[args.index("--data_dir") + 1] = str(moved)
    assert finetune(args)["train_steps"] == 2


def base_model_refusal(checkpoint: Path, written_from: Path, model: Path, differs: str) -> str:
    """The one-line refusal of a resume on another base model than `written_from` (`check_resume_base_model`)."""
    return (
        f"error: --resume_from_checkpoint {checkpoint}: written by a run that started from {written_from}; this "
        f"run's --model_name_or_path {model} has {differs}: the checkpoint's weights would replace its own and the "
        "saved model would name a base it was not trained from; resume from the model the checkpoint was written "
        "from, or start a new run"
    )


def test_a_resume_from_another_model_is_refused_in_one_line(checkpoints, glue_dir, tmp_path):
    """A checkpoint written from one model, resumed on another architecture: refused by the recorded base model's
    config before any data is read; in a checkpoint without that record (an older hfzoo's), torch's
    `load_state_dict` error is named in one line (it was a traceback)."""
    common = ("--max_train_steps", "2", "--checkpointing_steps", "1", "--peft", "lora")
    finetune(argv(checkpoints["encoder-tiny"], glue_dir, tmp_path / "full", "mrpc", *common))
    checkpoint = tmp_path / "full" / "checkpoints" / "step_1"
    with pytest.raises(SystemExit) as exc:
        finetune(argv(checkpoints["bert"], glue_dir, tmp_path / "other", "mrpc", *common,
                      "--resume_from_checkpoint", str(checkpoint)))  # fmt: skip
    assert str(exc.value.code) == base_model_refusal(
        checkpoint, checkpoints["encoder-tiny"], checkpoints["bert"], "model_type 'bert', not 'hfzoo_encoder'"
    )
    state = json.loads((checkpoint / GLUE_STATE).read_text())
    del state["base_model"]
    (checkpoint / GLUE_STATE).write_text(json.dumps(state))
    write_manifest(checkpoint)
    with pytest.raises(SystemExit) as exc:
        finetune(argv(checkpoints["bert"], glue_dir, tmp_path / "other", "mrpc", *common,
                      "--resume_from_checkpoint", str(checkpoint)))  # fmt: skip
    message = str(exc.value.code)
    assert message.startswith(
        f"error: --resume_from_checkpoint {checkpoint}: its weights do not fit this run's model (--model_name_or_path "
        f"{checkpoints['bert']}: "
    ), message
    assert message.endswith("resume from the model the checkpoint was written from") and "\n" not in message


def test_a_resume_from_another_base_of_the_same_architecture_is_refused_and_a_moved_base_is_not(
    checkpoints, glue_dir, tmp_path, monkeypatch
):
    """The checkpoint holds the whole model: resumed on other weights, another config or vocabulary of the same
    shapes, the run went on training the first base while its adapter named the second. The record is by content:
    the same model in another folder resumes."""
    from hfzoo.finetuning import glue

    common = ("--max_train_steps", "2", "--checkpointing_steps", "1", "--peft", "lora")
    source = checkpoints["encoder-tiny"]
    finetune(argv(source, glue_dir, tmp_path / "full", "mrpc", *common))
    checkpoint = tmp_path / "full" / "checkpoints" / "step_1"
    recorded = json.loads((checkpoint / GLUE_STATE).read_text())["base_model"]
    assert recorded["model_name_or_path"] == str(source) and recorded["config"]["model_type"] == "hfzoo_encoder"
    assert recorded["weights"].startswith("sha256:") and recorded["vocabulary"].startswith("sha256:")

    def variant(name: str, change) -> Path:
        folder = tmp_path / name
        shutil.copytree(source, folder)
        change(folder)
        return folder

    def other_weights(folder: Path) -> None:
        model = AutoModel.from_pretrained(folder)
        with torch.no_grad():
            model.get_input_embeddings().weight[5, 0] += 1.0  # one number of the base
        model.save_pretrained(folder)

    def other_config(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "layer_norm_eps": 1e-3}))

    def other_vocabulary(folder: Path) -> None:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        tokenizer.add_tokens(["<new>"])  # the same model, but the tokenizer maps one more string to an id
        tokenizer.save_pretrained(folder)

    monkeypatch.setattr(glue, "load_glue_data", lambda *a, **k: pytest.fail("the data was read before the check"))
    for name, change, differs in [
        ("weights", other_weights, "other weights"),
        ("config", other_config, "another config (layer_norm_eps=1e-05 there, 0.001 here)"),
        ("vocabulary", other_vocabulary, "another tokenizer vocabulary"),
    ]:
        folder = variant(name, change)
        with pytest.raises(SystemExit) as exc:
            finetune(argv(folder, glue_dir, tmp_path / f"resumed-{name}", "mrpc", *common,
                          "--resume_from_checkpoint", str(checkpoint)))  # fmt: skip
        assert str(exc.value.code) == base_model_refusal(checkpoint, source, folder, differs)
    monkeypatch.undo()
    moved = variant("moved", lambda folder: None)
    resumed = finetune(argv(moved, glue_dir, tmp_path / "resumed", "mrpc", *common,
                            "--resume_from_checkpoint", str(checkpoint)))  # fmt: skip
    assert resumed["train_steps"] == 2
    assert json.loads((tmp_path / "resumed" / "adapter_config.json").read_text())["base_model_name_or_path"] == str(
        moved
    )


@pytest.mark.compat
def test_the_base_model_record_leaves_out_the_head_the_run_initializes(checkpoints, glue_dir, tmp_path):
    """A base with a 3-label head loaded for a 2-label task (`--ignore_mismatched_sizes`): the head drawn anew, with
    any seed, is no part of what identifies the base; a changed weight of the body is."""
    from hfzoo.finetuning.glue import build_glue_model

    base = tmp_path / "three-labels"
    source = AutoModelForSequenceClassification.from_pretrained(checkpoints["encoder-tiny"], num_labels=3)
    source.save_pretrained(base)
    AutoTokenizer.from_pretrained(checkpoints["encoder-tiny"]).save_pretrained(base)

    def record(seed: int) -> tuple[dict, dict[str, torch.Tensor]]:
        args = parse_glue_args(argv(base, glue_dir, tmp_path / "out", "rte", "--ignore_mismatched_sizes"))
        tokenizer = AutoTokenizer.from_pretrained(base)
        torch.manual_seed(seed)
        model, recorded = build_glue_model(args, GLUE_TASKS["rte"], tokenizer, AutoConfig.from_pretrained(base))
        return recorded, model.state_dict()

    (first, weights_0), (second, weights_1) = record(0), record(1)
    new_head = [key for key in weights_0 if "classifier" in key and not torch.equal(weights_0[key], weights_1[key])]
    assert new_head, "the new head was not drawn anew"
    assert first == second and first["model_name_or_path"] == str(base)
    with torch.no_grad():
        source.get_input_embeddings().weight[3, 1] -= 0.5
    source.save_pretrained(base)
    assert record(0)[0]["weights"] != first["weights"]


def test_best_epoch_weights_are_saved_and_reported_with_the_last(checkpoints, glue_dir, tmp_path, monkeypatch):
    """Epoch 1 scores best (a scripted dev metric): its weights are saved, the last epoch's metrics reported too."""
    from hfzoo.finetuning import loop as glue_loop

    scores = iter([0.9, 0.5])
    real = glue_loop.evaluate_glue

    def scripted(*args, **kwargs):
        metrics = real(*args, **kwargs)
        return {**metrics, "accuracy": next(scores)}

    monkeypatch.setattr(glue_loop, "evaluate_glue", scripted)
    out = tmp_path / "run"
    results = finetune(argv(checkpoints["encoder-tiny"], glue_dir, out, "rte", "--max_train_steps", "8",
                            "--checkpointing_steps", "epoch"))  # fmt: skip
    assert (results["best_epoch"], results["epoch"], results["metric_for_best_model"]) == (1, 1, "eval_accuracy")
    assert results["eval_accuracy"] == 0.9 and results["last_epoch_eval_accuracy"] == 0.5
    assert json.loads((out / "eval_results.json").read_text())["eval_accuracy"] == 0.9
    # The saved adapter is the one of the checkpoint after epoch 1 (step 4), not the last one (step 8).
    from safetensors.torch import load_file

    saved = _trainable(out)
    epoch1, epoch2 = (load_file(out / "checkpoints" / f"step_{s}" / "model.safetensors") for s in (4, 8))

    def adapter_key(key: str) -> str:  # PeftModel state-dict key -> saved adapter key
        return key.replace(".modules_to_save.default", "").replace(".default", "")

    trainable = {adapter_key(k): k for k in epoch1 if "lora_" in k or "modules_to_save" in k}
    assert set(trainable) == set(saved)
    assert all(torch.equal(saved[k], epoch1[trainable[k]]) for k in saved)
    assert not all(torch.equal(saved[k], epoch2[trainable[k]]) for k in saved)


def test_lr_scheduler_kwargs_reach_the_schedule(checkpoints, glue_dir, tmp_path):
    out = tmp_path / "run"
    finetune(argv(checkpoints["encoder-tiny"], glue_dir, out, "rte", "--logging_steps", "1", "--lr_scheduler_type",
                  "cosine_with_min_lr", "--lr_scheduler_kwargs", '{"min_lr_rate": 0.5}'))  # fmt: skip
    rates = [r["learning_rate"] for r in json.loads((out / "train_history.json").read_text())["log_history"]]
    assert rates[-1] == pytest.approx(0.5e-3)  # the floor of cosine_with_min_lr: min_lr_rate x --learning_rate 1e-3
    # refused before the model and the data are read: a missing data folder is not reached
    with pytest.raises(SystemExit, match=r"--lr_scheduler_kwargs \{'bogus': 1\}: .*bogus"):
        finetune(argv(checkpoints["encoder-tiny"], tmp_path / "no-data", tmp_path / "bad", "rte", "--lr_scheduler_type",
                      "cosine", "--lr_scheduler_kwargs", '{"bogus": 1}'))  # fmt: skip
    assert not (tmp_path / "bad").exists()
    with pytest.raises(SystemExit, match=r"--lr_scheduler_type constant has no warmup \(--num_warmup_steps 2 would"):
        finetune(argv(checkpoints["encoder-tiny"], tmp_path / "no-data", tmp_path / "bad", "rte", "--lr_scheduler_type",
                      "constant", "--num_warmup_steps", "2"))  # fmt: skip


def test_a_warmup_longer_than_the_run_is_reported(checkpoints, glue_dir, tmp_path, capsys):
    out = tmp_path / "run"
    finetune(argv(checkpoints["encoder-tiny"], glue_dir, out, "rte", "--logging_steps", "1", "--num_warmup_steps", "5"))
    assert (
        "warning: --num_warmup_steps 5 is not below the run's 3 optimizer steps: the learning rate is still warming "
        "up when training ends (at most 60% of --learning_rate)" in capsys.readouterr().out
    )
    rates = [r["learning_rate"] for r in json.loads((out / "train_history.json").read_text())["log_history"]]
    assert rates == pytest.approx([2e-4, 4e-4, 6e-4])


def test_flex_attention_is_refused_on_the_cpu_before_the_data(checkpoints, glue_dir, tmp_path):
    """PyTorch's FlexAttention has no backward pass on the CPU (see test_pretrain_recipe.py): refused up front."""
    if torch.cuda.is_available():
        pytest.skip("flex_attention trains on a GPU")
    with pytest.raises(SystemExit, match="--attn_implementation flex_attention cannot train on the CPU"):
        finetune(argv(checkpoints["encoder-tiny"], glue_dir, tmp_path / "run", "rte",
                      "--attn_implementation", "flex_attention"))  # fmt: skip
    assert not (tmp_path / "run" / "train_history.json").exists()


def test_flash_attention_on_the_cpu_and_a_package_the_model_needs_are_refused_in_one_line(checkpoints, glue_dir,
                                                                                          tmp_path):  # fmt: skip
    """FlashAttention's kernels run on CUDA: refused on the CPU before the data. The code of a `--trust_remote_code`
    model that imports a package that is not installed (transformers raises `ImportError`) is refused in one line
    naming the model and the package, not with a traceback."""
    if torch.cuda.is_available():
        pytest.skip("FlashAttention runs on a GPU")
    with pytest.raises(SystemExit, match="^error: --attn_implementation flash_attention_2 needs a GPU .*sdpa or eager"):
        finetune(argv(checkpoints["encoder-tiny"], glue_dir, tmp_path / "run", "rte",
                      "--attn_implementation", "flash_attention_2"))  # fmt: skip
    model = tmp_path / "remote"  # a BERT whose model type only its own code knows
    shutil.copytree(checkpoints["bert"], model)
    (model / "configuration_remote.py").write_text(
        "from transformers import BertConfig\n\n\nclass RemoteConfig(BertConfig):\n    model_type = 'remote-bert'\n"
    )
    (model / "modeling_remote.py").write_text("import hfzoo_absent_package\n")
    config = json.loads((model / "config.json").read_text())
    config["model_type"] = "remote-bert"
    config["auto_map"] = {"AutoConfig": "configuration_remote.RemoteConfig",
                          "AutoModelForSequenceClassification": "modeling_remote.Classifier"}  # fmt: skip
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(SystemExit) as refused:
        finetune(argv(model, glue_dir, tmp_path / "run", "rte", "--trust_remote_code"))
    message = str(refused.value.code)
    assert message.startswith(f"error: --model_name_or_path {model}: ") and "hfzoo_absent_package" in message
    assert "\n" not in message
    assert not (tmp_path / "run" / "train_history.json").exists()


def test_push_to_hub_a_stock_transformers_checkpoint(checkpoints, glue_dir, tmp_path, monkeypatch):
    """BERT (not hfzoo) with LoRA: the adapter folder is uploaded with a model card; checkpoints stay home."""
    from types import SimpleNamespace

    from huggingface_hub import HfApi, ModelCard
    from huggingface_hub.utils import DEFAULT_IGNORE_PATTERNS, filter_repo_objects

    calls = []
    monkeypatch.setattr(
        HfApi, "create_repo", lambda self, repo_id, **kw: calls.append((repo_id, kw["private"])) or SimpleNamespace(repo_id=repo_id)
    )  # fmt: skip
    monkeypatch.setattr(HfApi, "upload_folder", lambda self, **kw: calls.append(kw) or SimpleNamespace(commit_url="u"))
    monkeypatch.setattr(HfApi, "model_info", lambda self, repo_id, **kw: SimpleNamespace(private=True))  # created so
    out = tmp_path / "run"
    results = finetune(argv(checkpoints["bert"], glue_dir, out, "mrpc", "--checkpointing_steps", "2", "--push_to_hub",
                            "--hub_model_id", "someone/bert-mrpc-lora", "--hub_token", "hf_secret", "--with_tracking",
                            "--hub_private_repo"))  # fmt: skip
    assert calls[:2] == [("someone/bert-mrpc-lora", True)] * 2  # before training, then before the upload
    upload = calls[2]
    files = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    sent = list(filter_repo_objects(files, ignore_patterns=list(upload["ignore_patterns"]) + DEFAULT_IGNORE_PATTERNS))
    assert {"README.md", "adapter_config.json", "adapter_model.safetensors", "all_results.json", "eval_results.json",
            "train_history.json", "training_curves.png", "tokenizer.json"} <= set(sent)  # fmt: skip
    assert not [f for f in sent if f.startswith("checkpoints/")] and any(f.startswith("checkpoints/") for f in files)
    assert not [f for f in sent if f.startswith("glue/")] and any(
        f.endswith("hparams.yml") for f in files
    )  # tracker logs
    card = ModelCard.load(out / "README.md")
    # a local base folder is named in the text only: the hub refuses a card whose base_model is not a model id
    assert card.data.base_model is None and f"`{checkpoints['bert']}`" in card.text
    assert card.data.library_name == "peft"
    assert card.data.pipeline_tag == "text-classification" and "bert" in card.data.tags
    reported = {r.metric_type: r.metric_value for r in card.data.eval_results}
    assert reported == {"accuracy": results["eval_accuracy"], "f1": results["eval_f1"]}
    assert "hf_secret" not in card.content and "import hfzoo" not in card.content


def test_push_to_hub_without_a_hub_stops_before_training(checkpoints, glue_dir, tmp_path, monkeypatch):
    """The hub client offline: the repository cannot be created, so the run stops before its first step."""
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        finetune(argv(checkpoints["encoder-tiny"], glue_dir, out, "rte", "--push_to_hub", "--hub_model_id", "me/x"))
    assert str(exit_info.value.code).startswith(
        "error: --push_to_hub: cannot create the hub repository me/x (OfflineModeIsEnabled: Cannot reach "
    )
    assert not out.exists()  # no training, no output folder


def test_a_sweep_stops_before_its_first_task_when_a_later_tasks_repository_is_refused(
    checkpoints, tmp_path, monkeypatch
):
    from types import SimpleNamespace

    from huggingface_hub import HfApi

    from hfzoo.finetuning.sweep import main as sweep

    def create_repo(self, repo_id, **kwargs):
        if repo_id.endswith("-stsb"):
            raise PermissionError(f"403 Forbidden: no write access to {repo_id}")
        return SimpleNamespace(repo_id=repo_id)

    monkeypatch.setattr(HfApi, "create_repo", create_repo)
    data, out = tmp_path / "glue", tmp_path / "sweep"
    write_glue_dir(data, "rte")
    write_glue_dir(data, "stsb")
    with pytest.raises(SystemExit) as exit_info:
        sweep([
            "--model_name_or_path", str(checkpoints["encoder-tiny"]), "--data_dir", str(data), "--peft", "lora",
            "--output_dir", str(out), "--tasks", "rte", "stsb", "--", "--max_train_steps", "1", "--push_to_hub",
            "--hub_model_id", "me/m",
        ])  # fmt: skip
    assert str(exit_info.value.code) == (
        "error: --push_to_hub: cannot create the hub repository me/m-stsb (PermissionError: 403 Forbidden: no write "
        "access to me/m-stsb); check the network and --hub_token (or `hf auth login`), or train without "
        "--push_to_hub and upload the output folder later (`hf upload`)"
    )
    assert not out.exists()  # rte did not run


def test_a_non_finite_step_stops_the_run_unless_skips_are_allowed(checkpoints, glue_dir, tmp_path, capsys, caplog):
    """A learning rate that blows the weights up: the run stops at the first NaN step, keeping finite checkpoints.

    Before, the run trained on with NaN weights, saved them and reported the majority-class accuracy, exit status 0.
    """
    from safetensors.torch import load_file

    common = ("--peft", "none", "--learning_rate", "1e30", "--max_train_steps", "6", "--checkpointing_steps", "1",
              "--checkpoints_total_limit", "6")  # fmt: skip
    out = tmp_path / "stopped"
    with pytest.raises(SystemExit) as exit_info:
        finetune(argv(checkpoints["encoder-tiny"], glue_dir, out, "rte", *common))
    assert exit_info.value.code == 76
    error = capsys.readouterr().err
    assert "error: non-finite gradient norm (nan; loss nan) at step 2: its update was not applied and training stopped" \
        f" (skip such steps with --max_nonfinite_steps N); the last checkpoint, {out / 'checkpoints' / 'step_1'}, " \
        "is intact" in error  # fmt: skip
    assert (
        sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_1"]
        and not (out / "all_results.json").exists()
    )

    out = tmp_path / "skipping"
    results = finetune(argv(checkpoints["encoder-tiny"], glue_dir, out, "rte", *common, "--max_nonfinite_steps", "5"))
    assert results["train_steps"] == 6
    assert json.loads((out / "checkpoints" / "step_6" / GLUE_STATE).read_text())["nonfinite_steps"] == [2, 3, 4, 5, 6]
    weights = load_file(out / "model.safetensors")
    assert all(torch.isfinite(w.float()).all() for w in weights.values())  # no skipped update was applied
    assert "step 6: non-finite gradient norm (nan; loss nan); update skipped (5 of at most 5" in caplog.text
    with pytest.raises(SystemExit) as exit_info:  # one skip more than allowed
        finetune(argv(checkpoints["encoder-tiny"], glue_dir, tmp_path / "four", "rte", *common,
                      "--max_nonfinite_steps", "4"))  # fmt: skip
    assert exit_info.value.code == 76
    assert "at step 6: its update was not applied and training stopped (4 such step(s) already skipped ([2, 3, 4, 5]))" \
        in capsys.readouterr().err  # fmt: skip


def test_sigterm_stops_after_the_step_with_a_checkpoint_that_resumes_exactly(
    checkpoints, glue_dir, tmp_path, monkeypatch, capsys
):
    """A preempted job (SIGTERM) loses no step: the resumed run ends as the uninterrupted one, as pretraining's."""
    import os
    import signal

    from hfzoo.training import faults

    common = ("--logging_steps", "1", "--max_train_steps", "6", "--lora_dropout", "0.2")
    full = finetune(argv(checkpoints["encoder-tiny"], glue_dir, tmp_path / "full", "mrpc", *common))
    handler = signal.getsignal(signal.SIGTERM)
    real_step = faults.OptimizerStepper.step

    def step(self, grad_norm):
        taken = real_step(self, grad_norm)
        if self.last_step == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # the scheduler's signal, in the middle of step 3
        return taken

    monkeypatch.setattr(faults.OptimizerStepper, "step", step)
    out = tmp_path / "preempted"
    with pytest.raises(SystemExit) as exit_info:
        finetune(argv(checkpoints["encoder-tiny"], glue_dir, out, "mrpc", *common))  # no --checkpointing_steps
    assert exit_info.value.code == 75
    assert (f"stopped by SIGTERM after step 3; checkpoint {out / 'checkpoints' / 'step_3'} written; continue with "
            "--resume_from_checkpoint latest") in capsys.readouterr().err  # fmt: skip
    assert signal.getsignal(signal.SIGTERM) is handler  # the run's handler is gone with it
    monkeypatch.setattr(faults.OptimizerStepper, "step", real_step)
    resumed = finetune(argv(checkpoints["encoder-tiny"], glue_dir, out, "mrpc", *common,
                            "--resume_from_checkpoint", "latest"))  # fmt: skip
    for key in ("eval_accuracy", "eval_f1", "eval_loss", "best_epoch", "final_train_loss", "train_steps"):
        assert resumed[key] == full[key], key
    a, b = _trainable(tmp_path / "full"), _trainable(out)
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
@pytest.mark.distributed
def test_sigterm_to_accelerate_launch_of_two_processes_checkpoints_both(checkpoints, glue_dir, tmp_path):
    """SIGTERM to the launcher (torchrun forwards it): both processes stop after the same step, write their parts
    of one checkpoint, and the run says so once."""
    import signal

    from helpers.launch import wait_for_file

    from hfzoo.training.checkpointing import find_latest_checkpoint, verify_checkpoint

    out = tmp_path / "run"
    recipe = argv(checkpoints["encoder-tiny"], glue_dir, out, "rte", "--per_device_train_batch_size", "2",
                  "--checkpointing_steps", "4", "--num_train_epochs", "100")  # fmt: skip
    recipe[recipe.index("--max_train_steps") + 1] = "400"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(REPO / "accelerate_configs" /
           "ddp.yaml"), str(REPO / "recipes" / "finetune_glue.py"), *recipe]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_for_file(out / "checkpoints" / "step_4" / "manifest.json", proc)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=180)
    stopped = re.findall(r"^stopped by SIGTERM after step (\d+); checkpoint (\S+) written; .*$", stderr, re.MULTILINE)
    assert len(stopped) == 1, stderr[-3000:]  # one line, from the main process
    assert stderr.count("SIGTERM received: finishing the current step") == 2
    step, checkpoint = int(stopped[0][0]), out / "checkpoints" / f"step_{stopped[0][0]}"
    assert 4 <= step < 400 and Path(stopped[0][1]) == checkpoint
    assert find_latest_checkpoint(out, state_file=GLUE_STATE) == checkpoint
    verify_checkpoint(checkpoint, state_file=GLUE_STATE)
    assert json.loads((checkpoint / GLUE_STATE).read_text())["batch_layout"]["num_processes"] == 2
    assert {"random_states_0.pkl", "random_states_1.pkl"} <= {p.name for p in checkpoint.rglob("*")}


@pytest.mark.slow
@pytest.mark.distributed
def test_a_lost_node_stops_the_survivor_with_one_line_naming_it_and_the_checkpoint(checkpoints, glue_dir, tmp_path):
    """Two "nodes" (one process each) finetune; node 1 is SIGKILLed after the first checkpoint. Node 0 ends within
    its --ddp_timeout with one line naming the lost process and the checkpoint to resume from, no traceback."""
    from helpers.launch import free_port, kill_node, node_command, start_nodes, wait_for_file

    out = tmp_path / "run"
    recipe = argv(checkpoints["encoder-tiny"], glue_dir, out, "rte", "--per_device_train_batch_size", "2",
                  "--checkpointing_steps", "4", "--num_train_epochs", "100", "--ddp_timeout", "60")  # fmt: skip
    recipe[recipe.index("--max_train_steps") + 1] = "2000"
    script = [str(REPO / "recipes" / "finetune_glue.py")]
    port = free_port()
    nodes = start_nodes([node_command("ddp.yaml", r, port, recipe, script=script) for r in (0, 1)], tmp_path,
                        tmp_path / "logs")  # fmt: skip
    try:
        wait_for_file(out / "checkpoints" / "step_4" / "manifest.json", nodes[0], log=tmp_path / "logs" / "node0.log")
        kill_node(nodes[1])
        killed = time.monotonic()
        nodes[0].wait(timeout=120)
        elapsed = time.monotonic() - killed
    finally:
        for node in nodes:
            kill_node(node)
    survivor = (tmp_path / "logs" / "node0.log").read_text()
    assert nodes[0].returncode == 1 and elapsed < 60, (elapsed, survivor[-3000:])
    errors = [line for line in survivor.splitlines() if line.startswith("error: process 0:")]
    assert len(errors) == 1, survivor[-3000:]
    assert "lost process 1 (node 1, host " in errors[0]
    assert (
        f"restart every node with --resume_from_checkpoint latest (last complete checkpoint: {out}/checkpoints/step_"
        in errors[0]
    )
    assert "Traceback" not in survivor.split("error: process 0:")[0]  # the worker printed none (its launcher does)
    assert not (out / "all_results.json").exists()


@pytest.mark.slow
@pytest.mark.distributed
def test_a_sweep_under_accelerate_launch_reports_once(checkpoints, tmp_path):
    """Two processes run each task together; the main one alone prints the task lines and writes the tables (two
    processes replacing the same `results.json.tmp` could lose one's rename)."""
    data, out = tmp_path / "glue", tmp_path / "sweep"
    write_glue_dir(data, "rte")
    write_glue_dir(data, "stsb")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(REPO / "accelerate_configs" /
           "ddp.yaml"), str(REPO / "recipes" / "glue_sweep.py"), "--model_name_or_path", str(checkpoints["encoder-tiny"]),
           "--data_dir", str(data), "--peft", "lora", "--output_dir", str(out), "--tasks", "rte", "stsb", "--",
           "--max_train_steps", "1", "--per_device_train_batch_size", "2"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [line.split(":")[0] for line in proc.stdout.splitlines() if line.startswith("===")] == [
        "=== rte",
        "=== stsb",
    ]
    table = json.loads((out / "results.json").read_text())
    assert [r["task"] for r in table["tasks"]] == ["rte", "stsb"]
    assert all(r["train_steps"] == 1 for r in table["tasks"])
    assert not list(out.glob("*.tmp"))


def test_an_undefined_dev_metric_never_wins_the_best_epoch():
    from hfzoo.finetuning.loop import _improves

    nan = float("nan")
    assert _improves(0.2, None) and _improves(0.1, nan) and _improves(0.3, 0.2)
    assert not _improves(nan, 0.2) and not _improves(0.2, 0.3) and not _improves(0.2, 0.2)


def test_torch_compile_trains_like_eager_and_saves_the_eager_keys(checkpoints, glue_dir, tmp_path):
    """--torch_compile (regional by default; backend aot_eager: inductor is slow on CPU) on a dropout-free decoder."""
    from safetensors.torch import load_file

    ckpt = tmp_path / "decoder"
    config = AutoModel.from_pretrained(checkpoints["decoder-tiny"]).config
    config.hidden_dropout_prob = config.attention_probs_dropout_prob = 0.0
    AutoModel.from_pretrained(checkpoints["decoder-tiny"], config=config).save_pretrained(ckpt)
    AutoTokenizer.from_pretrained(checkpoints["decoder-tiny"]).save_pretrained(ckpt)
    results, graphs = {}, {}
    for name, extra in (("eager", []), ("compiled", ["--torch_compile", "--torch_compile_backend", "aot_eager"])):
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        results[name] = finetune(argv(ckpt, glue_dir, tmp_path / name, "sst2", "--peft", "none", *extra))
        graphs[name] = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    assert graphs["eager"] == 0 < graphs["compiled"], graphs  # the compiled run did run compiled graphs
    assert results["compiled"]["eval_loss"] == pytest.approx(results["eager"]["eval_loss"], rel=1e-5)
    keys = {name: list(load_file(tmp_path / name / "model.safetensors")) for name in results}
    assert keys["compiled"] == keys["eager"] and not any("_orig_mod" in k for k in keys["compiled"])
