"""Tests of byte-level BPE training (`hfzoo.tokenization`, `hfzoo.pretraining.tokenizer`, its script).

Everything trains on real Project Gutenberg books (a few hundred KB, vocabularies of 1000-3000) so
the whole file runs in well under a minute on 2 CPU cores.
"""

from __future__ import annotations

import inspect
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from hfzoo.data.loading import clean_text
from hfzoo.pretraining import tokenizer as train_tokenizer
from hfzoo.tokenization import FAMILY_SPECIAL_TOKENS, TextBatches, train_bpe_tokenizer

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "tokenizer_training" / "train_tokenizer.py"

# Not in any training text below: unicode punctuation, accents, CJK, emoji, tabs, repeated spaces, CR.
UNSEEN = "naïve café — “quoted” ‘text’… 日本語 🙂\tTAB  two  spaces\r\nCRLF line\n\n  indented {braces} <tags>"


@pytest.fixture(scope="module")
def cli():
    """The module behind `hfzoo-train-tokenizer` and `tokenizer_training/train_tokenizer.py`."""
    return train_tokenizer


@pytest.fixture(scope="module")
def clean_books(gutenberg_books: list[dict]) -> list[str]:
    """The 4 fixture books, cleaned: 243K, 418K, 81K and 119K characters."""
    return [clean_text(row["text"]) for row in gutenberg_books]


@pytest.fixture(scope="module")
def decoder_tok(clean_books):
    """Decoder-family tokenizer trained on books 0-1 (~660K characters); books 2-3 are held out."""
    return train_bpe_tokenizer([clean_books[:2]], vocab_size=2000)


@pytest.fixture(scope="module")
def family_toks(clean_books):
    """One tokenizer per family, trained on book 2 (81K characters) with a 1000-token vocabulary."""
    return {
        family: train_bpe_tokenizer([clean_books[2]], 1000, model_family=family) for family in FAMILY_SPECIAL_TOKENS
    }


# --------------------------------------------------------------------------------------------------
# The trained tokenizer on real text


def test_roundtrip_held_out_real_text_without_unknowns(decoder_tok, clean_books, data_dir):
    tok = decoder_tok
    wiki = (data_dir / "wikitext-2" / "wiki.valid.tokens").read_text(encoding="utf-8")[:30000]
    held_out = [clean_books[3], wiki, UNSEEN]  # book 3: 119K characters, never trained on
    # The samples exercise what they are meant to: newlines and non-ASCII punctuation/letters.
    assert "\n" in held_out[0] and {"—", "“", "”", "£", "é"} <= set(held_out[0])
    assert any(ord(c) > 127 for c in wiki)
    for text in held_out:
        ids = tok(text, add_special_tokens=False).input_ids
        assert tok.decode(ids) == text
        # No special token (the decoder family has no unk; byte fallback is never needed).
        assert set(ids).isdisjoint(tok.all_special_ids)
        assert all(0 <= i < len(tok) for i in ids)
    # Merges were learned: under 1 token per 2.5 characters of held-out prose (bytes alone: ~1 per character).
    n_ids = len(tok(held_out[0], add_special_tokens=False).input_ids)
    assert n_ids < len(held_out[0]) / 2.5


def test_no_unknown_token_for_families_with_one(family_toks):
    for family in ("encoder", "encoder-decoder"):
        tok = family_toks[family]
        ids = tok(UNSEEN, add_special_tokens=False).input_ids
        assert tok.unk_token_id not in ids
        assert tok.decode(ids) == UNSEEN


def test_vocab_size_is_the_requested_size(decoder_tok, family_toks):
    assert len(decoder_tok) == decoder_tok.vocab_size == 2000
    assert max(decoder_tok.get_vocab().values()) == 1999
    for tok in family_toks.values():
        assert len(tok) == 1000
    # The 256 byte symbols are all there, so any byte sequence is representable.
    vocab = decoder_tok.get_vocab()
    assert sum(len(token) == 1 for token in vocab) == 256


def test_bpe_stops_early_on_too_little_text_and_warns(caplog):
    # "abc abc ..." has only a handful of distinct pairs: BPE runs out of merges long before 1000 tokens.
    with caplog.at_level(logging.WARNING, logger="hfzoo.tokenization"):
        tok = train_bpe_tokenizer(["abc abc abc abc"], vocab_size=1000)
    assert 256 + 2 < len(tok) < 1000
    assert "BPE stopped at" in caplog.text and "vocab_size=1000" in caplog.text


def test_text_batches_counts_and_caps():
    batches = [["aaaa", "", "bbbb"], "cccc", ["dddd", "eeee"]]
    texts = TextBatches(batches)
    assert list(texts) == [["aaaa", "bbbb"], ["cccc"], ["dddd", "eeee"]]
    assert (texts.documents, texts.characters) == (5, 20)
    texts = TextBatches(batches, max_documents=3)
    assert list(texts) == [["aaaa", "bbbb"], ["cccc"]] and texts.documents == 3
    texts = TextBatches(batches, max_characters=10)
    assert list(texts) == [["aaaa", "bbbb"], ["cc"]] and texts.characters == 10
    with pytest.raises(ValueError, match="max_documents"):
        TextBatches(batches, max_documents=0)


# --------------------------------------------------------------------------------------------------
# Families: special tokens, ids, roles, post-processing


def test_decoder_family(family_toks):
    tok = family_toks["decoder"]
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<pad>"]) == [0, 1]
    assert tok.bos_token == tok.eos_token == "<|endoftext|>" and tok.pad_token == "<pad>"
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token) == (0, 0, 1, None)
    a = tok("The sea.", add_special_tokens=False).input_ids
    b = tok(" A ship", add_special_tokens=False).input_ids
    enc = tok("The sea.")
    assert enc.input_ids == [0] + a  # documents start with <|endoftext|>
    assert "token_type_ids" not in enc
    assert tok("The sea.", " A ship").input_ids == [0] + a + [0] + b
    assert tok.decode(enc.input_ids, skip_special_tokens=True) == "The sea."


def test_encoder_family(family_toks):
    tok = family_toks["encoder"]
    assert tok.convert_tokens_to_ids(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]) == [0, 1, 2, 3, 4]
    roles = (tok.pad_token, tok.unk_token, tok.cls_token, tok.sep_token, tok.mask_token)
    assert roles == ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
    assert tok.bos_token is None and tok.eos_token is None
    a = tok("The sea.", add_special_tokens=False).input_ids
    b = tok(" A ship", add_special_tokens=False).input_ids
    assert tok("The sea.").input_ids == [2] + a + [3]
    pair = tok("The sea.", " A ship")
    assert pair.input_ids == [2] + a + [3] + b + [3]
    assert pair.token_type_ids == [0] * (len(a) + 2) + [1] * (len(b) + 1)
    # [MASK] in text is one token, not split.
    assert tok("the [MASK] sea", add_special_tokens=False).input_ids.count(4) == 1


def test_encoder_decoder_family(family_toks):
    tok = family_toks["encoder-decoder"]
    assert tok.convert_tokens_to_ids(["<pad>", "</s>", "<unk>"]) == [0, 1, 2]
    assert (tok.pad_token, tok.eos_token, tok.unk_token, tok.bos_token) == ("<pad>", "</s>", "<unk>", None)
    sentinels = [f"<extra_id_{i}>" for i in range(100)]
    assert tok.extra_special_tokens == sentinels
    assert tok.convert_tokens_to_ids(sentinels) == list(range(3, 103))
    a = tok("The sea.", add_special_tokens=False).input_ids
    b = tok(" A ship", add_special_tokens=False).input_ids
    assert tok("The sea.").input_ids == a + [1]
    assert tok("The sea.", " A ship").input_ids == a + [1] + b + [1]
    ids = tok("The <extra_id_0> sea<extra_id_99>", add_special_tokens=False).input_ids
    assert 3 in ids and 102 in ids


def test_special_token_overrides_and_extra_ids():
    tok = train_bpe_tokenizer(
        ["the sea, the sea, the ship"],
        vocab_size=300,
        model_family="decoder",
        bos_token="<s>",
        eos_token="</s>",
        additional_special_tokens=["<sep>"],
    )
    assert tok.convert_tokens_to_ids(["<s>", "</s>", "<pad>", "<sep>"]) == [0, 1, 2, 3]
    assert tok("sea").input_ids[0] == 0  # the template uses the overridden bos token
    assert tok.extra_special_tokens == ["<sep>"]
    tok = train_bpe_tokenizer(["the sea"], vocab_size=300, model_family="encoder-decoder", num_extra_ids=5)
    assert tok.extra_special_tokens == [f"<extra_id_{i}>" for i in range(5)]


def test_input_validation():
    books = ["the sea, the sea"]
    with pytest.raises(ValueError, match="model_family 'gpt'"):
        train_bpe_tokenizer(books, 1000, model_family="gpt")
    # 256 bytes + 3 special tokens (encoder-decoder without sentinels) is the smallest vocabulary.
    with pytest.raises(ValueError, match=r"vocab_size=258 is too small .* at least 259"):
        train_bpe_tokenizer(books, 258, model_family="encoder-decoder", num_extra_ids=0)
    assert len(train_bpe_tokenizer(books, 259, model_family="encoder-decoder", num_extra_ids=0)) == 259
    with pytest.raises(ValueError, match=r"at least 359 \(256 byte symbols \+ 103 special tokens\)"):
        train_bpe_tokenizer(books, 358, model_family="encoder-decoder")
    with pytest.raises(ValueError, match="min_frequency must be >= 1, got 0"):
        train_bpe_tokenizer(books, 1000, min_frequency=0)
    for empty in ([], [[]], [["", ""]], iter([""])):
        with pytest.raises(ValueError, match="no text to train on"):
            train_bpe_tokenizer(empty, 1000)
    with pytest.raises(ValueError, match="bos_token"):
        train_bpe_tokenizer(books, 1000, bos_token="<end of text>")  # spaces cannot go in a template


def test_a_given_special_token_that_the_text_contains_is_refused():
    """A special token is split out wherever it occurs: one that text contains would replace that text silently."""
    books = ["It was the best of times.", "It was the worst of times.", "Call me Ishmael."] * 40
    with pytest.raises(ValueError, match=r"^bos_token 'a' occurs in the training text \(document 1: 'It was"):
        train_bpe_tokenizer(books, 300, bos_token="a")
    # Found where the stream reaches it (the last document of the fourth batch), before anything is returned.
    batches = [books[i : i + 32] for i in range(0, len(books), 32)]
    batches[-1][-1] = "the end<sep>"
    with pytest.raises(ValueError, match=r"^additional_special_tokens entry '<sep>' occurs .*document 120: 'the end"):
        train_bpe_tokenizer(batches, 300, additional_special_tokens=["<sep>"])
    with pytest.raises(ValueError, match=r"^mask_token ' ' occurs"):
        train_bpe_tokenizer(books, 300, model_family="encoder", mask_token=" ")
    # The family's own tokens in the text are read as those tokens, as GPT-2's and T5's tokenizers read them.
    tok = train_bpe_tokenizer(["one<|endoftext|>two", *books], 300, bos_token="<s>")
    assert tok("one<|endoftext|>", add_special_tokens=False).input_ids[-1] == tok.eos_token_id
    assert tok("<s>two").input_ids[:2] == [tok.bos_token_id] * 2


# --------------------------------------------------------------------------------------------------
# save_pretrained -> AutoTokenizer.from_pretrained in a fresh process

TEXTS = ["It was the best of times.", "Line one\nline two “quoted” — done", "x"]


def _summary(tok, texts):
    return {
        "single": [tok(t).input_ids for t in texts],
        "plain": [tok(t, add_special_tokens=False).input_ids for t in texts],
        "pair": dict(tok(texts[0], texts[1]).items()),
        "batch": tok(texts, padding=True).input_ids,
        "decoded": [tok.decode(tok(t).input_ids, skip_special_tokens=True) for t in texts],
        "special": {k: str(v) for k, v in tok.special_tokens_map.items()},
        "extra": [str(t) for t in tok.extra_special_tokens],
        "len": len(tok),
        "model_max_length": tok.model_max_length,
    }


RELOAD = f"""
import json, sys
from transformers import AutoTokenizer

{inspect.getsource(_summary)}
texts = json.loads(sys.stdin.read())
print(json.dumps({{path: _summary(AutoTokenizer.from_pretrained(path), texts) for path in sys.argv[1:]}}))
"""


def test_save_pretrained_then_auto_tokenizer_in_fresh_process(family_toks, tmp_path):
    paths = {}
    for family, tok in family_toks.items():
        paths[family] = str(tmp_path / family)
        tok.save_pretrained(paths[family])
        config = json.loads((tmp_path / family / "tokenizer_config.json").read_text())
        # Either key would make transformers v5 overwrite our post-processor on load.
        assert "add_bos_token" not in config and "add_eos_token" not in config
    result = subprocess.run(
        [sys.executable, "-c", RELOAD, *paths.values()],
        input=json.dumps(TEXTS),
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    reloaded = json.loads(result.stdout.strip().splitlines()[-1])
    for family, tok in family_toks.items():
        expected = _summary(tok, TEXTS)
        assert reloaded[paths[family]] == expected, family
        assert expected["decoded"] == TEXTS
    # The post-processing survived the reload (not replaced by transformers' default bos/eos template).
    assert reloaded[paths["decoder"]]["single"][2][0] == 0
    assert reloaded[paths["encoder"]]["pair"]["token_type_ids"][-1] == 1
    assert reloaded[paths["encoder-decoder"]]["single"][2][-1] == 1
    assert len(reloaded[paths["encoder-decoder"]]["extra"]) == 100
    assert reloaded[paths["decoder"]]["model_max_length"] > 1e20  # books are long: no length limit


# --------------------------------------------------------------------------------------------------
# The CLI


def test_cli_train_file_arguments_extend(cli):
    args = cli.parse_args(["--train_file", "a", "--train_file", "b", "c", "--output_dir", "o"])
    assert args.train_file == ["a", "b", "c"]
    assert (args.vocab_size, args.min_frequency, args.model_family, args.dataset_split) == (
        32000,
        2,
        "decoder",
        "train",
    )


def test_cli_on_plain_text_file(cli, clean_books, tmp_path, capsys):
    txt = tmp_path / "book.txt"
    txt.write_text(clean_books[2], encoding="utf-8")
    out = tmp_path / "tok"
    cli.main(
        [
            "--train_file",
            str(txt),
            "--vocab_size",
            "1000",
            "--model_family",
            "encoder",
            "--output_dir",
            str(out),
        ]
    )
    printed = capsys.readouterr().out
    assert "vocabulary size: 1000" in printed and "[CLS]" in printed
    tok = AutoTokenizer.from_pretrained(out)
    assert len(tok) == 1000 and tok.cls_token_id == 2
    stats = json.loads((out / "tokenizer_training_args.json").read_text())["data"]
    # One document per line, line breaks kept: every character of the book was read.
    assert stats["characters"] == len(clean_books[2])
    assert stats["documents"] == clean_books[2].count("\n") + 1


def test_cli_cleans_gutenberg_boilerplate(cli, small_jsonl_xz, gutenberg_books, tmp_path):
    """Trained on cleaned books the vocabulary has no licence words and no CR; trained raw, it has both."""
    vocabs, stats = {}, {}
    for mode, extra in (("clean", []), ("raw", ["--no_clean_text"])):
        out = tmp_path / mode
        cli.main(
            ["--train_file", str(small_jsonl_xz), "--max_documents", "2", "--vocab_size", "2000"]
            + ["--output_dir", str(out), *extra]
        )
        tok = AutoTokenizer.from_pretrained(out)
        vocabs[mode] = [tok.convert_tokens_to_string([t]) for t in tok.get_vocab() if t not in tok.all_special_tokens]
        stats[mode] = json.loads((out / "tokenizer_training_args.json").read_text())["data"]
    books = [row["text"] for row in gutenberg_books[:2]]
    assert stats["clean"] == {
        **stats["clean"],
        "documents": 2,
        "characters": sum(len(clean_text(b)) for b in books),
    }
    assert stats["raw"]["characters"] == sum(len(b) for b in books)

    def learned(vocab, word):
        return [t for t in vocab if word in t and len(t) > 1]

    assert learned(vocabs["raw"], "Gutenberg") and learned(vocabs["raw"], "\r")  # the test can fail
    assert not learned(vocabs["clean"], "Gutenberg") and not learned(vocabs["clean"], "utenberg")
    assert not learned(vocabs["clean"], "\r")


def test_cli_subprocess_from_another_directory(small_jsonl_xz, tmp_path):
    """Run as a script from an unrelated working directory with relative output path."""
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--train_file", str(small_jsonl_xz), "--max_characters", "200000"]
        + ["--vocab_size", "1500", "--model_family", "encoder-decoder", "--output_dir", "out"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "vocabulary size: 1500" in result.stdout
    assert "read 1 documents, 200000 characters (cleaned)" in result.stderr  # logged at INFO
    assert "trained in" in result.stderr
    saved = tmp_path / "out"
    assert {"tokenizer.json", "tokenizer_config.json"} <= {p.name for p in saved.iterdir()}
    tok = AutoTokenizer.from_pretrained(saved)
    assert len(tok) == 1500 and tok("sea").input_ids[-1] == tok.eos_token_id == 1


def test_cli_hub_dataset_path(cli, monkeypatch, tmp_path, clean_books):
    """--dataset_name goes through datasets.load_dataset(name, config, split=..., streaming=True)."""
    import datasets

    calls = []

    def fake_load_dataset(*args, **kwargs):
        calls.append((args, kwargs))
        return datasets.IterableDataset.from_generator(lambda: ({"content": t} for t in clean_books[2:3]))

    monkeypatch.setattr(cli.datasets, "load_dataset", fake_load_dataset)
    out = tmp_path / "hub"
    argv = ["--dataset_name", "someone/books", "--dataset_config_name", "en", "--dataset_split", "validation"]
    cli.main(argv + ["--text_column_name", "content", "--vocab_size", "800", "--output_dir", str(out)])
    assert calls == [(("someone/books", "en"), {"split": "validation", "streaming": True})]
    assert len(AutoTokenizer.from_pretrained(out)) == 800
    with pytest.raises(SystemExit, match="'text' is not a column of --dataset_name someone/books"):
        cli.main(argv + ["--output_dir", str(out)])


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing", "error: --train_file .*missing.txt: no such file"),
        ("empty", "error: --train_file .*empty.txt: the file is empty"),
        ("column", r"error: --text_column_name 'body' is not a column of .*its columns are \['text'\]"),
        ("no_text", "error: no text to train on"),
        (
            "vocab",
            "error: vocab_size=300 is too small for the 'encoder-decoder' family: it must be at least 359",
        ),
        ("no_data", "error: give --train_file"),
        ("special", r"error: bos_token 'a' occurs in the training text \(document 1: 'the sea'\)"),
        ("unparsable", r"error: --train_file \['.*broken.jsonl'\]: cannot be read \(ArrowInvalid: JSON parse error"),
    ],
)
def test_cli_bad_input_exits_with_one_line_message(cli, tmp_path, case, message):
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text('{"text": "the sea"}\n', encoding="utf-8")
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "blank.jsonl").write_text('{"text": ""}\n{"text": null}\n', encoding="utf-8")
    (tmp_path / "broken.jsonl").write_text('{"text": "the sea"}\n{not json\n', encoding="utf-8")
    argv = {
        "missing": ["--train_file", str(tmp_path / "missing.txt")],
        "empty": ["--train_file", str(tmp_path / "empty.txt")],
        "column": ["--train_file", str(jsonl), "--text_column_name", "body"],
        "no_text": ["--train_file", str(tmp_path / "blank.jsonl")],
        "vocab": ["--train_file", str(jsonl), "--model_family", "encoder-decoder", "--vocab_size", "300"],
        "no_data": [],
        "special": ["--train_file", str(jsonl), "--bos_token", "a"],
        "unparsable": ["--train_file", str(tmp_path / "broken.jsonl")],
    }[case]
    with pytest.raises(SystemExit, match=message) as excinfo:
        cli.main(argv + ["--output_dir", str(tmp_path / "out")])
    assert "\n" not in str(excinfo.value)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("family", ["decoder", "encoder"])
def test_cli_refuses_sentinels_outside_the_encoder_decoder_family(cli, family, capsys):
    argv = ["--train_file", "a.txt", "--output_dir", "o", "--model_family", family]
    assert cli.parse_args(argv).num_extra_ids == 0
    assert cli.parse_args([*argv[:-1], "encoder-decoder"]).num_extra_ids == 100
    assert cli.parse_args([*argv[:-1], "encoder-decoder", "--num_extra_ids", "7"]).num_extra_ids == 7
    with pytest.raises(SystemExit) as excinfo:
        cli.parse_args([*argv, "--num_extra_ids", "5"])
    assert excinfo.value.code == 2
    assert (
        f"--num_extra_ids 5: sentinel tokens are for --model_family encoder-decoder (span corruption), not {family}"
        in capsys.readouterr().err
    )


def test_cli_refuses_a_training_file_given_twice(cli, tmp_path, capsys, monkeypatch):
    """Its documents would count twice in the pair statistics."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as excinfo:
        cli.parse_args(["--train_file", "a.txt", "b.txt", "--train_file", "./a.txt", "--output_dir", "o"])
    assert excinfo.value.code == 2
    assert "--train_file ./a.txt: given twice (as a.txt too); give each file once" in capsys.readouterr().err
    assert cli.parse_args(["--train_file", "a.txt", "b.txt", "--output_dir", "o"]).train_file == ["a.txt", "b.txt"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--dataset_name", "wikitext"], "--train_file and --dataset_name wikitext: give one data source"),
        (["--dataset_config_name", "raw"], "--dataset_config_name raw is a configuration of --dataset_name: give both"),
    ],
    ids=["two-sources", "config-without-dataset"],
)
def test_cli_refuses_a_data_flag_it_would_ignore(cli, extra, message, capsys):
    with pytest.raises(SystemExit) as excinfo:
        cli.parse_args(["--train_file", "a.txt", "--output_dir", "o", *extra])
    assert excinfo.value.code == 2 and message in capsys.readouterr().err


def test_cli_refuses_to_train_into_a_model_folder(cli, tmp_path):
    """The model's own tokenizer would be replaced by one with other ids: every later use would be silently wrong."""
    jsonl = tmp_path / "rows.jsonl"
    jsonl.write_text('{"text": "the sea and the ship"}\n', encoding="utf-8")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "hfzoo_decoder"}')
    (model / "tokenizer.json").write_text("{}")
    with pytest.raises(SystemExit) as excinfo:
        cli.main(["--train_file", str(jsonl), "--output_dir", str(model)])
    assert str(excinfo.value) == (
        f"error: --output_dir {model}: holds a model (config.json); a tokenizer trained there would replace the one "
        "the model was trained with; give another --output_dir"
    )
    assert (model / "tokenizer.json").read_text() == "{}"
