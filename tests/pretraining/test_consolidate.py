"""recipes/consolidate_checkpoint.py on a single-process checkpoint: the saved weights, and bad input refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers.pretraining import base_args
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from hfzoo.pretraining.consolidate import consolidate_checkpoint
from hfzoo.pretraining.consolidate import main as consolidate_main
from hfzoo.pretraining.loop import main
from hfzoo.training.checkpointing import verify_checkpoint, write_manifest


@pytest.fixture(scope="module")
def run(tmp_path_factory, small_jsonl_xz, tokenizer_dir) -> Path:
    """A 2-step run with checkpoints at steps 1 and 2 (fp32, so the saved weights are the trained ones exactly)."""
    out = tmp_path_factory.mktemp("consolidate") / "run"
    main(base_args(small_jsonl_xz, tokenizer_dir, out, "--max_train_steps", "2", "--checkpointing_steps", "1",
                   "--mixed_precision", "no"))  # fmt: skip
    return out


def test_a_single_process_checkpoint_consolidates_to_the_final_weights(run, tmp_path):
    merged = consolidate_checkpoint(run / "checkpoints" / "step_2", tmp_path / "merged")
    final, saved = load_file(run / "model.safetensors"), load_file(merged / "model.safetensors")
    assert final.keys() == saved.keys()
    for name in final:
        assert torch.equal(final[name], saved[name]), name
    assert AutoModelForCausalLM.from_pretrained(merged).config.model_type == "hfzoo_decoder"
    assert (merged / "tokenizer.json").is_file()


def _refusal(checkpoint: Path, output: Path) -> str:
    """The one-line error of `recipes/consolidate_checkpoint.py CHECKPOINT OUTPUT`."""
    with pytest.raises(SystemExit) as exc:
        consolidate_main([str(checkpoint), str(output)])
    error = str(exc.value.code)
    assert error.startswith("error: ") and "\n" not in error, error
    return error


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("into-the-checkpoint", "output folder {ckpt} is the checkpoint folder or inside it: give another folder"),
        ("inside-the-checkpoint", "output folder {ckpt}/hf is the checkpoint folder or inside it"),
        ("output-is-a-file", "output folder {tmp}/file: is an existing file, not a folder"),
        ("run-folder", "{run}: not a pretraining checkpoint folder (no training_state.json); give one of its "
                       "checkpoints: {run}/checkpoints/step_1, {run}/checkpoints/step_2"),
        ("truncated-weights", "{ckpt}/model.safetensors: truncated ("),
        ("unknown-objective", "{ckpt}/training_state.json: objective 'xyz' is not one of ['clm', 'mlm', 'span']"),
    ],
    ids=["into-the-checkpoint", "inside-the-checkpoint", "output-is-a-file", "run-folder", "truncated-weights",
         "unknown-objective"],
)  # fmt: skip
def test_bad_input_is_refused_in_one_line_and_the_checkpoint_stays_intact(case, message, run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    checkpoint, output = copy / "checkpoints" / "step_2", tmp_path / "merged"
    if case == "into-the-checkpoint":
        output = checkpoint
    elif case == "inside-the-checkpoint":
        output = checkpoint / "hf"
    elif case == "output-is-a-file":
        output = tmp_path / "file"
        output.write_text("")
    elif case == "run-folder":
        checkpoint = copy
    elif case == "truncated-weights":
        weights = checkpoint / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:1000])
    else:
        state = json.loads((checkpoint / "training_state.json").read_text())
        (checkpoint / "training_state.json").write_text(json.dumps({**state, "objective": "xyz"}))
        write_manifest(checkpoint)
    error = _refusal(checkpoint, output)
    assert message.format(ckpt=checkpoint, tmp=tmp_path, run=copy) in error, error
    if case != "truncated-weights":
        verify_checkpoint(copy / "checkpoints" / "step_2")  # nothing the checkpoint's manifest lists changed
    assert not (tmp_path / "merged").exists() and not (checkpoint / "hf").exists()
