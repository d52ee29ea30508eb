"""Streaming pretraining (`--streaming`): the same blocks as the map-style path, disjoint shards per process,
exact resume after a SIGKILL from the stream's saved position, and lazy reading of a file larger than the run needs.
"""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import datasets
import pytest
import torch
from helpers.launch import GLOBAL_BATCH, check_two_processes, launch, recipe_args
from helpers.pretraining import base_args, restored_steps, run_main_expecting_error, tag_saved_history
from safetensors.torch import load_file
from torch.utils.data import DataLoader

from hfzoo.data.loading import DataReadError, clean_text, load_raw_datasets
from hfzoo.data.packing import (
    PACK_BATCH_SIZE,
    TOKENIZE_BATCH_SIZE,
    PackedStream,
    group_texts,
    pack_stream,
    tokenize_and_pack,
)
from hfzoo.pretraining.arguments import parse_pretrain_args
from hfzoo.pretraining.loop import main
from hfzoo.tokenization import train_bpe_tokenizer
from hfzoo.training.streaming import StreamingTrainLoader, stream_blocks

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
    assert all(row["labels"] == row["input_ids"] for row in itertools.islice(train, 3))


@pytest.fixture
def documents():
    """A new stream of 60 token-id documents of 0-200 tokens (some shorter than a block, some multiples of 16).

    A new one each call: a stream keeps a loaded position for every later pass of its epoch (`datasets`).
    """
    generator = torch.Generator().manual_seed(0)
    lengths = [int(n) for n in torch.randint(0, 200, (57,), generator=generator)] + [16, 32, 0]
    rows = [list(range(1000 * i, 1000 * i + n)) for i, n in enumerate(lengths)]
    return lambda: datasets.Dataset.from_dict({"input_ids": rows}).to_iterable_dataset()


def test_packed_stream_cuts_group_texts_blocks_from_each_group_of_documents(documents):
    rows = [row["input_ids"] for row in documents()]
    expected = []
    for start in range(0, len(rows), 7):  # the map-style path's packing calls of 7 documents
        expected += group_texts(16)({"input_ids": rows[start : start + 7]})["input_ids"]
    streamed = list(PackedStream(documents(), 16, group_size=7))
    assert [row["input_ids"] for row in streamed] == expected and len(expected) > 40
    assert all(row["labels"] == row["input_ids"] for row in streamed)
    assert [row["input_ids"] for row in PackedStream(documents(), 16, False, 7, max_blocks=5)] == expected[:5]
    assert list(PackedStream(documents(), 16, False, 7, max_blocks=5))[0].keys() == {"input_ids"}


def test_packed_stream_resumes_after_every_block(documents):
    """A position saved after any block (inside a document, at a document's or a group's end) continues exactly."""
    whole = [row["input_ids"] for row in PackedStream(documents(), 16, group_size=7, max_blocks=60)]
    for taken in range(len(whole) + 1):
        stream = PackedStream(documents(), 16, group_size=7, max_blocks=60)
        head = [row["input_ids"] for row in itertools.islice(stream, taken)]
        resumed = PackedStream(documents(), 16, group_size=7, max_blocks=60)
        resumed.load_state_dict(stream.state_dict())
        assert head + [row["input_ids"] for row in resumed] == whole, taken
    # A position saved in a later pass brings its pass back; a saved position belongs to its pass only.
    stream = PackedStream(documents(), 16, group_size=7)
    assert len(list(stream)) > 60
    stream.set_epoch(1)
    next(iter(stream))
    resumed = PackedStream(documents(), 16, group_size=7)
    resumed.load_state_dict(stream.state_dict())
    assert resumed.epoch == 1 and next(iter(resumed))["input_ids"] == whole[1]
    resumed.set_epoch(2)
    assert [row["input_ids"] for row in itertools.islice(resumed, 3)] == whole[:3]


def test_first_streamed_block_waits_for_one_tokenizer_batch_not_a_packing_group(tokenizer):
    read = []

    def books():
        for i in range(5 * TOKENIZE_BATCH_SIZE):
            read.append(i)
            yield {"text": f"Chapter {i}. " + "It was a dark and stormy night, and the rain fell. " * 40}

    stream = pack_stream(datasets.IterableDataset.from_generator(books), tokenizer, "text", 64)
    read.clear()  # `from_generator` read the first document for its features
    next(iter(stream))
    assert 0 < len(read) <= TOKENIZE_BATCH_SIZE < PACK_BATCH_SIZE


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


def test_a_record_that_cannot_be_parsed_stops_the_stream_in_one_line_naming_the_data(
    books_jsonl, tokenizer, tokenizer_dir, tmp_path, capsys
):
    """A line that is not JSON, met once training reads on: pyarrow's error came as a traceback from inside
    `datasets`, on the loader's thread; the run stops with one line naming the data instead."""
    first, broken = tmp_path / "first.jsonl", tmp_path / "broken.jsonl"
    first.write_text(json.dumps({"text": "It was the best of times. " * 40}) + "\n")
    broken.write_text(json.dumps({"text": "It was the worst of times."}) + "\n{not json\n")
    raw = load_raw_datasets(train_file=[str(first), str(broken)], validation_file=[str(books_jsonl)], streaming=True)
    train, validation = stream_blocks(raw, tokenizer, "text", 64, True, sources=("the books", "the others"))
    assert len(list(validation)) > 0
    with pytest.raises(DataReadError, match=r"^the books: cannot be read \(ArrowInvalid: JSON parse error: "):
        list(train)
    argv = streaming_run_args(first, tokenizer_dir, tmp_path / "run", "--max_train_steps", "20")
    argv[argv.index("--train_file") + 1 : argv.index("--train_file") + 2] = [str(first), str(broken)]
    argv += ["--validation_file", str(books_jsonl)]
    message = run_main_expecting_error(argv, capsys)
    assert message.startswith(
        f"error: --train_file {[str(first), str(broken)]}: cannot be read (ArrowInvalid: JSON parse error: "
    ), message


def streaming_run_args(books_jsonl, tokenizer_dir, output_dir, *extra):
    argv = base_args(books_jsonl, tokenizer_dir, output_dir, "--streaming", "--logging_steps", "1",
                     "--max_train_samples", "40", "--max_train_steps", "14", "--checkpointing_steps", "4",
                     "--checkpoints_total_limit", "5", "--learning_rate", "3e-3", *extra)  # fmt: skip
    argv[argv.index("--validation_split_percentage") : argv.index("--validation_split_percentage") + 2] = []
    return argv


def test_sigkill_and_resume_latest_continue_with_the_uninterrupted_blocks(books_jsonl, tokenizer_dir, tmp_path):
    """40 blocks in batches of 4: 10 steps a pass, so the 14 steps cross into a second pass of the stream."""
    full = tmp_path / "full"
    main(streaming_run_args(books_jsonl, tokenizer_dir, full, "--checkpointing_steps", "2"))  # keeps 6, 8, ..., 14
    out = tmp_path / "killed"
    argv = streaming_run_args(books_jsonl, tokenizer_dir, out)
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "tests" / "helpers" / "kill_during_save.py"), *argv],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert not (out / "model.safetensors").exists() and (out / "checkpoints" / "step_4").is_dir()
    tag_saved_history(out / "checkpoints" / "step_4")
    main([*argv, "--resume_from_checkpoint", "latest"])  # from step 4: its second save was torn by the kill
    assert restored_steps(out) == (list(range(1, 15)), [1, 2, 3, 4])  # resumed, not started over
    a, b = load_file(full / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    history = {d: json.loads((d / "train_history.json").read_text())["log_history"] for d in (full, out)}
    losses = {d: {r["step"]: r["train_loss"] for r in h} for d, h in history.items()}
    # steps 1..4 are the records saved in step_4 (the killed run's), 5..14 were trained after the resume
    assert sorted(losses[out]) == list(range(1, 15))
    assert all(losses[out][s] == losses[full][s] for s in losses[out])  # on the same blocks, with the same weights
    # Resumed in the second pass (step 12): the saved pass and position come back, not the first pass.
    late = tmp_path / "late"
    tag_saved_history(full / "checkpoints" / "step_12")
    main([*streaming_run_args(books_jsonl, tokenizer_dir, late), "--resume_from_checkpoint",
          str(full / "checkpoints" / "step_12")])  # fmt: skip
    c = load_file(late / "model.safetensors")
    assert all(torch.equal(a[k], c[k]) for k in a)
    assert restored_steps(late) == (list(range(1, 15)), list(range(1, 13)))
    # Saved after the first pass's last batch (step 10): the resumed pass has no batch left, the next one follows.
    edge = tmp_path / "edge"
    tag_saved_history(full / "checkpoints" / "step_10")
    main([*streaming_run_args(books_jsonl, tokenizer_dir, edge), "--resume_from_checkpoint",
          str(full / "checkpoints" / "step_10")])  # fmt: skip
    assert all(torch.equal(a[k], v) for k, v in load_file(edge / "model.safetensors").items())
    assert restored_steps(edge) == (list(range(1, 15)), list(range(1, 11)))


def test_streaming_reads_lazily_from_a_file_larger_than_the_run_needs(books_jsonl, tokenizer_dir, tmp_path):
    """A 40 MB file whose last line is not JSON: a streamed run never gets there; the map-style one would fail.

    The run reads a few hundred 2,000-character documents (training, and the held-out stream: every 4th
    document) of the ~20,000.
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
    tag_saved_history(tmp_path / "full" / "checkpoints" / "step_2")
    launch(
        "ddp.yaml", [*resumed, "--resume_from_checkpoint", str(tmp_path / "full" / "checkpoints" / "step_2")], tmp_path
    )
    # Resumed from step_2, not started over (which, with the same seed, would end with the same weights).
    assert restored_steps(tmp_path / "resumed") == ([1, 2, 3, 4], [1, 2])
    a, b = load_file(tmp_path / "full" / "model.safetensors"), load_file(tmp_path / "resumed" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _loader(stream: PackedStream, batch_size: int = 2, **kwargs) -> StreamingTrainLoader:
    """A one-process loader of `stream` (rank 0 of 1)."""
    return StreamingTrainLoader(stream, batch_size, SimpleNamespace(process_index=0, num_processes=1), **kwargs)


def test_read_ahead_loader_gives_the_stream_s_batches_and_resumes_after_each_one_taken(documents):
    """The reading thread runs ahead, but a position saved after any batch the loop took resumes with the next."""
    whole = [[row["input_ids"] for row in batch] for batch in DataLoader(PackedStream(documents(), 16), batch_size=3,
                                                                          collate_fn=list)]  # fmt: skip
    assert len(whole) > 10
    for taken in range(len(whole) + 1):
        loader = _loader(PackedStream(documents(), 16), 3, prefetch_batches=4)
        batches = iter(loader)
        head = [[row["input_ids"] for row in batch] for batch in itertools.islice(batches, taken)]
        state = loader.state_dict()  # the reader is ahead by now, its position is not the one saved
        batches.close()
        resumed = _loader(PackedStream(documents(), 16), 3)
        resumed.load_state_dict(state)
        assert head + [[row["input_ids"] for row in batch] for batch in resumed] == whole, taken
    # After a whole pass, the next pass of the same stream starts again from its first batch.
    loader = _loader(PackedStream(documents(), 16), 3)
    assert len(list(loader)) == len(whole)
    loader.set_epoch(1)
    assert [row["input_ids"] for row in next(iter(loader))] == whole[0]


def test_documents_are_read_on_a_thread_bounded_ahead_of_the_loop_and_stopped_with_the_pass():
    read = []  # (document index, thread) as each is read and tokenized

    def tokenize(row, index):
        read.append((index, threading.get_ident()))
        return {"input_ids": list(range(16 * index, 16 * index + 16))}  # one block each

    documents = datasets.Dataset.from_dict({"text": ["x"] * 400}).to_iterable_dataset()
    stream = PackedStream(documents.map(tokenize, with_indices=True, remove_columns=["text"]), 16)
    loader = _loader(stream, 2, prefetch_batches=3)
    batches = iter(loader)
    first = next(batches)
    assert [row["input_ids"][0] for row in first] == [0, 16]
    deadline = time.monotonic() + 30
    while len(read) < 2 * (1 + 3) and time.monotonic() < deadline:  # the reader fills the 3 free places
        time.sleep(0.01)
    time.sleep(0.5)
    assert 2 * (1 + 3) <= len(read) < 40  # ahead of the loop, but not through the 400 documents
    assert threading.get_ident() not in {thread for _, thread in read}
    batches.close()
    assert not any(thread.name == "hfzoo-stream-reader" for thread in threading.enumerate())


def test_an_error_while_reading_ahead_is_raised_in_the_training_loop():
    def tokenize(row, index):
        if index == 7:
            raise OSError(f"document {index}: unreadable")
        return {"input_ids": list(range(16))}

    documents = datasets.Dataset.from_dict({"text": ["x"] * 20}).to_iterable_dataset()
    loader = _loader(PackedStream(documents.map(tokenize, with_indices=True, remove_columns=["text"]), 16), 2)
    taken = []
    with pytest.raises(OSError, match="document 7: unreadable"):
        for batch in loader:
            taken.append(batch)
    assert len(taken) == 3  # the 7 blocks read before the error, in batches of 2
