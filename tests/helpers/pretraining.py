"""Arguments of tiny pretraining runs on real text, the check that a refusal is one line, and resume tags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hfzoo.pretraining.loop import main
from hfzoo.training.checkpointing import MANIFEST, TRAIN_HISTORY_FILE, write_manifest

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


def tag_saved_history(checkpoint: Path, state_file: str = TRAIN_HISTORY_FILE) -> None:
    """Tag each training record saved with `checkpoint` (`"restored": True`) in its `state_file`'s `log_history`.

    A run resumed from it carries these records over instead of training their steps again, so its history
    shows which steps it restored; a run that started over (the same seed, the same weights) has none tagged.
    GLUE checkpoints keep their records in `hfzoo.finetuning.loop.GLUE_STATE`.
    """
    path = Path(checkpoint) / state_file
    saved = json.loads(path.read_text())
    saved["log_history"] = [{**record, "restored": True} for record in saved["log_history"]]
    path.write_text(json.dumps(saved))
    if (Path(checkpoint) / MANIFEST).is_file():  # the edit is ours: the manifest would refuse it as corrupt
        write_manifest(Path(checkpoint))


def restored_steps(output_dir: Path) -> tuple[list[int], list[int]]:
    """`(steps, restored)`: the steps of a finished run's training records, and those tagged by `tag_saved_history`."""
    records = json.loads((Path(output_dir) / "train_history.json").read_text())["log_history"]
    return [r["step"] for r in records], [r["step"] for r in records if r.get("restored")]
