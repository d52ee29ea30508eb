"""Arguments of tiny pretraining runs on real text, and the check that a refusal is one line."""

from __future__ import annotations

import pytest

from hfzoo.pretraining.loop import main

TINY_OVERRIDES = (
    "hidden_size=32,num_hidden_layers=2,num_attention_heads=2,intermediate_size=64,max_position_embeddings=64"
)


def base_args(train_file, tokenizer_dir, output_dir, *extra):
    return [
        "--train_file", str(train_file),
        "--tokenizer_name", str(tokenizer_dir),
        "--config_name", "decoder-tiny",
        "--config_overrides", TINY_OVERRIDES,
        "--block_size", "32",
        "--per_device_train_batch_size", "4",
        "--max_train_steps", "4",
        "--max_eval_samples", "8",
        "--validation_split_percentage", "25",
        "--output_dir", str(output_dir),
        *extra,
    ]  # fmt: skip


def run_main_expecting_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    message = exc.value.code if isinstance(exc.value.code, str) else capsys.readouterr().err
    assert "\n" not in message.strip(), f"error is not one line: {message!r}"
    return message
