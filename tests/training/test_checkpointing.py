"""Checkpoint integrity: the manifest, verification on load, `latest` skipping damaged checkpoints, and a save
that fails on a full disk or a permission error keeping the previous checkpoint."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import shutil

import accelerate.checkpointing
import pytest
import torch
from helpers.pretraining import base_args, restored_steps, run_main_expecting_error, tag_saved_history
from safetensors.torch import load_file

from hfzoo.pretraining.loop import main
from hfzoo.training.checkpointing import MANIFEST, find_latest_checkpoint, verify_checkpoint
from hfzoo.training.faults import CheckpointError

COMMON = ["--max_train_steps", "6", "--checkpointing_steps", "2", "--checkpoints_total_limit", "3",
          "--learning_rate", "3e-3", "--weight_decay", "0.01", "--logging_steps", "1"]  # fmt: skip


def _flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))


def _optimizer_state(path):
    return torch.load(path / "optimizer.bin", map_location="cpu", weights_only=True)


def test_latest_skips_incomplete_and_corrupt_checkpoints_and_resumes_bit_exactly(
    tmp_path, small_jsonl_xz, tokenizer_dir, caplog, capsys
):
    out = tmp_path / "run"
    main(base_args(small_jsonl_xz, tokenizer_dir, out, *COMMON))
    ckpts = out / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_2", "step_4", "step_6"]

    # The manifest lists every other file of the checkpoint with its size and sha256.
    for folder in ckpts.iterdir():
        files = json.loads((folder / MANIFEST).read_text())["files"]
        on_disk = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} - {MANIFEST}
        assert set(files) == on_disk and {"model.safetensors", "optimizer.bin", "training_state.json"} <= on_disk
        for name, entry in files.items():
            data = (folder / name).read_bytes()
            assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        verify_checkpoint(folder)
    reference_weights = load_file(out / "model.safetensors")
    reference_optimizer = _optimizer_state(ckpts / "step_6")

    # Damage the two newest (one byte flipped: same size; a truncation) and leave an unfinished save behind.
    weights_6 = ckpts / "step_6" / "model.safetensors"
    _flip_byte(weights_6, weights_6.stat().st_size - 10)
    optimizer_4 = ckpts / "step_4" / "optimizer.bin"
    with open(optimizer_4, "r+b") as f:
        f.truncate(100)
    shutil.copytree(ckpts / "step_2", ckpts / "step_8.tmp")
    (ckpts / "step_8.tmp" / MANIFEST).unlink()
    with caplog.at_level(logging.WARNING, logger="hfzoo.training.checkpointing"):
        assert find_latest_checkpoint(out) == ckpts / "step_2"
    warnings = [r.getMessage() for r in caplog.records]
    assert f"skipping checkpoint {ckpts / 'step_8.tmp'}: incomplete (its save did not finish)" in warnings
    assert (
        f"skipping checkpoint {ckpts / 'step_6'}: {weights_6}: corrupt (its sha256 differs from manifest.json)"
        in warnings
    )
    assert any(
        w.startswith(f"skipping checkpoint {ckpts / 'step_4'}: {optimizer_4}: truncated (100 bytes") for w in warnings
    )

    # A damaged checkpoint named explicitly is refused in one line; with only damaged ones, `latest` refuses too.
    message = run_main_expecting_error(
        base_args(small_jsonl_xz, tokenizer_dir, tmp_path / "other", *COMMON, "--resume_from_checkpoint", str(ckpts / "step_6")),
        capsys,
    )  # fmt: skip
    assert f"--resume_from_checkpoint {ckpts / 'step_6'}: {weights_6}: corrupt" in message
    only_damaged = tmp_path / "damaged"
    for name in ("step_4", "step_6"):
        shutil.copytree(ckpts / name, only_damaged / "checkpoints" / name)
    with pytest.raises(CheckpointError, match="no intact checkpoint in .*step_6 .*step_4 "):
        find_latest_checkpoint(only_damaged)

    # `latest` resumes from step_2 and ends bit for bit where the uninterrupted run ended.
    tag_saved_history(ckpts / "step_2")
    results = main(base_args(small_jsonl_xz, tokenizer_dir, out, *COMMON, "--resume_from_checkpoint", "latest"))
    assert results["train_steps"] == 6
    saved = json.loads((ckpts / "step_2" / "train_history.json").read_text())["log_history"]
    history = json.loads((out / "train_history.json").read_text())["log_history"]
    # steps 1-2 are step_2's saved records (not trained again), 3-6 were trained after the resume
    assert [r["step"] for r in history] == [1, 2, 3, 4, 5, 6] and history[:2] == saved
    assert restored_steps(out) == ([1, 2, 3, 4, 5, 6], [1, 2])  # resumed, not started over
    resumed = load_file(out / "model.safetensors")
    assert all(torch.equal(resumed[k], reference_weights[k]) for k in reference_weights)
    resumed_optimizer = _optimizer_state(ckpts / "step_6")
    for key, state in reference_optimizer["state"].items():
        for name, value in state.items():
            assert torch.equal(resumed_optimizer["state"][key][name], value), (key, name)
    verify_checkpoint(ckpts / "step_6")


@pytest.mark.parametrize(
    "code, kind", [(errno.ENOSPC, "OSError"), (errno.EACCES, "PermissionError")], ids=["disk-full", "permission"]
)
def test_a_failing_save_keeps_the_previous_checkpoint_and_stops(code, kind, tmp_path, small_jsonl_xz, tokenizer_dir,
                                                                monkeypatch, capsys):  # fmt: skip
    """The second checkpoint's optimizer file fails half-way with an OS error (as a full disk would)."""
    real_save, calls = accelerate.checkpointing.save, []

    def failing_save(obj, f, *args, **kwargs):
        if str(f).endswith("optimizer.bin"):
            calls.append(f)
            if len(calls) == 2:
                real_save(obj, f, *args, **kwargs)
                with open(f, "r+b") as handle:
                    handle.truncate(os.path.getsize(f) // 2)
                raise OSError(code, os.strerror(code), str(f))
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(accelerate.checkpointing, "save", failing_save)
    out = tmp_path / "run"
    message = run_main_expecting_error(base_args(small_jsonl_xz, tokenizer_dir, out, *COMMON), capsys)
    tmp_folder = out / "checkpoints" / "step_4.tmp"
    assert message.startswith(
        f"error: cannot write checkpoint {tmp_folder} ({kind}: [Errno {code}] {os.strerror(code)}"
    )
    assert f"{tmp_folder / 'optimizer.bin'}" in message and "MiB free on its disk" in message
    assert message.rstrip().endswith(f"the previous checkpoint, {out / 'checkpoints' / 'step_2'}, is intact")
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_2"]  # the partial save is removed
    verify_checkpoint(out / "checkpoints" / "step_2")
    assert not (out / "model.safetensors").exists()  # the run stopped
    assert find_latest_checkpoint(out) == out / "checkpoints" / "step_2"


@pytest.mark.parametrize("streaming", [False, True], ids=["map-style", "streamed"])
def test_masked_lm_resumes_bit_exactly(streaming, tmp_path, small_jsonl_xz, family_tokenizers):
    """The masks drawn after a resume are the uninterrupted run's: the loop collates each micro-batch (not the
    loader, one batch ahead) and loader iterators do not draw from torch's global RNG."""
    common = ["--objective", "mlm", "--max_train_steps", "6", "--checkpointing_steps", "3", "--learning_rate", "3e-3",
              "--logging_steps", "1", *(["--streaming"] if streaming else [])]  # fmt: skip

    def args(out, *extra):
        argv = base_args(small_jsonl_xz, family_tokenizers["encoder"], out, *common, *extra)
        argv[argv.index("decoder-tiny")] = "encoder-tiny"
        return argv

    main(args(tmp_path / "full"))
    tag_saved_history(tmp_path / "full" / "checkpoints" / "step_3")
    main(args(tmp_path / "resumed", "--resume_from_checkpoint", str(tmp_path / "full" / "checkpoints" / "step_3")))
    assert restored_steps(tmp_path / "resumed") == ([1, 2, 3, 4, 5, 6], [1, 2, 3])  # resumed, not started over
    full, resumed = (
        load_file(tmp_path / "full" / "model.safetensors"),
        load_file(tmp_path / "resumed" / "model.safetensors"),
    )
    assert all(torch.equal(full[k], resumed[k]) for k in full)


def test_a_fresh_run_beside_an_earlier_runs_checkpoints_is_refused_unless_told_to_resume_or_overwrite(
    tmp_path, small_jsonl_xz, tokenizer_dir, caplog, capsys
):
    """Else the new run's checkpoints would sit beside the earlier run's higher steps: rotation would delete its own
    first, and `latest` would continue the other run."""
    out = tmp_path / "run"
    main(base_args(small_jsonl_xz, tokenizer_dir, out, *COMMON))
    ckpts = out / "checkpoints"
    earlier = {p.name: (p / "model.safetensors").read_bytes() for p in ckpts.iterdir()}
    assert sorted(earlier) == ["step_2", "step_4", "step_6"]
    shorter = ["--max_train_steps", "4", "--checkpointing_steps", "2", "--learning_rate", "1e-3"]
    message = run_main_expecting_error(base_args(small_jsonl_xz, tokenizer_dir, out, *shorter), capsys)
    assert message == (
        f"error: --output_dir {out} holds the checkpoints of an earlier run (checkpoints/step_2, checkpoints/step_4, "
        "checkpoints/step_6); give --resume_from_checkpoint latest to continue it, --overwrite_output_dir to delete "
        "them and start over, or another --output_dir"
    )
    # --overwrite_output_dir deletes them only once every check has passed: a run refused later deletes nothing.
    message = run_main_expecting_error(
        base_args(small_jsonl_xz, tokenizer_dir, out, *shorter, "--overwrite_output_dir", "--block_size", "4096"),
        capsys,
    )
    assert "--block_size 4096" in message
    assert {p.name: (p / "model.safetensors").read_bytes() for p in ckpts.iterdir()} == earlier
    with caplog.at_level(logging.WARNING, logger="hfzoo.training.checkpointing"):
        main(base_args(small_jsonl_xz, tokenizer_dir, out, *shorter, "--overwrite_output_dir"))
    assert f"--overwrite_output_dir: deleting the earlier run's 3 checkpoint(s) in {ckpts}" in caplog.messages
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_2", "step_4"]  # this run's, with its settings
    for step in (2, 4):
        state = json.loads((ckpts / f"step_{step}" / "training_state.json").read_text())
        assert (state["step"], state["max_train_steps"], state["optimizer_arguments"]["learning_rate"]) == (
            step,
            4,
            1e-3,
        )
    # --resume_from_checkpoint latest continues this run, beside its own checkpoints.
    with caplog.at_level(logging.INFO, logger="hfzoo.pretraining.loop"):
        main(base_args(small_jsonl_xz, tokenizer_dir, out, *shorter[2:], "--max_train_steps", "6",
                       "--resume_from_checkpoint", "latest"))  # fmt: skip
    assert any(m.endswith(f"Resumed from {ckpts / 'step_4'} at step 4") for m in caplog.messages)
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_4", "step_6"]


def test_saving_does_not_warn_about_the_models_declared_ties_but_about_other_shared_tensors(tmp_path, caplog):
    """accelerate logs "Removed shared tensor ..." for every shared tensor; the declared input/output tie is expected."""
    from accelerate import Accelerator
    from helpers.pretraining import TINY_OVERRIDES
    from transformers import AutoModelForCausalLM

    from hfzoo.models.presets import build_config
    from hfzoo.training.checkpointing import save_accelerator_state

    def shared_tensor_warnings(model, folder) -> list[str]:
        accelerator = Accelerator(cpu=True)
        prepared = accelerator.prepare(model)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            save_accelerator_state(accelerator, prepared, tmp_path / folder)
        assert (tmp_path / folder / "model.safetensors").is_file()
        return [r.getMessage() for r in caplog.records if "shared tensor" in r.getMessage()]

    config = build_config("decoder-tiny", TINY_OVERRIDES + ",vocab_size=64")
    tied = AutoModelForCausalLM.from_config(config)
    assert tied.config.tie_word_embeddings and tied.lm_head.weight is tied.model.embed_tokens.weight
    assert shared_tensor_warnings(tied, "tied") == []
    undeclared = AutoModelForCausalLM.from_config(config)
    undeclared.model.layers[1].mlp.down_proj.weight = undeclared.model.layers[0].mlp.down_proj.weight
    (warning,) = shared_tensor_warnings(undeclared, "undeclared")
    assert "model.layers.1.mlp.down_proj.weight" in warning
