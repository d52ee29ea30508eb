"""The console scripts of pyproject.toml, run as installed (`hfzoo-*` beside this Python) and as `python -m`.

One tiny real run each: a tokenizer, a 2-step pretraining run with it, its evaluation, a 2-step GLUE
finetuning of that checkpoint, and the conversion of GPT-2, BERT and T5 checkpoints to hfzoo and back.
"""

from __future__ import annotations

import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.glue_files import write_glue_dir
from safetensors.torch import load_file
from transformers import (
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSeq2SeqLM,
    BertConfig,
    BertForMaskedLM,
    GPT2Config,
    GPT2LMHeadModel,
    T5Config,
    T5ForConditionalGeneration,
)

import hfzoo  # noqa: F401

BIN = Path(sys.executable).parent
#: console script -> the module `python -m` runs.
SCRIPTS = {
    "hfzoo-train-tokenizer": "hfzoo.pretraining.tokenizer",
    "hfzoo-pretrain": "hfzoo.pretraining.loop",
    "hfzoo-finetune-glue": "hfzoo.finetuning.glue",
    "hfzoo-evaluate-lm": "hfzoo.pretraining.evaluation",
    "hfzoo-convert": "hfzoo.convert",
    "hfzoo-study": "hfzoo.study.runner",
}
TEXT = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light. "
)


def run(*cmd: str, cwd: Path | None = None) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=cwd, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{cmd[0]} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


def script(name: str) -> str:
    path = BIN / name
    assert path.is_file(), f"{name} is not installed beside {sys.executable} (pip install -e .)"
    return str(path)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_help_from_the_console_script_and_python_m(name, monkeypatch, capsys):
    out = run(script(name), "--help")
    assert out.startswith(f"usage: {name} ") and ("--model_name_or_path" in out or "--train_file" in out)
    # `python -m MODULE --help`, run in this process the way `-m` runs it (runpy, as `__main__`).
    monkeypatch.setattr(sys, "argv", [SCRIPTS[name], "--help"])
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_module(SCRIPTS[name], run_name="__main__", alter_sys=True)
    assert exit_info.value.code == 0 and capsys.readouterr().out == out


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("scripts")
    lines = [json.dumps({"text": f"Chapter {i}. {TEXT * 3}"}) for i in range(40)]
    (root / "books.jsonl").write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture(scope="module")
def pretrained(workdir) -> Path:
    """hfzoo-train-tokenizer, then hfzoo-pretrain (2 steps) with that tokenizer."""
    run(script("hfzoo-train-tokenizer"), "--train_file", str(workdir / "books.jsonl"), "--vocab_size", "300",
        "--model_family", "decoder", "--output_dir", str(workdir / "tok"))  # fmt: skip
    assert json.loads((workdir / "tok" / "tokenizer_training_args.json").read_text())["vocab_size"] == 300
    run(script("hfzoo-pretrain"), "--train_file", str(workdir / "books.jsonl"), "--tokenizer_name",
        str(workdir / "tok"), "--config_name", "decoder-tiny", "--config_overrides",
        "hidden_size=32,num_hidden_layers=2,num_attention_heads=2,intermediate_size=64,max_position_embeddings=64",
        "--block_size", "32", "--per_device_train_batch_size", "4", "--max_train_steps", "2",
        "--max_eval_samples", "4", "--output_dir", str(workdir / "model"))  # fmt: skip
    return workdir / "model"


def test_pretrain_and_evaluate_lm_scripts(pretrained, workdir):
    results = json.loads((pretrained / "all_results.json").read_text())
    assert results["train_steps"] == 2 and results["objective"] == "clm"
    run(script("hfzoo-evaluate-lm"), "--model_name_or_path", str(pretrained), "--validation_file",
        str(workdir / "books.jsonl"), "--max_eval_samples", "4", "--prompt", "It was", "--max_new_tokens", "4",
        "--output_file", str(workdir / "evaluation.json"))  # fmt: skip
    evaluation = json.loads((workdir / "evaluation.json").read_text())
    assert evaluation["books.jsonl"]["blocks"] == 4 and evaluation["books.jsonl"]["block_size"] == 32
    assert evaluation["sample"]["text"].startswith("It was") and evaluation["sample"]["cache_equal"] is True


def test_finetune_glue_script(pretrained, workdir):
    glue = write_glue_dir(workdir / "glue", "mrpc")
    run(script("hfzoo-finetune-glue"), "--task_name", "mrpc", "--model_name_or_path", str(pretrained),
        "--data_dir", str(glue), "--max_train_steps", "2", "--per_device_train_batch_size", "2",
        "--max_length", "32", "--output_dir", str(workdir / "mrpc"))  # fmt: skip
    results = json.loads((workdir / "mrpc" / "all_results.json").read_text())
    assert results["train_steps"] == 2 and 0.0 <= results["eval_accuracy"] <= 1.0
    assert (workdir / "mrpc" / "adapter_config.json").is_file()


def _tiny_reference(family: str):
    torch.manual_seed(0)
    if family == "gpt2":
        return GPT2LMHeadModel(
            GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0)
        ), (AutoModelForCausalLM)
    if family == "bert":
        config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=32, max_position_embeddings=32)  # fmt: skip
        return BertForMaskedLM(config), AutoModelForMaskedLM
    config = T5Config(vocab_size=64, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_heads=2,
                      feed_forward_proj="gated-gelu", decoder_start_token_id=0)  # fmt: skip
    return T5ForConditionalGeneration(config), AutoModelForSeq2SeqLM


@pytest.mark.parametrize("family", ["gpt2", "bert", "t5"])
def test_convert_script_both_ways(family, tmp_path):
    """transformers checkpoint -> hfzoo (console script) -> transformers (python -m): the same tensors, same logits."""
    reference, auto_class = _tiny_reference(family)
    reference.save_pretrained(tmp_path / "source")
    run(script("hfzoo-convert"), "--model_name_or_path", str(tmp_path / "source"), "--output_dir", str(tmp_path / "hf"))
    converted = auto_class.from_pretrained(tmp_path / "hf")
    assert converted.config.model_type.startswith("hfzoo_")
    run(sys.executable, "-m", "hfzoo.convert", "--model_name_or_path", str(tmp_path / "hf"),
        "--output_dir", str(tmp_path / "back"))  # fmt: skip
    original, back = (
        load_file(tmp_path / "source" / "model.safetensors"),
        load_file(tmp_path / "back" / "model.safetensors"),
    )
    assert set(back) == set(original) and all(torch.equal(back[k], original[k]) for k in original)
    ids = torch.tensor([[3, 5, 7, 11, 13]])
    extra = {"decoder_input_ids": ids} if family == "t5" else {}
    with torch.no_grad():
        torch.testing.assert_close(
            converted.eval()(input_ids=ids, **extra).logits, reference.eval()(input_ids=ids, **extra).logits
        )


def test_convert_script_refuses_an_unknown_model_type(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "config.json").write_text(json.dumps({"model_type": "bloom"}))
    proc = subprocess.run([script("hfzoo-convert"), "--model_name_or_path", str(tmp_path / "src"), "--output_dir",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 1 and "model_type 'bloom' has no converter" in proc.stderr
