"""`--optim muon` in the pretraining recipe: the flags reach torch's Muon, a run learns and resumes exactly."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
from helpers.launch import GLOBAL_BATCH, STEPS, check_two_processes, launch, launch_command, launch_env, recipe_args
from helpers.pretraining import base_args, restored_steps, run_main_expecting_error, tag_saved_history
from safetensors.torch import load_file

from hfzoo.pretraining.arguments import parse_pretrain_args
from hfzoo.pretraining.loop import main, prepare
from hfzoo.training.optimization import MuonWithAdamW

MUON = ["--optim", "muon", "--muon_learning_rate", "0.03", "--muon_momentum", "0.9", "--muon_weight_decay", "0.01",
        "--muon_ns_steps", "4", "--muon_adjust_lr_fn", "match_rms_adamw"]  # fmt: skip


def test_flags_build_muon_for_the_hidden_matrices_and_adamw_for_the_rest(small_jsonl_xz, tokenizer_dir, tmp_path):
    run = prepare(parse_pretrain_args(base_args(small_jsonl_xz, tokenizer_dir, tmp_path / "out", *MUON,
                                                "--learning_rate", "2e-3", "--weight_decay", "0.1")))  # fmt: skip
    optimizer = run.optimizer.optimizer  # accelerate's wrapper holds ours
    assert isinstance(optimizer, MuonWithAdamW)
    (muon,) = optimizer.muon.param_groups
    assert {k: muon[k] for k in ("initial_lr", "momentum", "weight_decay", "ns_steps", "adjust_lr_fn", "nesterov")} == {
        "initial_lr": 0.03, "momentum": 0.9, "weight_decay": 0.01, "ns_steps": 4, "adjust_lr_fn": "match_rms_adamw",
        "nesterov": True,
    }  # fmt: skip
    decay, exempt = optimizer.adamw.param_groups
    assert (decay["initial_lr"], decay["weight_decay"], exempt["weight_decay"]) == (2e-3, 0.1, 0.0)
    model = run.accelerator.unwrap_model(run.model)
    assert len(muon["params"]) == 2 * 6  # q, k, v, o, up, down of the 2 layers
    assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(model.parameters()))
    # Without the flags, Muon's defaults (Jordan et al.'s post: lr 0.02, momentum 0.95, 5 steps).
    run = prepare(parse_pretrain_args(base_args(small_jsonl_xz, tokenizer_dir, tmp_path / "out2", "--optim", "muon")))
    (muon,) = run.optimizer.optimizer.muon.param_groups
    assert (muon["initial_lr"], muon["momentum"], muon["ns_steps"], muon["adjust_lr_fn"]) == (0.02, 0.95, 5, "original")


@pytest.mark.parametrize(
    "extra, expected",
    [
        (["--optim", "muon", "--muon_momentum", "1"], "--muon_momentum must be in [0, 1), got 1.0"),
        (["--optim", "muon", "--muon_momentum", "-0.1"], "--muon_momentum must be in [0, 1), got -0.1"),
        (
            ["--optim", "muon", "--muon_learning_rate", "0"],
            "--muon_learning_rate: must be a finite number > 0, got 0.0",
        ),
        (
            ["--optim", "muon", "--muon_weight_decay", "-1"],
            "--muon_weight_decay: must be a finite number >= 0, got -1.0",
        ),
        (["--optim", "muon", "--muon_ns_steps", "0"], "--muon_ns_steps: must be a positive integer, got 0"),
        (["--optim", "muon", "--muon_ns_steps", "100"], "--muon_ns_steps must be at most 99, got 100"),
        (["--optim", "muon", "--muon_adjust_lr_fn", "rms"], "--muon_adjust_lr_fn: invalid choice: 'rms'"),
        (["--optim", "lion"], "--optim: invalid choice: 'lion'"),
        (["--muon_momentum", "0.9"], "--muon_momentum 0.9 needs --optim muon (got --optim adamw_torch_fused)"),
    ],
    ids=["momentum-1", "momentum-negative", "lr-0", "decay-negative", "ns-0", "ns-100", "adjust", "optim", "no-muon"],
)
def test_bad_muon_flags_are_refused_at_parse_time(extra, expected, small_jsonl_xz, tokenizer_dir, tmp_path, capsys):
    message = run_main_expecting_error(base_args(small_jsonl_xz, tokenizer_dir, tmp_path / "out", *extra), capsys)
    assert expected in message
    assert not (tmp_path / "out").exists()  # refused before any work


def test_a_yaml_config_sets_muon_like_the_flags(small_jsonl_xz, tokenizer_dir, tmp_path, capsys):
    config = tmp_path / "muon.yaml"
    config.write_text("optim: muon\nmuon_momentum: 0.8\n")
    args = parse_pretrain_args(["--config", str(config), *base_args(small_jsonl_xz, tokenizer_dir, tmp_path / "o")])
    assert (args.optim, args.muon_momentum) == ("muon", 0.8)
    config.write_text("optim: muon\nmuon_momentum: 1.5\n")
    argv = ["--config", str(config), *base_args(small_jsonl_xz, tokenizer_dir, tmp_path / "o")]
    assert "--muon_momentum must be in [0, 1), got 1.5" in run_main_expecting_error(argv, capsys)


@pytest.mark.slow
def test_muon_run_learns_and_resumes_exactly(tmp_path, small_jsonl_xz, tokenizer_dir):
    common = ["--optim", "muon", "--max_train_steps", "16", "--checkpointing_steps", "8", "--learning_rate", "3e-3",
              "--num_warmup_steps", "2", "--weight_decay", "0.01", "--muon_weight_decay", "0.01",
              "--logging_steps", "4"]  # fmt: skip
    full = tmp_path / "full"
    results = main(base_args(small_jsonl_xz, tokenizer_dir, full, *common))
    assert results["eval_loss"] < results["init_eval_loss"] - 0.25  # 6.23 (uniform over 512 tokens) -> 5.86
    history = json.loads((full / "train_history.json").read_text())["log_history"]
    train_losses = [r["train_loss"] for r in history if "train_loss" in r]
    assert train_losses[-1] < train_losses[0] - 0.1
    # The checkpoint holds Muon's momentum buffers beside AdamW's moments (accelerate's save_state).
    state = torch.load(full / "checkpoints" / "step_8" / "optimizer.bin", weights_only=True)
    assert set(state) == {"adamw", "muon"}
    assert len(state["muon"]["state"]) == 2 * 6 and all("momentum_buffer" in s for s in state["muon"]["state"].values())
    resumed = tmp_path / "resumed"
    tag_saved_history(full / "checkpoints" / "step_8")
    resumed_results = main(base_args(small_jsonl_xz, tokenizer_dir, resumed, *common,
                                     "--resume_from_checkpoint", str(full / "checkpoints" / "step_8")))  # fmt: skip
    a, b = load_file(full / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=0, msg=name)  # bit for bit
    assert resumed_results["eval_loss"] == results["eval_loss"]
    # it really resumed: steps 4 and 8 are the checkpoint's records, 12 and 16 trained, none twice
    assert restored_steps(resumed) == ([4, 8, 12, 16], [4, 8])


@pytest.mark.slow
def test_ddp_two_processes_match_one_process_and_deepspeed_is_refused(tmp_path, small_jsonl_xz, tokenizer_dir):
    """Under DDP every process holds whole matrices and the averaged gradient, so Muon steps as in one process."""
    single = tmp_path / "single"
    main(recipe_args(small_jsonl_xz, tokenizer_dir, single, GLOBAL_BATCH, "--optim", "muon"))
    log = launch("ddp.yaml", recipe_args(small_jsonl_xz, tokenizer_dir, "run", GLOBAL_BATCH // 2, "--optim", "muon"),
                 tmp_path)  # fmt: skip
    check_two_processes(log, "MULTI_CPU")
    want, got = (
        {r["step"]: r["train_loss"] for r in json.loads((d / "train_history.json").read_text())["log_history"]}
        for d in (single, tmp_path / "run")
    )
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
    for step in want:
        assert got[step] == pytest.approx(want[step], rel=1e-3), f"step {step}"
    argv = recipe_args(small_jsonl_xz, tokenizer_dir, "zero", GLOBAL_BATCH // 2, "--optim", "muon")
    proc = subprocess.run(launch_command("deepspeed_zero2.yaml", argv), cwd=tmp_path, env=launch_env(),
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode != 0
    assert "--optim muon is not supported under DEEPSPEED" in proc.stderr
