"""Streaming pretraining (`--streaming`): the same blocks as the map-style path, disjoint shards per process,
exact resume after a SIGKILL from the stream's saved position, and lazy reading of a file larger than the run needs.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.launch import GLOBAL_BATCH, check_two_processes, launch, recipe_args
from helpers.pretraining import base_args
from safetensors.torch import load_file

from hfzoo.data.loading import clean_text, load_raw_datasets
from hfzoo.data.packing import tokenize_and_pack
from hfzoo.pretraining.arguments import parse_pretrain_args
from hfzoo.pretraining.loop import main
from hfzoo.tokenization import train_bpe_tokenizer
from hfzoo.training.streaming import stream_blocks

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tokenizer(gutenberg_books):
    return train_bpe_tokenizer([[clean_text(b["text"]) for b in gutenberg_books]], vocab_size=512)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("tokenizer")
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def books_jsonl(tmp_path_factory, gutenberg_books) -> Path:
    """The 4 books cut into 40 documents (chapters of ~equal length), as JSON lines."""
    path = tmp_path_factory.mktemp("books") / "books.jsonl"
    rows = []
    for book in gutenberg_books:
        text = clean_text(book["text"])
        step = len(text) // 10 + 1
        rows += [{"text": text[i : i + step]} for i in range(0, len(text), step)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def streamed_raw(train_file: Path):
    """The file streamed as `train`, and again as `validation`."""
    return load_raw_datasets(train_file=[str(train_file)], validation_file=[str(train_file)], streaming=True)


def test_streamed_blocks_are_the_map_style_blocks(books_jsonl, tokenizer):
    raw = load_raw_datasets(train_file=[str(books_jsonl)], validation_file=[str(books_jsonl)])
    packed = tokenize_and_pack(raw, tokenizer, "text", 64)["train"]
    train, _ = stream_blocks(streamed_raw(books_jsonl), tokenizer, "text", 64, with_labels=True)
    streamed = [row["input_ids"] for row in train]
    assert len(streamed) == len(packed) > 100
    assert streamed == packed["input_ids"]  # every block, in order
    assert all(row["labels"] == row["input_ids"] for row in train.take(3))


def test_two_processes_read_disjoint_shards(books_jsonl, tokenizer):
    shards = [
        [tuple(r["input_ids"]) for r in stream_blocks(streamed_raw(books_jsonl), tokenizer, "text", 64, True,
                                                      process_index=rank, num_processes=2)[0]]
        for rank in (0, 1)
    ]  # fmt: skip
    assert min(map(len, shards)) > 50
    assert not set(shards[0]) & set(shards[1])
    whole = [tuple(r["input_ids"]) for r in stream_blocks(streamed_raw(books_jsonl), tokenizer, "text", 64, True)[0]]
    # Each process packs its own documents: together they hold the whole stream's tokens, less the
    # tails of their packing calls (under one block each).
    assert abs(len(shards[0]) + len(shards[1]) - len(whole)) <= 2


def test_held_out_validation_stream_is_every_kth_document(books_jsonl, tokenizer):
    raw = load_raw_datasets(train_file=[str(books_jsonl)], validation_split_percentage=10, streaming=True)
    documents = [json.loads(line)["text"] for line in books_jsonl.read_text().splitlines()]
    assert [r["text"] for r in raw["validation"]] == documents[::10]
    assert [r["text"] for r in raw["train"]] == [d for i, d in enumerate(documents) if i % 10]
    train, validation = stream_blocks(raw, tokenizer, "text", 64, True)
    assert not {tuple(r["input_ids"]) for r in train} & {tuple(r["input_ids"]) for r in validation}


def streaming_run_args(books_jsonl, tokenizer_dir, output_dir, *extra):
    argv = base_args(books_jsonl, tokenizer_dir, output_dir, "--streaming", "--logging_steps", "1",
                     "--max_train_samples", "40", "--max_train_steps", "14", "--checkpointing_steps", "4",
                     "--checkpoints_total_limit", "5", "--learning_rate", "3e-3", *extra)  # fmt: skip
    argv[argv.index("--validation_split_percentage") : argv.index("--validation_split_percentage") + 2] = []
    return argv


def test_sigkill_and_resume_latest_continue_with_the_uninterrupted_blocks(books_jsonl, tokenizer_dir, tmp_path):
    """40 blocks in batches of 4: 10 steps a pass, so the 14 steps cross into a second pass of the stream."""
    full = tmp_path / "full"
    main(streaming_run_args(books_jsonl, tokenizer_dir, full))
    out = tmp_path / "killed"
    argv = streaming_run_args(books_jsonl, tokenizer_dir, out)
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "tests" / "helpers" / "kill_during_save.py"), *argv],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert not (out / "model.safetensors").exists() and (out / "checkpoints" / "step_4").is_dir()
    main([*argv, "--resume_from_checkpoint", "latest"])  # from step 4: its second save was torn by the kill
    a, b = load_file(full / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    history = {d: json.loads((d / "train_history.json").read_text())["log_history"] for d in (full, out)}
    losses = {d: {r["step"]: r["train_loss"] for r in h} for d, h in history.items()}
    # steps 1..4 are the records saved in step_4 (the killed run's), 5..14 were trained after the resume
    assert sorted(losses[out]) == list(range(1, 15))
    assert all(losses[out][s] == losses[full][s] for s in losses[out])  # on the same blocks, with the same weights


def test_streaming_reads_lazily_from_a_file_larger_than_the_run_needs(books_jsonl, tokenizer_dir, tmp_path):
    """A 40 MB file whose last line is not JSON: a streamed run never gets there; the map-style one would fail.

    Packing concatenates up to 1000 documents at a time (`PACK_BATCH_SIZE`), so the run reads a few thousand
    2,000-character documents (training, and the held-out stream: every 4th document) of the ~20,000.
    """
    big = tmp_path / "big.jsonl"
    text = " ".join(json.loads(line)["text"] for line in books_jsonl.read_text().splitlines())
    documents = [json.dumps({"text": text[i : i + 2000]}) + "\n" for i in range(0, len(text), 2000)]
    with big.open("w") as f:
        while f.tell() < 40_000_000:
            f.writelines(documents)
        f.write("{not json\n")
    results = main(base_args(big, tokenizer_dir, tmp_path / "out", "--streaming", "--max_train_steps", "2",
                             "--max_eval_samples", "4"))  # fmt: skip
    assert results["train_steps"] == 2 and results["eval_blocks"] == 4
    with pytest.raises(Exception):  # noqa: B017  (datasets' JSON reader raises its own error types)
        load_raw_datasets(train_file=[str(big)])


def test_streaming_needs_max_train_steps(books_jsonl, capsys):
    with pytest.raises(SystemExit):
        parse_pretrain_args(["--streaming", "--train_file", str(books_jsonl), "--tokenizer_name", "t",
                             "--config_name", "decoder-tiny", "--output_dir", "o"])  # fmt: skip
    assert "--streaming needs --max_train_steps" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.distributed
def test_two_process_streamed_run_reads_disjoint_shards_and_resumes_exactly(books_jsonl, tokenizer_dir, tmp_path):
    """DDP over gloo: each process trains on its shard; a checkpoint holds both positions; resuming gives the same weights."""
    argv = [*recipe_args(books_jsonl, tokenizer_dir, tmp_path / "full", GLOBAL_BATCH // 2, "--streaming",
                         "--checkpointing_steps", "2", "--checkpoints_total_limit", "5")]  # fmt: skip
    argv[argv.index("--max_train_steps") + 1] = "4"
    check_two_processes(launch("ddp.yaml", argv, tmp_path), "MULTI_CPU")
    state = torch.load(tmp_path / "full" / "checkpoints" / "step_2" / "custom_checkpoint_0.pkl", weights_only=False)
    assert state["num_processes"] == 2 and len(state["positions"]) == 2  # each process's place in its shard
    resumed = [a if a != str(tmp_path / "full") else str(tmp_path / "resumed") for a in argv]
    launch(
        "ddp.yaml", [*resumed, "--resume_from_checkpoint", str(tmp_path / "full" / "checkpoints" / "step_2")], tmp_path
    )
    a, b = load_file(tmp_path / "full" / "model.safetensors"), load_file(tmp_path / "resumed" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
