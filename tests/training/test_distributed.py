"""Distributed pretraining on real Gutenberg text: 2-process DDP / DeepSpeed ZeRO-2 / ZeRO-3 launched with
`accelerate launch --config_file accelerate_configs/...` on the CPU (gloo), against a single-process run;
crash (SIGKILL) and resume; ZeRO-3 weight consolidation; global-batch loss normalisation; bad input.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from helpers.launch import GLOBAL_BATCH, STEPS, check_two_processes, launch, launch_command, launch_env, recipe_args
from helpers.pretraining import restored_steps, tag_saved_history
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from hfzoo.pretraining import loop as pretraining
from hfzoo.pretraining.arguments import parse_pretrain_args
from hfzoo.pretraining.loop import main
from hfzoo.training import accelerator as accelerator_module
from hfzoo.training.accelerator import reconcile_deepspeed_config
from hfzoo.training.checkpointing import TRAINING_STATE, base_model_record, find_latest_checkpoint

REPO_ROOT = Path(__file__).resolve().parents[2]
TINY_OVERRIDES = (
    "hidden_size=32,num_hidden_layers=2,num_attention_heads=2,intermediate_size=64,max_position_embeddings=64"
)


def losses(output_dir: Path) -> dict[int, float]:
    history = json.loads((output_dir / "train_history.json").read_text())["log_history"]
    return {r["step"]: r["train_loss"] for r in history}


@pytest.fixture(scope="module")
def single_process_run(tmp_path_factory, small_jsonl_xz, tokenizer_dir):
    out = tmp_path_factory.mktemp("single") / "run"
    main(recipe_args(small_jsonl_xz, tokenizer_dir, out, GLOBAL_BATCH))
    return out


@pytest.fixture(scope="module")
def zero2_run(tmp_path_factory, small_jsonl_xz, tokenizer_dir):
    """An uninterrupted 2-process ZeRO-2 run (also the reference of the crash/resume test)."""
    cwd = tmp_path_factory.mktemp("zero2")
    log = launch("deepspeed_zero2.yaml", recipe_args(small_jsonl_xz, tokenizer_dir, "run", GLOBAL_BATCH // 2), cwd)
    return cwd / "run", log


def assert_same_losses(run: Path, reference: Path, rel: float) -> None:
    got, want = losses(run), losses(reference)
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
    for step in want:
        assert got[step] == pytest.approx(want[step], rel=rel), f"step {step}"


@pytest.mark.slow
@pytest.mark.distributed
def test_ddp_two_processes_match_single_process_and_log_to_tensorboard(
    tmp_path, small_jsonl_xz, tokenizer_dir, single_process_run
):
    argv = recipe_args(small_jsonl_xz, tokenizer_dir, "run", GLOBAL_BATCH // 2, "--with_tracking")
    log = launch("ddp.yaml", argv, tmp_path)
    check_two_processes(log, "MULTI_CPU")
    assert_same_losses(tmp_path / "run", single_process_run, rel=1e-3)

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars = set()
    for events in {p.parent for p in (tmp_path / "run").rglob("events.out.tfevents.*")}:
        scalars |= set(EventAccumulator(str(events)).Reload().Tags()["scalars"])
    for tag in ("train_loss", "learning_rate", "grad_norm", "tokens_per_second", "tokens_seen"):
        assert tag in scalars, scalars


@pytest.mark.slow
@pytest.mark.distributed
def test_zero2_two_processes_match_single_process(zero2_run, single_process_run):
    out, log = zero2_run
    check_two_processes(log, "DEEPSPEED")
    assert_same_losses(out, single_process_run, rel=1e-3)


@pytest.mark.slow
@pytest.mark.distributed
def test_zero3_matches_single_process_and_consolidates(tmp_path, small_jsonl_xz, tokenizer_dir, single_process_run):
    from hfzoo.pretraining.consolidate import consolidate_checkpoint

    argv = recipe_args(small_jsonl_xz, tokenizer_dir, "run", GLOBAL_BATCH // 2, "--checkpointing_steps", str(STEPS))
    log = launch("deepspeed_zero3.yaml", argv, tmp_path)
    check_two_processes(log, "DEEPSPEED")
    out = tmp_path / "run"
    assert_same_losses(out, single_process_run, rel=1e-3)

    # The consolidated fp32 weights of the final ZeRO-3 checkpoint equal the parameters gathered at the end.
    consolidated = consolidate_checkpoint(out / "checkpoints" / f"step_{STEPS}", tmp_path / "consolidated")
    gathered, saved = load_file(out / "model.safetensors"), load_file(consolidated / "model.safetensors")
    assert gathered.keys() == saved.keys()
    for name in gathered:
        assert gathered[name].numel() > 0 and torch.equal(gathered[name], saved[name]), name

    # Loaded by AutoModelForCausalLM.from_pretrained in this process (no DeepSpeed): the same validation loss.
    argv = recipe_args(small_jsonl_xz, tokenizer_dir, tmp_path / "reloaded", GLOBAL_BATCH, "--max_train_steps", "1")
    argv[argv.index("--config_name") : argv.index("--config_overrides") + 2] = []
    results = main([*argv, "--model_name_or_path", str(consolidated)])
    engine_loss = json.loads((out / "all_results.json").read_text())["eval_loss"]
    assert results["init_eval_loss"] == pytest.approx(engine_loss, rel=1e-5)


@pytest.mark.slow
@pytest.mark.distributed
def test_zero3_partitioning_at_load_records_the_base_model_whole(
    tmp_path, small_jsonl_xz, tokenizer_dir, single_process_run
):
    """With `zero3_init_flag: true` each process loads only its partition of --model_name_or_path; the checkpoints
    record the base as one process that loaded it whole does, so that a resume under any engine checks it."""
    config = (REPO_ROOT / "accelerate_configs" / "deepspeed_zero3.yaml").read_text()
    (tmp_path / "zero3_init.yaml").write_text(config.replace("zero3_init_flag: false", "zero3_init_flag: true"))
    argv = recipe_args(small_jsonl_xz, tokenizer_dir, "run", GLOBAL_BATCH // 2, "--checkpointing_steps", "1")
    argv[argv.index("--config_name") : argv.index("--config_overrides") + 2] = []
    argv[argv.index("--max_train_steps") + 1] = "1"
    launch(str(tmp_path / "zero3_init.yaml"), [*argv, "--model_name_or_path", str(single_process_run)], tmp_path)

    state = json.loads((tmp_path / "run" / "checkpoints" / "step_1" / TRAINING_STATE).read_text())
    whole = AutoModelForCausalLM.from_pretrained(single_process_run)
    expected = base_model_record(
        str(single_process_run), whole, AutoConfig.from_pretrained(single_process_run),
        AutoTokenizer.from_pretrained(tokenizer_dir),
    )  # fmt: skip
    assert state["base_model"] == json.loads(json.dumps(expected))  # as JSON writes it (id2label's keys: strings)


@pytest.mark.slow
@pytest.mark.distributed
def test_zero2_sigkill_mid_training_then_resume_reproduces_the_uninterrupted_losses(
    tmp_path, small_jsonl_xz, tokenizer_dir, zero2_run
):
    reference, _ = zero2_run
    argv = recipe_args(small_jsonl_xz, tokenizer_dir, "run", GLOBAL_BATCH // 2, "--checkpointing_steps", "4")
    proc = subprocess.Popen(
        launch_command("deepspeed_zero2.yaml", argv),
        cwd=tmp_path,
        env=launch_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    out = tmp_path / "run"
    deadline = time.monotonic() + 300
    while not (out / "checkpoints" / "step_4" / "training_state.json").is_file():
        assert proc.poll() is None and time.monotonic() < deadline, "the run ended before its first checkpoint"
        time.sleep(0.01)
    # SIGKILL the launcher and both training processes (torchrun may start them in their own groups).
    launcher = psutil.Process(proc.pid)
    for process in [*launcher.children(recursive=True), launcher]:
        process.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert not (out / "all_results.json").exists(), "the run finished before it was killed"
    latest = find_latest_checkpoint(out)
    resumed_at = int(latest.name.split("_")[1])
    assert 4 <= resumed_at < STEPS

    log = launch("deepspeed_zero2.yaml", [*argv, "--resume_from_checkpoint", "latest"], tmp_path)
    assert f"at step {resumed_at}" in log  # resumed, not restarted
    got, want = losses(out), losses(reference)
    assert sorted(got) == list(range(1, STEPS + 1))  # the history before the resume is kept
    for step in got:
        assert got[step] == pytest.approx(want[step], abs=1e-6), f"step {step}"
    final = [json.loads((d / "all_results.json").read_text())["eval_loss"] for d in (out, reference)]
    assert final[0] == pytest.approx(final[1], abs=1e-6)


@pytest.mark.slow
def test_kill_while_writing_a_checkpoint_leaves_the_previous_one_loadable(
    tmp_path, small_jsonl_xz, tokenizer_dir, single_process_run
):
    out = tmp_path / "run"
    argv = recipe_args(small_jsonl_xz, tokenizer_dir, out, GLOBAL_BATCH, "--checkpointing_steps", "4")
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tests" / "helpers" / "kill_during_save.py"), *argv],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    assert (out / "checkpoints" / "step_8.tmp").is_dir()  # the torn save
    assert find_latest_checkpoint(out) == out / "checkpoints" / "step_4"
    tag_saved_history(out / "checkpoints" / "step_4")
    results = main([*argv, "--resume_from_checkpoint", "latest"])
    # Resumed from step_4, not started over (which, with the same seed, would give the same losses and weights).
    assert restored_steps(out) == (list(range(1, STEPS + 1)), [1, 2, 3, 4])
    got, want = losses(out), losses(single_process_run)
    assert sorted(got) == list(range(1, STEPS + 1))  # steps 1-4 from the checkpoint, 5-16 resumed
    for step in got:
        assert got[step] == pytest.approx(want[step], abs=1e-6), f"step {step}"
    reference = json.loads((single_process_run / "all_results.json").read_text())["eval_loss"]
    assert results["eval_loss"] == pytest.approx(reference, abs=1e-6)
    assert not (out / "checkpoints" / "step_8.tmp").exists()  # replaced by the complete step_8


def _padded_batch(lengths: list[int], seq_len: int = 12, vocab: int = 64) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(sum(lengths))
    input_ids = torch.randint(4, vocab, (len(lengths), seq_len), generator=generator)
    attention_mask = (torch.arange(seq_len)[None, :] < torch.tensor(lengths)[:, None]).long()
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def _tiny_model():
    from transformers import AutoModelForCausalLM

    from hfzoo.models.presets import build_config

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(build_config("decoder-tiny", TINY_OVERRIDES + ",vocab_size=64"))


def _one_optimizer_step(micro_batches: list[dict[str, torch.Tensor]]):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState
    from accelerate.utils import GradientAccumulationPlugin

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    accelerator = Accelerator(
        cpu=True,
        gradient_accumulation_plugin=GradientAccumulationPlugin(
            num_steps=len(micro_batches), sync_with_dataloader=False
        ),
    )
    model = _tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)  # the update is the gradient itself
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    loss, grad_norm = pretraining.accumulation_step(
        accelerator, model, optimizer, scheduler, micro_batches, "clm", max_grad_norm=0.0
    )
    return float(loss), grad_norm, {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_accumulation_4x2_equals_batch_8_with_padding():
    lengths = [12, 3, 7, 12, 2, 9, 12, 5]  # very different token counts per micro-batch
    full = _padded_batch(lengths)
    micro = [{k: v[i : i + 2] for k, v in full.items()} for i in range(0, 8, 2)]
    loss_a, norm_a, weights_a = _one_optimizer_step(micro)
    loss_b, norm_b, weights_b = _one_optimizer_step([full])
    assert loss_a == pytest.approx(loss_b, rel=1e-5)
    assert norm_a == pytest.approx(norm_b, rel=1e-5)
    for name in weights_b:
        torch.testing.assert_close(weights_a[name], weights_b[name], rtol=0, atol=1e-5, msg=name)
    # The check can fail: averaging the micro-batch means (no global normalisation) gives another loss.
    model = _tiny_model()
    with torch.no_grad():
        naive = sum(float(model(**batch).loss) for batch in micro) / len(micro)
    assert abs(naive - loss_b) > 1e-3


def test_deepspeed_auto_values_are_filled_from_the_recipe(tmp_path):
    args = parse_pretrain_args(
        ["--train_file", "x", "--config_name", "decoder-tiny", "--tokenizer_name", "t", "--output_dir", str(tmp_path),
         "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "3", "--max_grad_norm", "0.5"]
    )  # fmt: skip
    ds = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"}
    reconcile_deepspeed_config(ds, args, num_processes=2)
    assert ds == {
        "train_batch_size": 24,
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 3,
        "gradient_clipping": 0.5,
        "zero_optimization": {"reduce_bucket_size": "auto"},  # sized from hidden_size by accelerate
    }


@pytest.mark.parametrize(
    "ds, expected",
    [
        ({"train_micro_batch_size_per_gpu": 16}, "train_micro_batch_size_per_gpu=16, which contradicts "
         "--per_device_train_batch_size 4"),
        ({"gradient_accumulation_steps": 2}, "gradient_accumulation_steps=2, which contradicts "
         "--gradient_accumulation_steps 1"),
        ({"train_batch_size": 64}, "train_batch_size=64, which contradicts 2 processes x 4 per device x 1"),
        ({"gradient_clipping": 5.0}, "gradient_clipping=5.0, which contradicts --max_grad_norm 1.0"),
        ({"bf16": {"enabled": True}}, "enables bf16, which contradicts --mixed_precision no"),
    ],
    ids=["micro-batch", "accumulation", "global-batch", "clipping", "precision"],
)  # fmt: skip
def test_deepspeed_config_contradicting_the_recipe_is_refused(ds, expected, tmp_path):
    args = parse_pretrain_args(
        ["--train_file", "x", "--config_name", "decoder-tiny", "--tokenizer_name", "t", "--output_dir", str(tmp_path),
         "--per_device_train_batch_size", "4", "--mixed_precision", "no"]
    )  # fmt: skip
    with pytest.raises(ValueError) as err:
        reconcile_deepspeed_config(ds, args, num_processes=2)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_a_multi_process_launch_that_runs_alone_is_refused(tmp_path, monkeypatch):
    """A launcher that started 2 processes, but an Accelerator that sees only itself (world size 1)."""
    real_accelerator = accelerator_module.Accelerator

    def alone(**kwargs):
        with monkeypatch.context() as m:
            m.delenv("WORLD_SIZE")
            return real_accelerator(**kwargs)

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(accelerator_module, "Accelerator", alone)
    args = parse_pretrain_args(
        ["--train_file", "x", "--config_name", "decoder-tiny", "--tokenizer_name", "t", "--output_dir", str(tmp_path)]
    )
    with pytest.raises(ValueError, match=r"started WORLD_SIZE=2 processes but this one runs alone"):
        accelerator_module.create_accelerator(args)


def test_fp16_on_cpu_and_resume_of_another_model_config_fail_before_training(
    tmp_path, small_jsonl_xz, tokenizer_dir, capsys
):
    if torch.cuda.is_available():
        pytest.skip("fp16 is valid on a GPU")
    argv = recipe_args(small_jsonl_xz, tokenizer_dir, tmp_path / "a", GLOBAL_BATCH, "--mixed_precision", "fp16")
    with pytest.raises(SystemExit, match="--mixed_precision fp16 needs a GPU; on CPU use bf16 or no"):
        main(argv)

    short = ["--max_train_steps", "2", "--checkpointing_steps", "2"]
    main([*recipe_args(small_jsonl_xz, tokenizer_dir, tmp_path / "a", GLOBAL_BATCH), *short])
    other = recipe_args(small_jsonl_xz, tokenizer_dir, tmp_path / "b", GLOBAL_BATCH)
    other[other.index(TINY_OVERRIDES)] = TINY_OVERRIDES.replace("hidden_size=32", "hidden_size=48")
    with pytest.raises(SystemExit) as exc:
        main([*other, "--resume_from_checkpoint", str(tmp_path / "a" / "checkpoints" / "step_2")])
    message = str(exc.value.code)
    assert "saved with a different model config (" in message and "hidden_size=32 there, 48 here" in message
    assert "\n" not in message and not (tmp_path / "b" / "model.safetensors").exists()


@pytest.mark.slow
@pytest.mark.distributed
def test_lora_adapter_and_full_weights_saved_from_zero3_are_complete(tmp_path):
    pytest.importorskip("peft")
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--config_file", str(REPO_ROOT / "accelerate_configs" / "deepspeed_zero3.yaml"),
        str(REPO_ROOT / "tests" / "helpers" / "zero3_lora_check.py"), str(tmp_path),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, env=launch_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    checks = json.loads(proc.stdout.strip().splitlines()[-1])
    assert checks["adapter_tensors"] == checks["lora_parameters"] == 8  # q_proj, v_proj x A, B x 2 layers
    assert checks["adapter_min_numel"] > 0 and checks["adapter_equal"] and checks["lora_B_trained"]
    assert checks["full_tensors"] >= checks["full_parameters"] and checks["full_min_numel"] > 0
    assert checks["full_equal"]
