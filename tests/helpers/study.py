"""The tiny study the tests of `hfzoo.study` run: its study file, inputs' names, and readers of its outputs."""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from hfzoo.study.protocol import NO_PRETRAINING
from hfzoo.study.runner import main

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


def expect_refusal(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    message = exc.value.code if isinstance(exc.value.code, str) else capsys.readouterr().err
    assert "\n" not in message.strip(), f"error is not one line: {message!r}"
    return message


def copy_inputs(inputs: dict[str, str], folder: Path) -> dict[str, str]:
    """The tiny study's inputs copied into `folder/data`, named relative to `folder` (`data/<name>`)."""
    (folder / "data").mkdir(parents=True)
    copies = {}
    for key, source in inputs.items():
        name = Path(source).name
        (shutil.copytree if Path(source).is_dir() else shutil.copy)(source, folder / "data" / name)
        copies[key] = f"data/{name}"
    return copies
