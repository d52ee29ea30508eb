"""Fixtures of the study tests: the tiny study's inputs, and the study run once, uninterrupted, for every test."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers.glue_files import LAYOUTS, write_tsv
from helpers.study import PAPER_ROWS, PLANNED, tiny_study

from hfzoo.data.glue import GLUE_TASKS
from hfzoo.data.loading import clean_text
from hfzoo.study.runner import main
from hfzoo.tokenization import train_bpe_tokenizer


@pytest.fixture(scope="session")
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


@pytest.fixture(scope="session")
def uninterrupted(inputs, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("study_a")
    study = tiny_study(inputs, root / "study.yaml")
    records = main(["--study", str(study), "--output_dir", str(root / "out")])
    assert [(r["variant"], r["seed"]) for r in records] == PLANNED
    return root / "out"
