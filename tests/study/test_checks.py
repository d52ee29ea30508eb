"""`hfzoo.study.checks`: bad input is refused in one line before anything is trained."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from helpers.study import DELETE, expect_refusal, tiny_study

from hfzoo import HfzooEncoderDecoderConfig
from hfzoo.study.checks import _check_attention_kernel

ON_A_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="refused only without a GPU")
TINY = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "head_dim": 16, "num_hidden_layers": 2}


@pytest.mark.parametrize(
    "changes, flags, expected",
    [
        (
            {"variants": ["Vanilla Transformer", "Vanila Transformer"]},
            [],
            "variants: unknown row 'Vanila Transformer': did you mean 'Vanilla Transformer' or",
        ),
        ({"variants": ["QK-norm", "Squared RELU"]}, [], "unknown row 'Squared RELU': did you mean 'Squared ReLU'?"),
        (  # a study-wide Muon setting with a row that trains with AdamW
            {"variants": ["Muon", "QK-norm"], "pretrain_args": {"muon_learning_rate": 0.01}},
            [],
            "variant 'QK-norm': the pretraining arguments are refused: hfzoo-pretrain: error: --muon_learning_rate 0.01 needs --optim muon",
        ),
        ({}, ["--variants", "SwiGLUE"], "unknown row 'SwiGLUE': did you mean 'SwiGLU'"),
        ({"glue_tasks": DELETE}, [], "missing keys ['glue_tasks'] (every key of the study file is required)"),
        ({"learning_rat": 0.1}, [], "unknown keys ['learning_rat']"),
        ({"glue_tasks": ["sst2", "mrpc"]}, [], "glue_tasks: mrpc: files absent: ["),
        ({"glue_tasks": ["sst3"]}, [], "unknown GLUE task 'sst3'"),
        ({"seeds": []}, [], "seeds: the study has no seeds"),
        ({}, ["--max_train_steps", "0"], "max_train_steps=0: needs at least 8 steps"),
        ({"max_train_steps": "many"}, [], "max_train_steps='many' should be an int"),
        ({"train_file": ["/nonexistent/books.jsonl"]}, [], "train_file: /nonexistent/books.jsonl: no such file"),
        (
            {"variants": ["18 layers, $d_{ff} = 2048, H = 8$"]},
            [],
            "num_attention_heads=2 x 2/3 = 1.333 is not a whole number",
        ),
        ({"config_overrides": {"hidden_size": 32, "hiden_layers": 2}}, [], "unknown key 'hiden_layers'"),
        (
            {"config_overrides": {"hidden_size": 32, "num_layers": 2}},
            [],
            "unknown key 'num_layers' for hfzoo_encoder_decoder: num_layers is T5's name for num_hidden_layers",
        ),
        ({}, ["--ladder", "budgets"], "error: --ladder: item 'budgets' is not of the form key=value"),
        ({"train_batch_tokens": 100}, [], "train_batch_tokens=100 is not a multiple of block_size"),
        ({}, ["--block_size", "0"], "block_size must be positive, got 0"),
        (  # refused before the tokenizer (and its output folder) was started
            {"tokenizer_name": None, "tokenizer_vocab_size": 300},
            [],
            "tokenizer_vocab_size: vocab_size=300 is too small for the 'encoder-decoder' family: it must be at least "
            "359 (256 byte symbols + 103 special tokens)",
        ),
        (
            {"tokenizer_name": None},
            ["--validation_split_percentage", "60"],
            "hfzoo-pretrain: error: argument --validation_split_percentage: must be an integer in [1, 50], got 60",
        ),
        (  # the study's tokenizer would be trained before the collator that refuses it is built
            {"tokenizer_name": None},
            ["--noise_density", "1.5"],
            "the pretraining arguments are refused: hfzoo-pretrain: error: argument --noise_density: must be in (0, 1)",
        ),
        ({"glue_args": {"lora_dropout": 2}}, [], "the GLUE arguments are refused"),
        ({"lr_scheduler_type": "sometimes"}, [], "the pretraining arguments are refused"),
        pytest.param(  # the run itself would refuse it only after the tokenizer and the data were built
            {"mixed_precision": "fp16"},
            [],
            "the pretraining arguments are refused: --mixed_precision fp16 needs a GPU",
            marks=ON_A_GPU,
        ),
        pytest.param(
            {"attn_implementation": "flex_attention"},
            [],
            "the pretraining arguments are refused: --attn_implementation flex_attention cannot train on the CPU",
            marks=ON_A_GPU,
        ),
        (  # transformers' own refusal, which the recipes would meet only once their data is ready
            {"attn_implementation": "eager_attention"},
            [],
            "attn_implementation eager_attention: variant 'Vanilla Transformer': Specified "
            '`attn_implementation="eager_attention"` is not supported.',
        ),
        ({}, ["--family", "gpt"], "family='gpt': choose one of ['encoder-decoder', 'decoder', 'encoder']"),
        (
            {"variants": ["Vanilla Transformer", "Funnel Transformer"]},
            ["--family", "decoder"],
            "variant 'Funnel Transformer' in the decoder family: changes ['decoder_layer_stack'], which only an "
            "encoder-decoder has; the row has no decoder form",
        ),
        (
            {"variants": ["Transparent attention"]},
            ["--family", "encoder"],
            "variant 'Transparent attention' in the encoder family: transparent_attention=True is defined for the "
            "encoder-decoder (hfzoo_encoder_decoder) only",
        ),
        ({"config_name": "decoder-tiny", "config_overrides": {}}, [], "config_name 'decoder-tiny' is a hfzoo_decoder"),
        ({"seeds": [0, -1]}, [], "seeds: [-1] outside [0, 4294967295]"),
        (
            {"config_overrides": {**TINY, "max_position_embeddings": 16}},
            [],
            "variant 'Vanilla Transformer': the pretraining arguments are refused: --block_size 32 is larger than "
            "max_position_embeddings=16",
        ),
        (
            {"config_overrides": {**TINY, "max_position_embeddings": 64}, "glue_max_length": 100},
            [],
            "variant 'Vanilla Transformer': the GLUE arguments are refused: --max_length 100 is longer than the "
            "model's max_position_embeddings=64",
        ),
        (  # seed 0 is the first run's own: the second run would train with it too
            {"pretrain_args": {"seed": 0}},
            [],
            "pretrain_args: sets --seed 0, which the study sets for its runs (it would override the study's value "
            "and what its report assumes); change the study key seeds instead (one run per seed)",
        ),
        (  # an abbreviation argparse expands
            {"pretrain_args": {"max_train_step": 100}},
            [],
            "pretrain_args: sets --max_train_steps 100, which the study sets for its runs (it would override the "
            "study's value and what its report assumes); change the study key max_train_steps instead",
        ),
        (
            {},
            ["--pretrain_args", "{eval_steps: 3}"],
            "change the study key max_train_steps instead (the study validates every 1/8",
        ),
        ({"glue_args": {"output_dir": "/tmp/one"}}, [], "glue_args: sets --output_dir /tmp/one, which the study sets"),
        ({"glue_args": {"learning_rate": 0.5}}, [], "change the study key glue_learning_rate instead"),
        ({"glue_args": {"peft": "lora"}}, [], "; the study finetunes the whole model"),
    ],
    ids=[
        "unknown-variant",
        "unknown-modern-row",
        "muon-flag-for-an-adamw-row",
        "unknown-variant-flag",
        "missing-key",
        "unknown-key",
        "absent-glue-files",
        "unknown-glue-task",
        "zero-seeds",
        "zero-steps",
        "wrong-type",
        "absent-data",
        "row-does-not-scale",
        "bad-override",
        "another-models-field-name",
        "ladder-not-a-mapping",
        "batch-arithmetic",
        "zero-block-size",
        "tokenizer-vocabulary-too-small",
        "validation-percentage",
        "noise-density-before-the-tokenizer",
        "bad-glue-args",
        "bad-pretrain-args",
        "fp16-without-a-gpu",
        "flex-attention-without-a-gpu",
        "unknown-attention-implementation",
        "unknown-family",
        "encoder-decoder-only-row",
        "cross-attention-row",
        "base-of-another-family",
        "negative-seed",
        "block-beyond-the-position-table",
        "glue-length-beyond-the-position-table",
        "pretrain-args-seed",
        "pretrain-args-abbreviated-study-flag",
        "pretrain-args-eval-steps-flag",
        "glue-args-output-dir",
        "glue-args-learning-rate",
        "glue-args-peft",
    ],
)
def test_bad_input_is_refused_before_anything_is_trained(changes, flags, expected, inputs, tmp_path, capsys):
    # tokenizer_name null: had the checks passed, the study would first have trained a tokenizer
    study = tiny_study(inputs, tmp_path / "study.yaml", **{"tokenizer_name": None, **changes})
    message = expect_refusal(["--study", str(study), "--output_dir", str(tmp_path / "out"), *flags], capsys)
    assert message.startswith("error: ") and expected in message, message
    assert not (tmp_path / "out" / "tokenizer").exists() and not (tmp_path / "out" / "runs").exists()


def test_a_validation_file_that_is_also_trained_on_is_refused(inputs, tmp_path, capsys):
    """The held-out loss of every row would be measured on text the rows train on."""
    study = tiny_study(inputs, tmp_path / "study.yaml", tokenizer_name=None, validation_file=[inputs["train"]])
    message = expect_refusal(["--study", str(study), "--output_dir", str(tmp_path / "out")], capsys)
    assert message == (
        f"error: validation_file {inputs['train']}: is also train_file {inputs['train']}; the validation metrics would "
        "be measured on text the model trains on"
    )
    study = tiny_study(inputs, tmp_path / "study.yaml", train_file=[inputs["train"], inputs["train"]])
    message = expect_refusal(["--study", str(study), "--output_dir", str(tmp_path / "out")], capsys)
    assert message.startswith(f"error: train_file {inputs['train']}: given twice")
    assert not (tmp_path / "out" / "tokenizer").exists() and not (tmp_path / "out" / "runs").exists()


@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is not None, reason="needs flash-attn absent")
def test_an_attention_kernel_whose_package_is_missing_is_refused_for_every_row():
    """Built on the meta device: transformers' ImportError (or its refusal) becomes one line naming the row."""
    config = HfzooEncoderDecoderConfig(vocab_size=64, **TINY)
    with pytest.raises(ValueError) as excinfo:
        _check_attention_kernel("flash_attention_2", "SwiGLU", config)
    message = str(excinfo.value)
    assert message.startswith("attn_implementation flash_attention_2: variant 'SwiGLU': FlashAttention2 has been")
    assert "\n" not in message
    for implementation in (None, "eager", "sdpa", "flex_attention"):
        _check_attention_kernel(implementation, "SwiGLU", config)
