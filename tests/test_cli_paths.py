"""Every console script's path and file arguments: refused before any work, or (an output) created, never late.

For each console script of pyproject.toml, each path argument is given a missing folder, an unwritable
location and an existing file where a folder is expected (or a folder where a file is expected). Work is the
first model or dataset built (`PreTrainedModel.__init__`, `datasets.load_dataset`, `datasets.Dataset.from_dict`):
each is replaced by a stand-in that stops the command there. A bad path must be refused before it, in one
line, leaving nothing on disk; an output under a missing folder must exist by then (the folder created).
"""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

import datasets
import pytest
import torch
import transformers
from helpers.glue_files import write_glue_dir
from helpers.pretraining import TINY_OVERRIDES
from transformers import AutoModelForCausalLM

from hfzoo.models.presets import build_config

REPO_ROOT = Path(__file__).resolve().parents[1]
UNWRITABLE = Path("/sys/hfzoo-unwritable")  # refused even to root


class WorkStarted(BaseException):
    """Raised by the stand-ins for the first model or dataset (a BaseException: no handler swallows it)."""


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tokenizer_dir, small_jsonl_xz) -> dict[str, Path]:
    """A tiny decoder checkpoint with its tokenizer, a GLUE folder, a text file, a study file."""
    root = tmp_path_factory.mktemp("cli_inputs")
    model = root / "model"
    config = build_config("decoder-tiny", TINY_OVERRIDES, vocab_size=512)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(model)
    transformers.AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(model)
    (root / "text.txt").write_text("It was the best of times, it was the worst of times.\n" * 20)
    write_glue_dir(root / "glue", "sst2")
    study = yaml_study(root / "study.yaml", tokenizer_dir, small_jsonl_xz, root / "glue")
    return {"model": model, "tokenizer": Path(tokenizer_dir), "train": Path(small_jsonl_xz), "text": root / "text.txt",
            "glue": root / "glue", "study": study}  # fmt: skip


def yaml_study(path: Path, tokenizer: Path, train: Path, glue: Path) -> Path:
    import yaml

    values = yaml.safe_load((REPO_ROOT / "recipes" / "studies" / "narang_small.yaml").read_text())
    values.update(family="decoder", variants=["Vanilla Transformer"], seeds=[0], tokenizer_name=str(tokenizer), tokenizer_train_file=None,
                  train_file=[str(train)], glue_data_dir=str(glue), glue_tasks=["sst2"], paper_table=None,
                  config_overrides={"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2,
                                    "head_dim": 16, "num_hidden_layers": 2, "num_decoder_layers": 2},
                  block_size=32, train_batch_tokens=128, max_train_steps=8, validation_split_percentage=25)  # fmt: skip
    path.write_text(yaml.safe_dump(values))
    return path


#: Per console script: its module, a good command line (`{name}` placeholders: `inputs` and `out`), and its
#: path arguments with their kind: `in_file`, `in_dir`, `out_dir`, `out_file`.
SCRIPTS = {
    "hfzoo-train-tokenizer": (
        "hfzoo.pretraining.tokenizer",
        ["--train_file", "{train}", "--vocab_size", "300", "--output_dir", "{out}"],
        {"--train_file": "in_file", "--output_dir": "out_dir"},
    ),
    "hfzoo-pretrain": (
        "hfzoo.pretraining.loop",
        ["--train_file", "{train}", "--tokenizer_name", "{tokenizer}", "--config_name", "decoder-tiny",
         "--config_overrides", TINY_OVERRIDES, "--block_size", "32", "--per_device_train_batch_size", "4",
         "--max_train_steps", "2", "--validation_file", "{text}", "--checkpointing_steps", "2", "--output_dir", "{out}"],
        {"--train_file": "in_file", "--validation_file": "in_file", "--tokenizer_name": "in_dir",
         "--model_name_or_path": "in_dir", "--output_dir": "out_dir", "--resume_from_checkpoint": "in_dir"},
    ),
    "hfzoo-finetune-glue": (
        "hfzoo.finetuning.glue",
        ["--task_name", "sst2", "--model_name_or_path", "{model}", "--data_dir", "{glue}", "--peft", "none",
         "--max_train_steps", "2", "--output_dir", "{out}"],
        {"--model_name_or_path": "in_dir", "--data_dir": "in_dir", "--output_dir": "out_dir",
         "--resume_from_checkpoint": "in_dir"},
    ),
    "hfzoo-evaluate-lm": (
        "hfzoo.pretraining.evaluation",
        ["--model_name_or_path", "{model}", "--validation_file", "{text}", "--block_size", "32",
         "--output_file", "{out}/eval.json"],
        {"--model_name_or_path": "in_dir", "--validation_file": "in_file", "--output_file": "out_file"},
    ),
    "hfzoo-convert": (
        "hfzoo.convert.cli",
        ["--model_name_or_path", "{model}", "--output_dir", "{out}"],
        {"--model_name_or_path": "in_dir", "--output_dir": "out_dir"},
    ),
    "hfzoo-study": (
        "hfzoo.study.runner",
        ["--study", "{study}", "--output_dir", "{out}"],
        {"--study": "in_file", "--output_dir": "out_dir"},
    ),
}  # fmt: skip


def test_every_console_script_is_walked():
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert sorted(scripts) == sorted(SCRIPTS)
    for name, (module, _, _) in SCRIPTS.items():
        assert scripts[name].split(":")[0] == module


def bad_paths(kind: str, root: Path) -> dict[str, Path]:
    """Paths an argument of `kind` must refuse (an output under a missing folder is created instead)."""
    (root / "a_file").write_text("")
    (root / "a_folder").mkdir(exist_ok=True)
    if kind in ("in_file", "in_dir"):
        return {"missing-folder": root / "nodir" / "x", "unwritable": UNWRITABLE / "x",
                "wrong-kind": root / ("a_folder" if kind == "in_file" else "a_file")}  # fmt: skip
    return {"unwritable": UNWRITABLE / "out", "file-as-folder": root / "a_file" / "out",
            "wrong-kind": root / ("a_file" if kind == "out_dir" else "a_folder")}  # fmt: skip


CASES = [(script, argument, kind, case) for script, (_, _, arguments) in SCRIPTS.items()
         for argument, kind in arguments.items()
         for case in (["missing-folder", "unwritable", "wrong-kind"] if kind.startswith("in") else
                      ["missing-folder", "unwritable", "file-as-folder", "wrong-kind"])]  # fmt: skip


def command_line(script: str, inputs: dict[str, Path], out: Path, argument: str, value: Path) -> list[str]:
    """The script's good command line with `argument` set to `value`."""
    _, template, _ = SCRIPTS[script]
    argv = [part.format(out=out, **inputs) for part in template]
    if argument == "--model_name_or_path" and "--config_name" in argv:  # the pretrained model brings its config
        argv[argv.index("--config_name") : argv.index("--config_overrides") + 2] = []
    if argument in argv:
        argv[argv.index(argument) + 1] = str(value)
    else:
        argv += [argument, str(value)]
    return argv


@pytest.mark.parametrize("script, argument, kind, case", CASES, ids=["-".join(c) for c in CASES])
def test_a_path_argument_is_refused_before_work_or_its_output_folder_created(
    script, argument, kind, case, inputs, tmp_path, monkeypatch, capsys
):
    root = tmp_path / "work"
    root.mkdir()
    seen: dict[str, bool] = {}
    if case == "missing-folder" and kind.startswith("out"):
        value = root / "new" / "sub" / ("eval.json" if kind == "out_file" else "out")
        expected = value.parent if kind == "out_file" else value
    else:
        value = bad_paths(kind, root)[case]
        expected = None

    def work(*args, **kwargs):
        seen["output folder existed"] = expected is not None and expected.is_dir()
        raise WorkStarted

    monkeypatch.setattr(transformers.PreTrainedModel, "__init__", work)
    monkeypatch.setattr(datasets, "load_dataset", work)
    monkeypatch.setattr(datasets.Dataset, "from_dict", work)
    module = importlib.import_module(SCRIPTS[script][0])
    argv = command_line(script, inputs, root / "out", argument, value)
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    if expected is not None:  # an output under a missing folder: the command gets to work, its folder made
        with pytest.raises(WorkStarted):
            module.main(argv)
        assert seen == {"output folder existed": True}
        return
    with pytest.raises(SystemExit) as exit_info:
        module.main(argv)
    assert not seen, f"{script} {argument} {value}: work started before the refusal"
    code = exit_info.value.code
    message = code if isinstance(code, str) else capsys.readouterr().err.strip().splitlines()[-1]
    assert isinstance(code, str) or code == 2, code
    assert "error" in message and "\n" not in message.strip(), message
    if kind.startswith("in"):  # the message names the argument and the path given, and what is wrong with it
        assert f"{argument} {value}" in message, message
        if case == "wrong-kind" and argument not in ("--data_dir", "--resume_from_checkpoint"):
            assert ("is a file, not a folder" if kind == "in_dir" else "is a directory, not a") in message, message
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before  # nothing left on disk


@pytest.mark.parametrize("script", ["hfzoo-pretrain", "hfzoo-finetune-glue", "hfzoo-convert"])
def test_an_output_dir_that_is_the_source_checkpoint_is_refused_before_work(script, inputs, monkeypatch, capsys):
    """Its weights (and, for an adapter, an `adapter_config.json` that changes how it loads) would be written over."""

    def work(*args, **kwargs):
        raise WorkStarted

    monkeypatch.setattr(transformers.PreTrainedModel, "__init__", work)
    monkeypatch.setattr(datasets, "load_dataset", work)
    model = inputs["model"]
    before = {p.name: p.read_bytes() for p in model.iterdir()}
    if script == "hfzoo-pretrain":
        argv = ["--train_file", str(inputs["train"]), "--model_name_or_path", str(model), "--block_size", "32",
                "--output_dir", f"{model}/"]  # fmt: skip
    else:
        argv = command_line(script, inputs, model.parent / "." / model.name, "--model_name_or_path", model)
    with pytest.raises(SystemExit) as exit_info:
        importlib.import_module(SCRIPTS[script][0]).main(argv)
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_info.value.code == 2 and "--output_dir" in message, message
    assert "is the --model_name_or_path folder" in message, message
    assert {p.name: p.read_bytes() for p in model.iterdir()} == before
