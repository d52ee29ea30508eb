"""`hfzoo-evaluate-lm` in-process: the position limit of the sample, the metrics file, the KV-cache check.

A tiny decoder with learned positions (max_position_embeddings=64) and a byte-level BPE tokenizer, saved to a
temporary folder, evaluated on a few lines of text.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config

from hfzoo import HfzooDecoderConfig
from hfzoo.models.presets import build_config
from hfzoo.pretraining import evaluation
from hfzoo.pretraining.evaluation import generation_position_limit, main
from hfzoo.tokenization import train_bpe_tokenizer

TEXT = "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness. "
TINY = "hidden_size=32,num_hidden_layers=2,num_attention_heads=2,intermediate_size=64,max_position_embeddings=64"
PROMPT = "It was the best"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A randomly initialised decoder (learned positions, 64 of them) with its tokenizer, and `text.txt`."""
    path = tmp_path_factory.mktemp("evaluate_lm")
    tokenizer = train_bpe_tokenizer([[TEXT * 4] * 8], vocab_size=300)
    tokenizer.save_pretrained(path)
    config = build_config("decoder-tiny", TINY, position_embedding_type="learned", vocab_size=len(tokenizer))
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    (path / "text.txt").write_text((TEXT * 4 + "\n") * 8)
    return path


def prompt_tokens(checkpoint: Path) -> int:
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(checkpoint)(PROMPT)["input_ids"])


def evaluate(checkpoint: Path, output_file: Path, *extra: str) -> dict:
    return main(["--model_name_or_path", str(checkpoint), "--validation_file", str(checkpoint / "text.txt"),
                 "--max_eval_samples", "2", "--output_file", str(output_file), *extra])  # fmt: skip


def test_generation_past_the_position_table_is_refused_before_any_evaluation(checkpoint, tmp_path, monkeypatch):
    evaluated = []
    monkeypatch.setattr(
        evaluation, "evaluate_lm", lambda *a, **k: evaluated.append(1) or {"eval_loss": 1.0, "perplexity": 2.7}
    )
    n = prompt_tokens(checkpoint)
    with pytest.raises(SystemExit) as exit_info:
        evaluate(checkpoint, tmp_path / "eval.json", "--prompt", PROMPT, "--max_new_tokens", "600")
    assert exit_info.value.code == (
        f"error: --prompt is {n} tokens and --max_new_tokens is 600: {n + 600} positions, more than the model's "
        f"max_position_embeddings=64 (position_embedding_type='learned'); use --max_new_tokens <= {64 - n}"
    )
    assert not evaluated and not (tmp_path / "eval.json").exists()
    # One token more than the table is refused (exactly its length is generated in the next tests).
    with pytest.raises(SystemExit, match="65 positions, more than"):
        evaluate(checkpoint, tmp_path / "eval.json", "--prompt", PROMPT, "--max_new_tokens", str(65 - n))


def test_ids_beyond_the_models_vocabulary_are_refused_before_any_evaluation(checkpoint, tmp_path, monkeypatch):
    """The checkpoint's tokenizer is larger than its model's vocabulary (another tokenizer saved beside it)."""
    from transformers import AutoTokenizer

    small = tmp_path / "small-vocab"
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    tokenizer.save_pretrained(small)
    config = build_config("decoder-tiny", TINY, position_embedding_type="learned", vocab_size=260)
    AutoModelForCausalLM.from_config(config).save_pretrained(small)
    (small / "text.txt").write_text((checkpoint / "text.txt").read_text())
    monkeypatch.setattr(evaluation, "evaluate_lm", lambda *a, **k: pytest.fail("evaluated before the ids were checked"))
    with pytest.raises(SystemExit) as exit_info:
        evaluate(small, tmp_path / "eval.json")
    found = re.fullmatch(
        rf"error: --validation_file {small / 'text.txt'}: token id (\d+) is outside \[0, vocab_size=260\): the "
        rf"checkpoint's tokenizer has {len(tokenizer)} tokens, more than its model's vocabulary",
        exit_info.value.code,
    )
    assert found and int(found.group(1)) >= 260, exit_info.value.code
    largest = max(tokenizer(PROMPT)["input_ids"])
    assert largest >= 260  # the prompt holds merges beyond the model's 260 rows too; it is checked first
    with pytest.raises(SystemExit) as exit_info:
        evaluate(small, tmp_path / "eval.json", "--prompt", PROMPT)
    assert exit_info.value.code == (
        f"error: --prompt: token id {largest} is outside [0, vocab_size=260): the checkpoint's tokenizer has "
        f"{len(tokenizer)} tokens, more than its model's vocabulary"
    )
    assert not (tmp_path / "eval.json").exists()


@pytest.mark.parametrize(
    ("fields", "expected"),
    [({"position_embedding_type": "learned"}, (64, "position_embedding_type='learned'")),
     ({"position_embedding_type": "sinusoidal"}, (64, "position_embedding_type='sinusoidal'")),
     ({"position_embedding_type": "rotary"}, None), ({"position_embedding_type": "alibi"}, None),
     ({"position_embedding_type": "relative_attention_bias"}, None), ({"position_embedding_type": "none"}, None),
     ({"position_embedding_type": "none", "token_mixer": "synthesizer"}, (64, "token_mixer='synthesizer'"))],
)  # fmt: skip
def test_position_limit_only_for_schemes_the_model_refuses_beyond(fields, expected):
    config = HfzooDecoderConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=32, max_position_embeddings=64, **fields)  # fmt: skip
    assert generation_position_limit(config) == expected


def test_position_limit_of_gpt2_and_unknown_models():
    assert generation_position_limit(GPT2Config(n_positions=32)) == (32, "GPT-2's learned position embeddings")
    assert generation_position_limit(build_config("decoder-tiny", position_embedding_type="rotary")) is None


def test_metrics_are_written_before_the_sample_is_generated(checkpoint, tmp_path, monkeypatch):
    model_class = type(AutoModelForCausalLM.from_pretrained(checkpoint))

    def failing_generate(self, *args, **kwargs):
        raise RuntimeError("generation failed")

    monkeypatch.setattr(model_class, "generate", failing_generate)
    with pytest.raises(RuntimeError, match="generation failed"):
        evaluate(checkpoint, tmp_path / "eval.json", "--prompt", PROMPT)
    written = json.loads((tmp_path / "eval.json").read_text())
    assert set(written) == {"text.txt"} and written["text.txt"]["blocks"] == 2


def test_greedy_sample_with_and_without_the_cache_agree(checkpoint, tmp_path):
    """Up to the last position of the table: cached decoding must reproduce the full recomputation."""
    n = prompt_tokens(checkpoint)
    results = evaluate(checkpoint, tmp_path / "eval.json", "--prompt", PROMPT, "--max_new_tokens", str(64 - n))
    sample = json.loads((tmp_path / "eval.json").read_text())["sample"]
    assert sample == results["sample"]
    assert sample["cache_equal"] is True and sample["first_difference"] is None
    assert sample["new_tokens"] == 64 - n
    assert sample["text"] == sample["text_without_cache"] and sample["text"].startswith(PROMPT)
    assert sample["text"] == PROMPT + sample["continuation"] and sample["continuation"]
    assert results["text.txt"]["blocks"] == 2


def test_cache_check_fails_when_cached_decoding_differs(checkpoint, tmp_path, monkeypatch):
    """A model whose incremental steps (one new token, the rest in the cache) predict differently is caught."""
    model_class = type(AutoModelForCausalLM.from_pretrained(checkpoint))
    forward = model_class.forward

    def diverging_forward(self, input_ids=None, *args, **kwargs):
        output = forward(self, input_ids, *args, **kwargs)
        if input_ids is not None and input_ids.shape[1] == 1:  # only cached decoding feeds one token at a time
            output.logits = output.logits.roll(1, dims=-1)  # every greedy choice moves to the next token id
        return output

    monkeypatch.setattr(model_class, "forward", diverging_forward)
    with pytest.raises(SystemExit) as exit_info:
        evaluate(checkpoint, tmp_path / "eval.json", "--prompt", PROMPT, "--max_new_tokens", "8")
    written = json.loads((tmp_path / "eval.json").read_text())
    sample = written["sample"]
    assert sample["cache_equal"] is False and sample["first_difference"] == 1  # the first token needs no cache
    assert sample["continuation"] != sample["continuation_without_cache"]
    assert written["text.txt"]["blocks"] == 2
    message = exit_info.value.code
    assert message == (
        "error: greedy generation with the KV cache differs from generation without it from new token 1 on: "
        f"with the cache {sample['continuation']!r}, without {sample['continuation_without_cache']!r}; the "
        "model's cached decoding is wrong"
    )
    assert "\n" not in message


def test_block_size_past_the_position_table_is_refused_before_tokenizing(checkpoint, tmp_path, monkeypatch):
    def no_tokenizing(*args, **kwargs):
        raise AssertionError("tokenized before the block size was checked")

    monkeypatch.setattr(evaluation, "tokenize_and_pack", no_tokenizing)
    out = tmp_path / "new" / "sub" / "eval.json"
    with pytest.raises(SystemExit) as exit_info:
        evaluate(checkpoint, out, "--block_size", "128")
    assert exit_info.value.code == (
        "error: --block_size 128 is larger than the model's max_position_embeddings=64 "
        "(set by position_embedding_type='learned'); give --block_size 64 or less"
    )
    assert not (tmp_path / "new").exists()  # the folder made for --output_file is gone again


@pytest.mark.parametrize(
    "where, expected",
    [
        ("file/eval.json", "--output_file {tmp}/file/eval.json: its folder {tmp}/file: is an existing file"),
        ("folder", "--output_file {tmp}/folder: is an existing folder, not a file"),
        ("/sys/hfzoo-unwritable/eval.json", "its folder /sys/hfzoo-unwritable: cannot write there"),
    ],
    ids=["file-as-folder", "folder-as-file", "unwritable"],
)
def test_an_output_file_that_cannot_be_written_is_refused_before_evaluating(
    where, expected, checkpoint, tmp_path, monkeypatch
):
    monkeypatch.setattr(evaluation, "evaluate_lm", lambda *a, **k: pytest.fail("evaluated before the check"))
    (tmp_path / "file").write_text("")
    (tmp_path / "folder").mkdir()
    with pytest.raises(SystemExit) as exit_info:
        evaluate(checkpoint, tmp_path / where)
    assert exit_info.value.code.startswith("error: ") and expected.format(tmp=tmp_path) in exit_info.value.code


def test_a_missing_output_folder_is_created_and_the_metrics_saved(checkpoint, tmp_path):
    out = tmp_path / "nodir" / "sub" / "eval.json"
    results = evaluate(checkpoint, out)
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))


@pytest.mark.parametrize(
    "extra, expected",
    [
        (
            ["--text_column_name", "body"],
            "error: --text_column_name 'body' is not a column of --validation_file {file}; its columns are ['text']",
        ),
        (["--prompt", ""], "error: --prompt is empty: give the text to continue, or leave --prompt out"),
        (["--validation_file", "{folder}/../{name}/text.txt"], "error: --validation_file {folder}/../{name}/text.txt: "
         "given twice (as {file} too); give each file once"),
    ],
    ids=["text-column", "empty-prompt", "file-twice"],
)  # fmt: skip
def test_bad_input_is_refused_before_the_model_is_loaded(extra, expected, checkpoint, tmp_path, monkeypatch):
    monkeypatch.setattr(evaluation, "AutoTokenizer", None)  # loading the tokenizer (or the model) would fail here
    where = dict(file=checkpoint / "text.txt", folder=checkpoint, name=checkpoint.name)
    with pytest.raises(SystemExit) as exit_info:
        evaluate(checkpoint, tmp_path / "eval.json", *[a.format(**where) for a in extra])
    assert exit_info.value.code == expected.format(**where)


def test_files_that_share_a_name_keep_their_own_results(checkpoint, tmp_path):
    """Two `valid.txt` (as WikiText-2's and WikiText-103's `wiki.valid.tokens`) are reported under their paths."""
    for folder, repeats in (("a", 1), ("b", 3)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "valid.txt").write_text((TEXT * 4 + "\n") * 2 * repeats)
    files = [str(tmp_path / "a" / "valid.txt"), str(tmp_path / "b" / "valid.txt"), str(checkpoint / "text.txt")]
    results = main(["--model_name_or_path", str(checkpoint), "--validation_file", *files,
                    "--output_file", str(tmp_path / "eval.json")])  # fmt: skip
    assert list(results) == [*files[:2], "text.txt"]
    assert results[files[0]]["tokens"] * 3 == results[files[1]]["tokens"]
    assert json.loads((tmp_path / "eval.json").read_text()) == json.loads(json.dumps(results))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "nothing to evaluate: give --validation_file, --lm_eval_tasks or --prompt"),
        (["--validation_file", "t.txt", "--max_new_tokens", "5"], "--max_new_tokens 5 needs --prompt (without it, it"),
        (["--validation_file", "t.txt", "--data_dir", "d"], "--data_dir d needs --lm_eval_tasks (without it, it would"),
        (["--validation_file", "t.txt", "--lm_eval_limit", "3"], "--lm_eval_limit 3 needs --lm_eval_tasks"),
    ],
    ids=["nothing-to-do", "max-new-tokens-without-prompt", "data-dir-without-tasks", "limit-without-tasks"],
)
def test_arguments_that_would_do_nothing_are_refused_when_parsed(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        evaluation.parse_evaluate_args(["--model_name_or_path", "m", *argv])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert evaluation.parse_evaluate_args(["--model_name_or_path", "m", "--prompt", "a"]).max_new_tokens == 32
