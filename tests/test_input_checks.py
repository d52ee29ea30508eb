"""Everything checkable is checked before the expensive work: output folders, input files (type, encoding,
text left after cleaning), damaged weight files, token, position and token-type ids outside their tables, model
inputs whose shapes disagree (an attention mask of another length than the cached positions and tokens)."""

from __future__ import annotations

import json
import lzma
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers.paths import REPO_ROOT
from helpers.pretraining import TINY_OVERRIDES, base_args, run_main_expecting_error
from transformers import (
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
    GPT2Config,
    GPT2LMHeadModel,
)

from hfzoo.compat import output_cache
from hfzoo.data.loading import check_data_files
from hfzoo.integrity import WeightFileError, check_weight_files
from hfzoo.models.presets import build_config
from hfzoo.modules.embeddings import caller_checked_ids, check_batch_ids, model_value_checks_enabled
from hfzoo.pretraining import loop as pretraining


@pytest.fixture
def no_data_work(monkeypatch):
    """Fail the test if the recipe reaches data loading (the checks must come first)."""

    def reached(*args, **kwargs):
        raise AssertionError("the data was loaded before the bad input was reported")

    monkeypatch.setattr(pretraining, "load_raw_datasets", reached)
    monkeypatch.setattr(pretraining, "tokenize_and_pack", reached)


def _invalid_utf8_jsonl(tmp: Path, gutenberg_books: list[dict], compress: bool) -> tuple[Path, int]:
    data = "".join(json.dumps(b) + "\n" for b in gutenberg_books[:2]).encode()
    offset = len(data) // 2
    data = data[:offset] + b"\xff" + data[offset:]  # one stray byte in the middle of a book
    path = tmp / ("bad.jsonl.xz" if compress else "bad.jsonl")
    path.write_bytes(lzma.compress(data) if compress else data)
    return path, offset


def _whitespace_only(tmp: Path) -> Path:
    path = tmp / "blank.txt"
    path.write_text("\n \n\t\n" * 100)
    return path


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda tmp, books: (tmp, "--train_file"), "is a directory, not a file"),
        (lambda tmp, books: (_whitespace_only(tmp), "--train_file"), "no text (the file holds only whitespace)"),
        (lambda tmp, books: (tmp / "missing.txt", "--train_file"), "missing.txt: no such file"),
    ],
    ids=["directory", "whitespace-only", "missing"],
)
def test_bad_input_files_are_refused_before_any_data_is_loaded(
    make, expected, tmp_path, gutenberg_books, small_jsonl_xz, tokenizer_dir, no_data_work, capsys
):
    path, _ = make(tmp_path, gutenberg_books)
    argv = base_args(path, tokenizer_dir, tmp_path / "out")
    assert expected in run_main_expecting_error(argv, capsys)


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        (["--train_file", "{data}", "{data}"], "--train_file {data}: given twice (as {data} too); give each file once"),
        (["--train_file", "{data}", "{tmp}/../{tmp_name}/data.jsonl.xz"],
         "--train_file {tmp}/../{tmp_name}/data.jsonl.xz: given twice (as {data} too)"),
        (["--train_file", "{data}", "--validation_file", "{other}", "{other}"], "--validation_file {other}: given twice"),
        (["--train_file", "{data}", "{other}", "--validation_file", "./{rel}"],
         "--validation_file ./{rel}: is also --train_file {other}; the validation metrics would be measured on text "
         "the model trains on"),
    ],
    ids=["train-file-twice", "train-file-twice-written-otherwise", "validation-file-twice", "validation-is-trained-on"],
)  # fmt: skip
def test_a_data_file_given_twice_is_refused_before_any_data_is_loaded(
    files, expected, tmp_path, small_jsonl_xz, tokenizer_dir, no_data_work, capsys, monkeypatch
):
    """Twice in one list its rows would count twice (one copy split off for validation, the other trained on)."""
    data, other = tmp_path / "data.jsonl.xz", tmp_path / "other.jsonl.xz"
    data.write_bytes(small_jsonl_xz.read_bytes())
    other.write_bytes(small_jsonl_xz.read_bytes())
    monkeypatch.chdir(tmp_path.parent)
    where = dict(data=data, other=other, tmp=tmp_path, tmp_name=tmp_path.name, rel=f"{tmp_path.name}/other.jsonl.xz")
    argv = base_args(data, tokenizer_dir, tmp_path / "out")
    argv[argv.index("--train_file") : argv.index("--train_file") + 2] = []
    argv += [a.format(**where) for a in files]
    assert expected.format(**where) in run_main_expecting_error(argv, capsys)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("compress", [False, True], ids=["jsonl", "jsonl.xz"])
def test_invalid_utf8_names_the_file_and_the_byte_offset(compress, tmp_path, gutenberg_books, small_jsonl_xz,
                                                          tokenizer_dir, no_data_work, capsys):  # fmt: skip
    bad, offset = _invalid_utf8_jsonl(tmp_path, gutenberg_books, compress)
    # The bad file given for validation: still refused before the (good) training file is loaded.
    argv = base_args(small_jsonl_xz, tokenizer_dir, tmp_path / "out", "--validation_file", str(bad))
    start = time.perf_counter()
    message = run_main_expecting_error(argv, capsys)
    assert f"--validation_file {bad}: not valid UTF-8 text" in message
    assert f"byte {offset} is 0xff" in message
    assert time.perf_counter() - start < 10


def test_output_dir_that_is_a_file_or_under_a_file_is_refused_first(tmp_path, small_jsonl_xz, tokenizer_dir,
                                                                    no_data_work, capsys):  # fmt: skip
    a_file = tmp_path / "results.txt"
    a_file.write_text("not a folder")
    message = run_main_expecting_error(base_args(small_jsonl_xz, tokenizer_dir, a_file), capsys)
    assert f"--output_dir {a_file}: is an existing file, not a folder" in message
    message = run_main_expecting_error(base_args(small_jsonl_xz, tokenizer_dir, a_file / "run"), capsys)
    assert f"--output_dir {a_file / 'run'}: its folder {a_file} is an existing file, not a folder" in message
    # A writable folder is created, checked, and left without probe files.
    out = tmp_path / "new" / "run"
    pretraining.prepare_output_dir(out, checkpointing=True)
    assert (out / "checkpoints").is_dir() and not list(out.rglob(".write_check_*"))


def test_a_checkpoint_that_cannot_be_loaded_is_refused_naming_its_argument(tmp_path, small_jsonl_xz, tokenizer_dir,
                                                                          no_data_work, capsys):  # fmt: skip
    folder = tmp_path / "not-a-model"  # a folder, but no checkpoint in it
    folder.mkdir()
    common = ["--train_file", str(small_jsonl_xz), "--block_size", "32", "--output_dir", str(tmp_path / "out")]
    message = run_main_expecting_error(["--model_name_or_path", str(folder), "--tokenizer_name", str(tokenizer_dir),
                                        *common], capsys)  # fmt: skip
    assert message.startswith(f"error: --model_name_or_path {folder}: Unrecognized model in {folder}.")
    # Without --tokenizer_name the checkpoint's own tokenizer is loaded first: the error names the argument given.
    message = run_main_expecting_error(["--model_name_or_path", str(folder), *common], capsys)
    assert message.startswith(f"error: --model_name_or_path {folder}: cannot load a tokenizer (")
    assert not (tmp_path / "out").exists()


def test_one_line_error_and_no_traceback_from_the_command_line(tmp_path, small_jsonl_xz, tokenizer_dir):
    a_file = tmp_path / "out"
    a_file.write_text("")
    cmd = [
        sys.executable,
        str(REPO_ROOT / "recipes" / "pretrain.py"),
        *base_args(small_jsonl_xz, tokenizer_dir, a_file),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == f"error: --output_dir {a_file}: is an existing file, not a folder"


def test_a_missing_package_while_building_the_model_names_the_argument_that_needs_it():
    """`missing_packages_refused` turns transformers' `ImportError` into one line naming `--attn_implementation`
    (a kernel other than eager/sdpa), else the model; other errors pass unchanged."""
    from argparse import Namespace

    from hfzoo.training.arguments import missing_packages_refused

    def build(args, error):
        with missing_packages_refused(args):
            raise error

    absent = ImportError("FlashAttention2 has been toggled on, but it cannot be used:\n  the package is not installed.")
    cases = [
        (Namespace(attn_implementation="flash_attention_2", model_name_or_path="ckpt"), "--attn_implementation "
         "flash_attention_2: FlashAttention2 has been toggled on, but it cannot be used: the package is not installed."),
        (Namespace(attn_implementation="sdpa", model_name_or_path="ckpt"), "--model_name_or_path ckpt: "),
        (Namespace(attn_implementation=None, model_name_or_path=None, config_name="decoder-small"),
         "--config_name decoder-small: "),
    ]  # fmt: skip
    for args, expected in cases:
        with pytest.raises(ValueError) as refused:
            build(args, absent)
        assert str(refused.value).startswith(expected) and "\n" not in str(refused.value)
    with pytest.raises(KeyError):
        build(cases[0][0], KeyError("a bug"))


def test_no_text_after_cleaning_is_reported_as_such(tmp_path, small_jsonl_xz, tokenizer_dir, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(["", "  \n", "\n\n"])))
    # Train on the empty texts, validate on real books (whose files have other columns: both splits must load).
    argv = base_args(empty, tokenizer_dir, tmp_path / "out", "--validation_file", str(small_jsonl_xz))
    message = run_main_expecting_error(argv, capsys)
    assert "the train data has no text after cleaning: its 3 row(s) of 'text' are empty" in message


def test_check_data_files_reads_a_valid_compressed_shard(small_jsonl_xz):
    builder, paths = check_data_files([small_jsonl_xz])
    assert builder == "json" and paths == [str(small_jsonl_xz.resolve())]
    truncated = small_jsonl_xz.with_name("cut.jsonl.xz")
    truncated.write_bytes(small_jsonl_xz.read_bytes()[: small_jsonl_xz.stat().st_size // 2])
    with pytest.raises(ValueError, match="cut.jsonl.xz: truncated or corrupt compressed data"):
        check_data_files([truncated])


TINY = TINY_OVERRIDES + ",vocab_size=96"


def _save_tiny(folder: Path, stock: bool = False) -> Path:
    torch.manual_seed(0)
    if stock:
        GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=512, n_positions=64)).save_pretrained(
            folder
        )
    else:
        AutoModelForCausalLM.from_config(build_config("decoder-tiny", TINY)).save_pretrained(folder)
    return folder / "model.safetensors"


def _truncate(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


def test_from_pretrained_names_a_truncated_or_corrupt_weight_file(tmp_path):
    weights = _save_tiny(tmp_path / "m")
    size = weights.stat().st_size
    _truncate(weights)
    with pytest.raises(OSError, match=rf"m/model.safetensors: truncated \({size // 2} bytes, its header describes"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    weights = _save_tiny(tmp_path / "h")
    with open(weights, "r+b") as f:
        f.seek(12)
        f.write(b"\x00garbage")  # inside the JSON header
    with pytest.raises(WeightFileError, match=r"h/model.safetensors: corrupt \(unreadable safetensors header"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "h")
    # A torch.save (zip) weight file cut short, and a sharded index naming a missing shard.
    zipped = tmp_path / "z"
    zipped.mkdir()
    torch.save({"w": torch.zeros(1000)}, zipped / "pytorch_model.bin")
    _truncate(zipped / "pytorch_model.bin")
    with pytest.raises(WeightFileError, match="pytorch_model.bin: truncated or corrupt"):
        check_weight_files(zipped)
    (zipped / "pytorch_model.bin").unlink()
    (zipped / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "model-00001.safetensors"}}))
    with pytest.raises(WeightFileError, match=r"names shard\(s\) \['model-00001.safetensors'\] that are missing"):
        check_weight_files(zipped)


def test_recipe_refuses_a_damaged_stock_checkpoint_before_the_data(tmp_path, small_jsonl_xz, tokenizer_dir,
                                                                  no_data_work, capsys):  # fmt: skip
    """A transformers GPT-2 checkpoint (no hfzoo class involved) with a truncated model.safetensors."""
    weights = _save_tiny(tmp_path / "gpt2", stock=True)
    _truncate(weights)
    argv = base_args(small_jsonl_xz, tokenizer_dir, tmp_path / "out")
    argv[argv.index("--config_name") : argv.index("--config_overrides") + 2] = [
        "--model_name_or_path",
        str(tmp_path / "gpt2"),
    ]
    argv += ["--tokenizer_name", str(tokenizer_dir)]
    message = run_main_expecting_error(argv, capsys)
    assert f"{weights}: truncated" in message


FAMILIES = [("decoder-tiny", AutoModelForCausalLM), ("encoder-tiny", AutoModelForMaskedLM),
            ("encoder-decoder-tiny", AutoModelForSeq2SeqLM)]  # fmt: skip


@pytest.mark.parametrize("preset, auto_class", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_token_ids_outside_the_vocabulary_raise_a_value_error(preset, auto_class):
    model = auto_class.from_config(build_config(preset, TINY)).eval()
    good = torch.tensor([[1, 95, 0]])
    extra = {"decoder_input_ids": torch.tensor([[0, 1]])} if preset.startswith("encoder-decoder") else {}
    with torch.no_grad():
        model(input_ids=good, **extra)  # the largest valid id is accepted
        for bad_id in (96, -1):
            with pytest.raises(ValueError, match=rf"token id {bad_id} is outside the vocabulary: .*vocab_size=96\)"):
                model(input_ids=torch.tensor([[1, bad_id, 0]]), **extra)
        if extra:  # the decoder side of the encoder-decoder too
            with pytest.raises(ValueError, match="token id 200 is outside the vocabulary"):
                model(input_ids=good, decoder_input_ids=torch.tensor([[0, 200]]))


def test_token_id_check_adds_no_graph_break_under_torch_compile():
    embeddings = AutoModelForCausalLM.from_config(build_config("decoder-tiny", TINY)).get_input_embeddings()
    explanation = torch._dynamo.explain(embeddings)(torch.tensor([[1, 2, 3]]))
    assert explanation.graph_break_count == 0


@pytest.mark.parametrize("preset, auto_class", FAMILIES, ids=[f[0] for f in FAMILIES])
@pytest.mark.parametrize(
    "change, expected",
    [
        ({"attention_mask": torch.ones(1, 2)},
         r"attention_mask has shape \(1, 2\), but the input is 1 x 3 tokens: expected \(1, 3\), 1 for each token"),
        ({"attention_mask": torch.ones(1, 4)}, r"attention_mask has shape \(1, 4\), .*expected \(1, 3\)"),
        ({"attention_mask": torch.ones(2, 3)}, r"attention_mask has shape \(2, 3\), .*expected \(1, 3\)"),
        ({"attention_mask": torch.ones(3)}, r"attention_mask has shape \(3,\), .*expected \(1, 3\)"),
        ({"input_ids": torch.tensor([1, 95, 0])},
         r"input_ids must be \(batch_size, sequence_length\), got shape \(3,\) \(one sequence\? add a batch"),
        ({"input_ids": None, "inputs_embeds": torch.zeros(1, 3, 31)},
         r"inputs_embeds must be \(batch_size, sequence_length, hidden_size=32\), got shape \(1, 3, 31\)"),
    ],
    ids=["mask-short", "mask-long", "mask-batch", "mask-1d", "ids-1d", "embeds-width"],
)  # fmt: skip
def test_inputs_that_disagree_in_shape_are_refused(preset, auto_class, change, expected):
    """transformers' masking would take a short mask's missing columns as padding and cut a long one."""
    model = auto_class.from_config(build_config(preset, TINY)).eval()
    inputs = {"input_ids": torch.tensor([[1, 95, 0]])}
    if preset.startswith("encoder-decoder"):
        inputs["decoder_input_ids"] = torch.tensor([[0, 1]])
    with torch.no_grad():
        model(**inputs, attention_mask=torch.ones(1, 3))  # the right shapes are accepted
        with pytest.raises(ValueError, match=expected):
            model(**{**inputs, **change})


@pytest.mark.parametrize("preset, auto_class", FAMILIES, ids=[f[0] for f in FAMILIES])
@pytest.mark.parametrize(
    "bad_mask, expected",
    [
        (torch.tensor([[0.0, 0.0, -10000.0]]), r"attention_mask holds -10000.0: expected 1 for each token to attend "
         r"to and 0 for padding \(an additive mask, .*pass \(mask == 0\).long\(\) instead"),
        (torch.tensor([[1, 1, 2]]), r"attention_mask holds 2: .*\(segment or document ids\?"),
        (torch.tensor([[1.0, 0.5, 1.0]]), r"attention_mask holds 0.5: expected 1 for each token .* for padding$"),
    ],
    ids=["additive", "document-ids", "fraction"],
)  # fmt: skip
def test_a_mask_holding_other_values_than_0_and_1_is_refused(preset, auto_class, bad_mask, expected):
    """masking_utils reads a 2-D mask as a boolean: these would be attended to where nonzero, silently."""
    model = auto_class.from_config(build_config(preset, TINY)).eval()
    inputs = {"input_ids": torch.tensor([[1, 95, 0]])}
    if preset.startswith("encoder-decoder"):
        inputs["decoder_input_ids"] = torch.tensor([[0, 1, 5]])
    with torch.no_grad():
        reference = model(**inputs, attention_mask=torch.tensor([[1, 1, 0]])).logits
        for same in (torch.tensor([[True, True, False]]), torch.tensor([[1.0, 1.0, 0.0]])):  # the same mask
            torch.testing.assert_close(model(**inputs, attention_mask=same).logits, reference)
        with pytest.raises(ValueError, match=expected):
            model(**inputs, attention_mask=bad_mask)
        if preset.startswith("encoder-decoder"):  # the decoder's own mask too
            with pytest.raises(ValueError, match=expected):
                model(**inputs, decoder_attention_mask=bad_mask)
        with caller_checked_ids():  # a loop that checked its batches (check_batch_ids) reads nothing back
            model(**inputs, attention_mask=bad_mask)


@pytest.mark.parametrize("preset, auto_class", FAMILIES[:2], ids=[f[0] for f in FAMILIES[:2]])
def test_position_ids_of_another_length_or_beyond_the_table_are_refused(preset, auto_class):
    model = auto_class.from_config(build_config(preset, TINY)).eval()
    ids = torch.tensor([[1, 95, 0]])
    with torch.no_grad():
        model(input_ids=ids, position_ids=torch.tensor([[0, 1, 63]]))  # the last learned position is accepted
        with pytest.raises(
            ValueError,
            match=r"position_ids must be \(batch_size or 1, sequence_length\) like the tokens \(1, 3\), "
            r"got shape \(1, 2\)",
        ):
            model(input_ids=ids, position_ids=torch.tensor([[0, 1]]))
        with pytest.raises(ValueError, match=r"position id 64 is outside \[0, max_position_embeddings=64\)"):
            model(input_ids=ids, position_ids=torch.tensor([[0, 1, 64]]))


def test_token_type_ids_outside_the_table_are_refused():
    model = AutoModelForMaskedLM.from_config(build_config("encoder-tiny", TINY)).eval()
    ids = torch.tensor([[1, 95, 0]])
    with torch.no_grad():
        model(input_ids=ids, token_type_ids=torch.tensor([[0, 1, 1]]))
        with pytest.raises(ValueError, match=r"token type id 2 is outside \[0, type_vocab_size=2\)"):
            model(input_ids=ids, token_type_ids=torch.tensor([[0, 1, 2]]))
        with pytest.raises(ValueError, match=r"token_type_ids must be .*got shape \(1, 4\)"):
            model(input_ids=ids, token_type_ids=torch.tensor([[0, 1, 1, 1]]))


@pytest.mark.compat
def test_a_mask_must_cover_the_cached_positions_and_the_new_tokens():
    """With a cache, the mask is `(batch, past + new)`: one over the new tokens only is refused."""
    model = AutoModelForCausalLM.from_config(build_config("decoder-tiny", TINY)).eval()
    with torch.no_grad():
        cache = output_cache(model(input_ids=torch.tensor([[1, 95, 0]]), use_cache=True))
        step = torch.tensor([[4]])
        with pytest.raises(
            ValueError,
            match=r"attention_mask has shape \(1, 1\), but the input is 1 x 1 tokens after "
            r"3 cached positions \(a prefix or earlier tokens\): expected \(1, 4\)",
        ):
            model(input_ids=step, attention_mask=torch.ones(1, 1), cache=cache)
        model(input_ids=step, attention_mask=torch.ones(1, 4), cache=cache)


def test_the_encoder_decoder_checks_both_masks_of_its_decoder():
    model = AutoModelForSeq2SeqLM.from_config(build_config("encoder-decoder-tiny", TINY)).eval()
    inputs = {"input_ids": torch.tensor([[1, 95, 0]]), "decoder_input_ids": torch.tensor([[0, 1]])}
    with torch.no_grad():
        with pytest.raises(ValueError, match=r"attention_mask has shape \(1, 3\), but the input is 1 x 2 tokens"):
            model(**inputs, decoder_attention_mask=torch.ones(1, 3))
        encoder_outputs = model.get_encoder()(input_ids=inputs["input_ids"])  # given: the encoder does not run
        with pytest.raises(
            ValueError,
            match=r"the encoder's attention_mask has shape \(1, 2\), but the encoder "
            r"output is 1 x 3 positions: expected \(1, 3\)",
        ):
            model(
                encoder_outputs=encoder_outputs,
                decoder_input_ids=inputs["decoder_input_ids"],
                attention_mask=torch.ones(1, 2),
            )


@pytest.mark.parametrize("preset, auto_class", FAMILIES, ids=[f[0] for f in FAMILIES])
@pytest.mark.parametrize("training", [True, False], ids=["chunked-loss", "logits"])
@pytest.mark.parametrize(
    "labels, expected",
    [
        (lambda ids: ids[:, :-1], r"labels must be \(batch_size, sequence_length\) like the tokens they label "
                                  r"\(2, {n}\), got shape \(2, {m}\)"),
        (lambda ids: ids[:1], r"labels must be .* like the tokens they label \(2, {n}\), got shape \(1, {n}\)"),
        (lambda ids: torch.full_like(ids, 96), r"label 96 is outside the vocabulary: labels must be in "
                                               r"\[0, vocab_size=96\), or -100 for a position without a label"),
        (lambda ids: torch.full_like(ids, -5), r"label -5 is outside the vocabulary"),
        (lambda ids: ids.float(), r"labels must be integer token ids \(int64; -100 = ignored\), got dtype "
                                  r"torch.float32"),
    ],
    ids=["shorter", "fewer-rows", "beyond-the-vocabulary", "negative", "float"],
)  # fmt: skip
def test_language_modelling_labels_that_cannot_label_the_tokens_are_refused(preset, auto_class, training, labels,
                                                                            expected):  # fmt: skip
    """Instead of torch's messages about flattened batches, an IndexError, or a device-side assert on a GPU."""
    model = auto_class.from_config(build_config(preset, TINY)).train(training)
    ids = torch.tensor([[1, 95, 0, 7], [3, 4, 5, 6]])
    inputs = {"input_ids": ids}
    target = ids
    if preset.startswith("encoder-decoder"):
        target = torch.tensor([[0, 1, 95], [2, 3, 4]])
        inputs["decoder_input_ids"] = target
    n = target.shape[1]
    good = target.masked_fill(target == 0, -100)  # the largest id and ignored positions are accepted
    assert torch.isfinite(model(**inputs, labels=good).loss)
    with pytest.raises(ValueError, match=expected.format(n=n, m=n - 1)):
        model(**inputs, labels=labels(target))


def _value_reads(model, inputs) -> int:
    """How many values a forward reads back from its device (`aten::_local_scalar_dense`: a sync each on a GPU)."""
    from torch.profiler import profile

    with profile() as prof:
        model(**inputs)
    return sum(e.count for e in prof.key_averages() if e.key == "aten::_local_scalar_dense")


@pytest.mark.parametrize("preset, auto_class", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_caller_checked_ids_skips_the_value_checks_and_keeps_the_shape_checks(preset, auto_class):
    """A training loop that checks its batches on the CPU runs forwards that read nothing back for the checks."""
    model = auto_class.from_config(build_config(preset, TINY)).train()
    ids = torch.tensor([[1, 95, 0, 7], [3, 4, 5, 6]])
    inputs = {"input_ids": ids, "labels": ids}
    if preset.startswith("encoder-decoder"):
        inputs["decoder_input_ids"] = ids
    checked = _value_reads(model, inputs)
    with caller_checked_ids():
        assert not model_value_checks_enabled()
        trusted = _value_reads(model, inputs)
        with pytest.raises(ValueError, match=r"attention_mask has shape \(2, 3\)"):  # shapes: checked as always
            model(**inputs, attention_mask=torch.ones(2, 3))
        with pytest.raises(IndexError):  # no hfzoo message: the lookup itself fails
            model(**{**inputs, "input_ids": torch.full_like(ids, 96)})
    assert checked >= trusted + 2  # the token ids and the labels (a model may read other values back too)
    assert model_value_checks_enabled()  # restored on exit
    with pytest.raises(ValueError, match="token id 96 is outside the vocabulary"):
        model(**{**inputs, "input_ids": torch.full_like(ids, 96)})


def test_caller_checked_ids_skips_the_class_label_check_of_a_classifier():
    """The GLUE loop checks its datasets' labels before training (`check_encoded_inputs`), then trusts its batches."""
    model = AutoModelForSequenceClassification.from_config(build_config("encoder-tiny", TINY, num_labels=3)).train()
    inputs = {"input_ids": torch.tensor([[1, 95, 0, 7], [3, 4, 5, 6]]), "labels": torch.tensor([0, 2])}
    checked = _value_reads(model, inputs)
    with caller_checked_ids():
        trusted = _value_reads(model, inputs)
    assert checked >= trusted + 2  # the token ids and the class labels
    with pytest.raises(ValueError, match=r"label 3 is outside \[0, num_labels=3\)"):
        model(**{**inputs, "labels": torch.tensor([0, 3])})


def test_caller_checked_ids_skips_the_eos_check_of_an_encoder_decoder_classifier():
    """The GLUE loop checks that every row has its eos before training (`check_encoded_inputs`)."""
    config = build_config("encoder-decoder-tiny", TINY, num_labels=2, eos_token_id=2, pad_token_id=0,
                          decoder_start_token_id=0)  # fmt: skip
    model = AutoModelForSequenceClassification.from_config(config).eval()
    inputs = {"input_ids": torch.tensor([[5, 6, 2], [7, 2, 0]])}
    checked = _value_reads(model, inputs)
    with caller_checked_ids():
        trusted = _value_reads(model, inputs)
    assert checked > trusted == 0  # no attention mask to ask about: nothing at all is read back
    with pytest.raises(ValueError, match="every sequence needs an eos_token_id"):
        model(input_ids=torch.tensor([[5, 6, 2], [7, 8, 0]]))


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"input_ids": torch.tensor([[1, 96]])}, r"token id 96 is outside the vocabulary: .*vocab_size=96\)"),
        ({"input_ids": torch.tensor([[-3, 1]])}, r"token id -3 is outside the vocabulary"),
        ({"decoder_input_ids": torch.tensor([[0, 97]])}, r"token id 97 is outside the vocabulary"),
        ({"labels": torch.tensor([[96, -100]])}, r"label 96 is outside the vocabulary: .*or -100 for a position"),
        ({"labels": torch.tensor([[-2, 1]])}, r"label -2 is outside the vocabulary"),
        ({"attention_mask": torch.tensor([[1, 2]])}, r"attention_mask holds 2: expected 1 for each token"),
        ({"decoder_attention_mask": torch.tensor([[0.0, -1e9]])}, r"decoder_attention_mask holds -1000000000.0"),
    ],
    ids=["id-too-large", "id-negative", "decoder-id", "label-too-large", "label-negative", "mask", "decoder-mask"],
)  # fmt: skip
def test_check_batch_ids_refuses_what_the_models_refuse_also_inside_caller_checked_ids(change, expected):
    good = {"input_ids": torch.tensor([[0, 95]]), "labels": torch.tensor([[95, -100]]),
            "attention_mask": torch.tensor([[1, 0]])}  # fmt: skip
    check_batch_ids(good, 96)  # the largest id and ignored labels pass
    with caller_checked_ids(), pytest.raises(ValueError, match=expected):
        check_batch_ids({**good, **change}, 96)


def test_the_pretraining_loop_checks_its_batches_on_the_cpu_and_trains_without_a_device_read_per_forward(
    tmp_path, small_jsonl_xz, tokenizer_dir, monkeypatch
):
    checked_batches, steps = [], []
    real_check, real_step = pretraining.check_batch_ids, pretraining.accumulation_step

    def check(batch, vocab_size):
        checked_batches.append(batch["input_ids"].device.type)
        return real_check(batch, vocab_size)

    def step(accelerator, model, optimizer, lr_scheduler, micro_batches, *args, **kwargs):
        masks = [b.get("attention_mask") for b in micro_batches]  # packed blocks: none needed
        steps.append((model_value_checks_enabled(), len(micro_batches), masks))
        return real_step(accelerator, model, optimizer, lr_scheduler, micro_batches, *args, **kwargs)

    monkeypatch.setattr(pretraining, "check_batch_ids", check)
    monkeypatch.setattr(pretraining, "accumulation_step", step)
    argv = base_args(small_jsonl_xz, tokenizer_dir, tmp_path / "out", "--max_train_steps", "3",
                     "--gradient_accumulation_steps", "2")  # fmt: skip
    pretraining.main(argv)
    assert steps == [(False, 2, [None, None])] * 3
    assert checked_batches == ["cpu"] * 6  # every micro-batch, before it is moved
    assert model_value_checks_enabled()


def test_only_an_attention_mask_of_ones_is_left_out():
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    full = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    assert pretraining.without_full_attention_mask(full) == {"input_ids": ids, "labels": ids}
    padded = {**full, "attention_mask": torch.tensor([[1, 1, 1], [1, 1, 0]])}
    assert pretraining.without_full_attention_mask(padded) is padded
    assert pretraining.without_full_attention_mask({"input_ids": ids}) == {"input_ids": ids}
