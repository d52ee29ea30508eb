"""Data loading, Gutenberg cleaning, tokenization + packing, and the unigram baseline."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from hfzoo.data.loading import (
    DataReadError,
    check_data_files,
    check_text_column,
    clean_text,
    infer_builder,
    load_local_files,
    load_raw_datasets,
)
from hfzoo.data.packing import token_counts, tokenize_and_pack
from hfzoo.pretraining.evaluation import unigram_perplexity
from hfzoo.tokenization import train_bpe_tokenizer


@pytest.fixture(scope="module")
def tokenizer(gutenberg_books):
    return train_bpe_tokenizer([[clean_text(b["text"]) for b in gutenberg_books[:2]]], vocab_size=600)


def test_clean_text_strips_gutenberg_boilerplate_on_real_books(gutenberg_books):
    for book in gutenberg_books:
        raw = book["text"]
        assert "\r\n" in raw and re.search(r"\*\*\* ?START OF", raw, re.I)
        cleaned = clean_text(raw)
        assert "\r" not in cleaned
        assert not re.search(r"\*\*\* ?(START|END) OF (THE|THIS) PROJECT GUTENBERG", cleaned, re.I)
        assert "Project Gutenberg License" not in cleaned
        assert 0.5 * len(raw) < len(cleaned) < len(raw)
        # The body itself is kept verbatim (modulo line endings).
        middle = cleaned[len(cleaned) // 2 : len(cleaned) // 2 + 500]
        assert middle in raw.replace("\r\n", "\n")


def test_clean_text_handles_old_small_print_headers():
    text = (
        "The Project Gutenberg Etext of Foo\r\n\r\n**Welcome To The World of Free Plain Vanilla Electronic Texts**"
        "\r\n*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*\r\n\r\nChapter 1\r\n"
        + "Once upon a time.\r\n" * 50
        + "End of the Project Gutenberg Etext of Foo\r\nlicence text"
    )
    assert clean_text(text) == "Chapter 1\n" + ("Once upon a time.\n" * 50).strip()


def test_clean_text_leaves_other_text_alone():
    assert clean_text("a line\r\n") == "a line\n"
    assert clean_text(" = Valkyria Chronicles = \n") == " = Valkyria Chronicles = \n"


@pytest.mark.parametrize(
    "name, builder",
    [
        ("books.jsonl.xz", "json"),
        ("books.json", "json"),
        ("x.parquet", "parquet"),
        ("wiki.valid.tokens", "text"),
        ("notes.txt.gz", "text"),
        ("README", "text"),
    ],
)
def test_infer_builder(name, builder):
    assert infer_builder(name) == builder


def test_check_data_files_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.txt: no such file"):
        check_data_files([tmp_path / "nope.txt"])
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(ValueError, match="empty.txt: the file is empty"):
        check_data_files([tmp_path / "empty.txt"])
    (tmp_path / "a.txt").write_text("x")
    (tmp_path / "b.jsonl").write_text('{"text": "x"}\n')
    with pytest.raises(ValueError, match="mix formats"):
        check_data_files([tmp_path / "a.txt", tmp_path / "b.jsonl"])


def test_load_raw_datasets_holds_out_whole_documents(small_jsonl_xz, gutenberg_books):
    raw = load_raw_datasets(train_file=[str(small_jsonl_xz)], validation_split_percentage=25)
    assert raw["validation"]["sha256"] == [gutenberg_books[0]["sha256"]]
    assert raw["train"]["sha256"] == [b["sha256"] for b in gutenberg_books[1:]]


def test_load_raw_datasets_names_a_missing_text_column(small_jsonl_xz):
    with pytest.raises(ValueError, match="--text_column_name 'body' is not a column.*'text'"):
        load_raw_datasets(train_file=[str(small_jsonl_xz)], text_column_name="body")


def test_a_text_column_that_holds_no_strings_is_refused(tmp_path):
    """Numbers or lists of strings reached the text cleaning as an AttributeError deep in `datasets.map`."""
    rows = {"ints": [7, 8], "lists": [["one", "two"], ["three"]], "mixed": [7, "a document"], "nulls": [None, "a"]}
    for name, values in rows.items():
        (tmp_path / f"{name}.jsonl").write_text(
            "".join(json.dumps({"text": values[i % 2], "id": i}) + "\n" for i in range(8))
        )
    for name, kind in (("ints", "Value('int64')"), ("lists", "List(Value('string'))"), ("mixed", "Json(decode=True)")):
        path = str(tmp_path / f"{name}.jsonl")
        message = f"--text_column_name 'text': the column of --train_file ['{path}'] holds {kind} values, not text"
        with pytest.raises(ValueError, match=re.escape(message)):
            load_raw_datasets(train_file=[path], validation_split_percentage=25)
        with pytest.raises(ValueError, match=re.escape(kind)):  # a stream
            check_text_column(load_local_files([path], streaming=True), "text", "a stream")
    with pytest.raises(ValueError, match=re.escape("'id': the column of the data holds Value('int64') values")):
        check_text_column(load_local_files([tmp_path / "ints.jsonl"]), "id", "the data")
    # Missing texts (null) are documents without text, skipped as empty ones are.
    raw = load_raw_datasets(train_file=[str(tmp_path / "nulls.jsonl")], validation_split_percentage=25)
    assert raw["train"]["text"].count(None) == 3 and raw["train"]["text"].count("a") == 3


def test_a_record_that_cannot_be_parsed_is_refused_in_one_line_naming_the_file(tmp_path):
    """`datasets` raised `DatasetGenerationError` ("An error occurred while generating the dataset") over pyarrow's
    or pandas' own error; a stream raised the parser's error where it was first read."""
    jsonl, csv = tmp_path / "rows.jsonl", tmp_path / "rows.csv"
    jsonl.write_text(json.dumps({"text": "a document"}) + "\n{not json\n")
    csv.write_text('text,label\n"an unclosed quote,1\nmore,2\n')
    cases = {
        jsonl: "as JSON lines (ArrowInvalid: JSON parse error: Missing a name for object member.",
        csv: "as CSV (ParserError: Error tokenizing data. C error: EOF inside string",
    }
    for path, reason in cases.items():
        with pytest.raises(DataReadError, match=re.escape(f"--validation_file {path}: cannot be read {reason}")):
            load_local_files([path], "--validation_file")
        with pytest.raises(DataReadError, match=re.escape(f"the stream: cannot be read {reason[reason.index('(') :]}")):
            check_text_column(load_local_files([path], streaming=True), "text", "the stream")
        other = path.with_name("other" + path.suffix)
        other.write_text(path.read_text())
        with pytest.raises(DataReadError, match=re.escape(f"--train_file {[str(path), str(other)]}: cannot be read")):
            load_raw_datasets(train_file=[str(path), str(other)])


def test_text_files_keep_line_breaks(tmp_path):
    path = tmp_path / "a.txt"
    path.write_text("first line\nsecond line\n\nthird\n")
    assert "".join(load_local_files([path])["text"]) == path.read_text()
    assert load_local_files([path], sample_by="document")["text"] == [path.read_text()]


def test_packing_reproduces_the_token_stream_with_document_separators(small_jsonl_xz, tokenizer):
    raw = load_raw_datasets(train_file=[str(small_jsonl_xz)], validation_split_percentage=25)
    packed = tokenize_and_pack(raw, tokenizer, "text", block_size=64, load_from_cache_file=False)
    stream = []
    for text in raw["train"]["text"]:
        stream += tokenizer(clean_text(text))["input_ids"]
    blocks = packed["train"]["input_ids"]
    assert all(len(b) == 64 for b in blocks)
    assert len(blocks) == len(stream) // 64
    assert sum(blocks, []) == stream[: len(blocks) * 64]
    assert packed["train"]["labels"] == blocks
    eot = tokenizer.bos_token_id
    assert stream[0] == eot and stream.count(eot) == len(raw["train"])


def test_packing_refuses_data_shorter_than_one_block(tmp_path, tokenizer):
    path = tmp_path / "short.txt"
    path.write_text("just a few words\n")
    raw = load_raw_datasets(train_file=[str(path)], validation_file=[str(path)])
    with pytest.raises(ValueError, match="fewer than one block of --block_size 128"):
        tokenize_and_pack(raw, tokenizer, "text", block_size=128, load_from_cache_file=False)


def test_token_counts_and_unigram_perplexity():
    import datasets

    ds = datasets.Dataset.from_dict({"input_ids": [[0, 0, 1], [0, 2, 2]]})
    counts = token_counts(ds, vocab_size=4)
    assert counts.tolist() == [3, 1, 2, 0]
    # p = (c + 1) / (N + V) = [4, 2, 3, 1] / 10
    expected = math.exp(-(math.log(0.4) + math.log(0.2) + math.log(0.1)) / 3)
    assert unigram_perplexity(counts, np.array([0, 1, 3])) == pytest.approx(expected)
    with pytest.raises(ValueError, match="token ids must be in"):
        unigram_perplexity(counts, np.array([4]))


def test_parquet_and_compressed_text_files_load(tmp_path):
    import gzip

    import datasets

    datasets.Dataset.from_dict({"body": ["first document", "second document"]}).to_parquet(tmp_path / "a.parquet")
    raw = load_raw_datasets(
        train_file=[str(tmp_path / "a.parquet")], validation_file=[str(tmp_path / "a.parquet")], text_column_name="body"
    )
    assert raw["train"]["body"] == ["first document", "second document"]
    with gzip.open(tmp_path / "b.txt.gz", "wt") as f:
        f.write("line one\nline two\n")
    assert "".join(load_local_files([tmp_path / "b.txt.gz"])["text"]) == "line one\nline two\n"
