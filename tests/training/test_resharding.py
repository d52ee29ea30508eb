"""FSDP2 pretraining, and resuming a checkpoint with another number of processes (2 -> 1, 1 -> 2) under DeepSpeed
ZeRO-2 / ZeRO-3 (universal checkpoint) and FSDP2 (`torch.distributed.checkpoint`), on the CPU over gloo, against
uninterrupted runs with the same global batch; and the combinations that are refused before any work.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from accelerate.utils import DistributedType
from helpers.launch import GLOBAL_BATCH, STEPS, check_two_processes, launch, recipe_args
from helpers.pretraining import TINY_OVERRIDES
from transformers import AutoModelForCausalLM

from hfzoo.pretraining.consolidate import consolidate_checkpoint
from hfzoo.pretraining.loop import main
from hfzoo.training.accelerator import _enable_fsdp_on_cpu
from hfzoo.training.checkpointing import TRAINING_STATE, UNIVERSAL_DIR, _check_resume_topology, write_manifest

HALF = STEPS // 2
ENGINES = ["deepspeed_zero2.yaml", "deepspeed_zero3.yaml", "fsdp2.yaml"]


def losses(output_dir: Path) -> dict[int, float]:
    history = json.loads((output_dir / "train_history.json").read_text())["log_history"]
    return {r["step"]: r["train_loss"] for r in history}


@pytest.fixture(scope="module")
def engine_run(tmp_path_factory, small_jsonl_xz, tokenizer_dir):
    """`engine_run(config, processes)`: an uninterrupted run (cached) with a checkpoint at step STEPS/2 -> (out, log)."""
    runs = {}

    def run(config: str, processes: int) -> tuple[Path, str]:
        if (config, processes) not in runs:
            cwd = tmp_path_factory.mktemp(f"{Path(config).stem}-{processes}")
            argv = recipe_args(small_jsonl_xz, tokenizer_dir, "run", GLOBAL_BATCH // processes,
                               "--checkpointing_steps", str(HALF))  # fmt: skip
            runs[config, processes] = cwd / "run", launch(config, argv, cwd, num_processes=processes)
        return runs[config, processes]

    return run


@pytest.fixture(scope="module")
def single_process_run(tmp_path_factory, small_jsonl_xz, tokenizer_dir):
    out = tmp_path_factory.mktemp("single") / "run"
    main(recipe_args(small_jsonl_xz, tokenizer_dir, out, GLOBAL_BATCH))
    return out


@pytest.mark.slow
@pytest.mark.distributed
def test_fsdp2_two_processes_match_single_process_and_save_a_loadable_model(
    engine_run, single_process_run, small_jsonl_xz, tokenizer_dir, tmp_path
):
    out, log = engine_run("fsdp2.yaml", 2)
    check_two_processes(log, "FSDP")
    got, want = losses(out), losses(single_process_run)
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
    for step in want:
        assert got[step] == pytest.approx(want[step], rel=1e-3), f"step {step}"
    # The checkpoint is sharded (torch.distributed.checkpoint); the final folder is a whole save_pretrained one.
    assert (out / "checkpoints" / f"step_{HALF}" / "pytorch_model_fsdp_0" / ".metadata").is_file()
    sharded = AutoModelForCausalLM.from_pretrained(out).state_dict()
    whole = AutoModelForCausalLM.from_pretrained(single_process_run).state_dict()
    assert sharded.keys() == whole.keys()
    for name in whole:
        torch.testing.assert_close(sharded[name], whole[name], rtol=0, atol=1e-4, msg=name)
    # recipes/consolidate_checkpoint.py merges the sharded final checkpoint into the same weights.
    merged = consolidate_checkpoint(out / "checkpoints" / f"step_{STEPS}", tmp_path / "merged")
    final = AutoModelForCausalLM.from_pretrained(merged).state_dict()
    assert all(torch.equal(final[name], sharded[name]) for name in sharded)
    argv = recipe_args(small_jsonl_xz, tokenizer_dir, tmp_path / "reloaded", GLOBAL_BATCH, "--max_train_steps", "1")
    argv[argv.index("--config_name") : argv.index("--config_overrides") + 2] = []
    results = main([*argv, "--model_name_or_path", str(out)])
    engine_loss = json.loads((out / "all_results.json").read_text())["eval_loss"]
    assert results["init_eval_loss"] == pytest.approx(engine_loss, rel=1e-5)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("variant", ["layer_type=evolved_transformer", "layer_stack=universal,num_recurrent_steps=2"],
                         ids=["evolved-layers", "universal-one-unit"])  # fmt: skip
def test_fsdp2_variants_match_single_process(variant, tmp_path, small_jsonl_xz, tokenizer_dir):
    """The Evolved Transformer's cells as units, and a Universal Transformer (tied steps) as one unit."""

    def argv(output_dir, per_device):
        args = recipe_args(small_jsonl_xz, tokenizer_dir, output_dir, per_device, "--max_train_steps", "6")
        args[args.index(TINY_OVERRIDES)] = f"{TINY_OVERRIDES},{variant}"
        return args

    check_two_processes(launch("fsdp2.yaml", argv("sharded", GLOBAL_BATCH // 2), tmp_path), "FSDP")
    main(argv(tmp_path / "single", GLOBAL_BATCH))
    got, want = losses(tmp_path / "sharded"), losses(tmp_path / "single")
    assert sorted(got) == sorted(want) == list(range(1, 7))
    for step in want:
        assert got[step] == pytest.approx(want[step], rel=1e-5), f"step {step}"


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("saved, resumed", [(2, 1), (1, 2)], ids=["2to1", "1to2"])
@pytest.mark.parametrize("config", ENGINES, ids=[Path(c).stem for c in ENGINES])
def test_resume_on_another_number_of_processes_continues_the_uninterrupted_run(
    engine_run, config, saved, resumed, tmp_path, small_jsonl_xz, tokenizer_dir
):
    source, _ = engine_run(config, saved)
    reference, _ = engine_run(config, resumed)
    checkpoint = source / "checkpoints" / f"step_{HALF}"
    argv = recipe_args(small_jsonl_xz, tokenizer_dir, "run", GLOBAL_BATCH // resumed,
                       "--resume_from_checkpoint", str(checkpoint))  # fmt: skip
    log = launch(config, argv, tmp_path, num_processes=resumed)
    assert f"resharded {checkpoint} from {saved} to {resumed} process(es)" in log
    assert not (tmp_path / "run" / UNIVERSAL_DIR).exists()  # the converted DeepSpeed checkpoint is removed
    got, want, kept = losses(tmp_path / "run"), losses(reference), losses(source)
    # The history keeps the checkpoint's records of steps 1..HALF (the source run's, not trained again) ...
    assert sorted(got) == list(range(1, STEPS + 1)) and all(got[step] == kept[step] for step in range(1, HALF + 1))
    # ... and continues at the step, and with it the data position. The first step after the resume checks
    # weights, data and learning rate; the later ones the optimizer state. 1e-5: a ZeRO-3 universal load whose
    # parameter groups shared one Adam step counter drifted by 2e-4 within 8 steps.
    for step in range(HALF + 1, STEPS + 1):
        assert got[step] == pytest.approx(want[step], rel=1e-5), f"step {step}"
    final = [json.loads((d / "all_results.json").read_text())["eval_loss"] for d in (tmp_path / "run", reference)]
    assert final[0] == pytest.approx(final[1], rel=1e-5)


def _checkpoint(tmp_path: Path, **state) -> Path:
    folder = tmp_path / "step_2"
    folder.mkdir()
    (folder / TRAINING_STATE).write_text(json.dumps({"step": 2, **state}))
    return folder


def _accelerator(distributed_type: DistributedType, processes: int, zero_stage: int | None = None):
    plugin = SimpleNamespace(zero_stage=zero_stage)
    return SimpleNamespace(distributed_type=distributed_type, num_processes=processes,
                           state=SimpleNamespace(deepspeed_plugin=plugin))  # fmt: skip


def _args(per_device: int, accumulation: int = 1, streaming: bool = False):
    return SimpleNamespace(per_device_train_batch_size=per_device, gradient_accumulation_steps=accumulation,
                           streaming=streaming)  # fmt: skip


ZERO3_2 = {"num_processes": 2, "distributed_type": "DEEPSPEED", "zero_stage": 3, "global_batch": 8}
FSDP_2 = {"num_processes": 2, "distributed_type": "FSDP", "zero_stage": None, "global_batch": 8}


@pytest.mark.parametrize(
    "saved, run, args, expected",
    [
        (ZERO3_2, (DistributedType.FSDP, 1), _args(8), "written by 2 process(es) with DeepSpeed ZeRO-3, global batch "
         "8; this run has 1 process(es) with FSDP, global batch 8: a checkpoint cannot change its engine"),
        (FSDP_2, (DistributedType.MULTI_CPU, 2), _args(4), "this run has 2 process(es) with DDP / one process, "
         "global batch 8: a checkpoint cannot change its engine"),
        (ZERO3_2, (DistributedType.DEEPSPEED, 2, 2), _args(4), "cannot change its ZeRO stage"),
        (ZERO3_2, (DistributedType.DEEPSPEED, 1, 3), _args(4), "the global batch must stay 8 (set "
         "--per_device_train_batch_size 8 with --gradient_accumulation_steps 1 or --per_device_train_batch_size 4 "
         "with --gradient_accumulation_steps 2)"),
        (FSDP_2, (DistributedType.FSDP, 3), _args(2), "the global batch must stay 8 (no batch settings give 8 "
         "sequences over 3 processes: resume with 1, 2, 4 or 8 processes)"),
        (FSDP_2, (DistributedType.FSDP, 4), _args(2, 2), "the global batch must stay 8 (set "
         "--per_device_train_batch_size 1 with --gradient_accumulation_steps 2 or --per_device_train_batch_size 2 "
         "with --gradient_accumulation_steps 1)"),
        (FSDP_2, (DistributedType.FSDP, 2), _args(8), "this run has 2 process(es) with FSDP, global batch 16: the "
         "data position is the step count, so the global batch must stay 8 (set --per_device_train_batch_size 4 "
         "with --gradient_accumulation_steps 1 or --per_device_train_batch_size 2 with --gradient_accumulation_steps "
         "2)"),
        ({**FSDP_2, "global_batch": None}, (DistributedType.FSDP, 1), _args(8), "it does not record its global batch"),
        (FSDP_2, (DistributedType.FSDP, 1), _args(8, streaming=True), "a streaming run's data position is per process"),
    ],
    ids=["engine", "engine-to-ddp", "zero-stage", "global-batch", "no-batch-fits", "accumulation-kept",
         "same-processes-other-batch", "older-checkpoint", "streaming"],
)  # fmt: skip
def test_a_checkpoint_that_cannot_be_resharded_is_refused_in_one_line(saved, run, args, expected, tmp_path):
    with pytest.raises(ValueError) as err:
        _check_resume_topology(_checkpoint(tmp_path, **saved), _accelerator(*run), args)
    message = str(err.value)
    assert expected in message and "\n" not in message
    assert "consolidate" in message or "stage" in message or "global batch must" in message  # the way out


def test_a_checkpoint_that_can_be_resharded_reports_its_world(tmp_path):
    checkpoint = _checkpoint(tmp_path, **ZERO3_2)
    assert _check_resume_topology(checkpoint, _accelerator(DistributedType.DEEPSPEED, 1, 3), _args(8)) == 2
    assert _check_resume_topology(checkpoint, _accelerator(DistributedType.DEEPSPEED, 4, 3), _args(2)) == 2
    assert _check_resume_topology(checkpoint, _accelerator(DistributedType.DEEPSPEED, 2, 3), _args(4)) is None
    assert _check_resume_topology(checkpoint, _accelerator(DistributedType.DEEPSPEED, 2, 3), _args(2, 2)) is None
    # a stream's position is in blocks, not steps: with the same processes it may change its batch
    streamed = _args(8, streaming=True)
    assert _check_resume_topology(checkpoint, _accelerator(DistributedType.DEEPSPEED, 2, 3), streamed) is None


def test_a_deepspeed_checkpoint_in_a_ddp_run_is_refused_before_training(
    tmp_path, small_jsonl_xz, tokenizer_dir, capsys
):
    short = ["--max_train_steps", "2", "--checkpointing_steps", "2"]
    main([*recipe_args(small_jsonl_xz, tokenizer_dir, tmp_path / "a", GLOBAL_BATCH), *short])
    checkpoint = tmp_path / "a" / "checkpoints" / "step_2"
    state = json.loads((checkpoint / TRAINING_STATE).read_text())
    assert state["num_processes"] == 1 and state["global_batch"] == GLOBAL_BATCH
    state.update(distributed_type="DEEPSPEED", num_processes=2, zero_stage=2)  # as a ZeRO-2 run would write it
    (checkpoint / TRAINING_STATE).write_text(json.dumps(state))
    write_manifest(checkpoint)
    with pytest.raises(SystemExit) as exc:
        main([*recipe_args(small_jsonl_xz, tokenizer_dir, tmp_path / "b", GLOBAL_BATCH), "--resume_from_checkpoint",
              str(checkpoint)])  # fmt: skip
    message = str(exc.value.code)
    assert "written by 2 process(es) with DeepSpeed ZeRO-2, global batch 8; this run has 1 process(es) with " in message
    assert "cannot change its engine" in message and "\n" not in message
    assert not (tmp_path / "b" / "model.safetensors").exists()


@pytest.mark.parametrize(
    "env, expected",
    [({"FSDP_VERSION": "2", "FSDP_OFFLOAD_PARAMS": "true"}, "fsdp_offload_params: true needs a GPU"),
     ({"FSDP_VERSION": "1"}, "fsdp_version 1 on a machine without a GPU: only FSDP2 runs on CPU")],
    ids=["offload", "fsdp1"],
)  # fmt: skip
def test_fsdp_settings_that_cannot_run_on_a_cpu_are_refused(env, expected, monkeypatch):
    for name, value in {
        "ACCELERATE_USE_FSDP": "true",
        "FSDP_AUTO_WRAP_POLICY": "TRANSFORMER_BASED_WRAP",
        **env,
    }.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=expected):
        _enable_fsdp_on_cpu(SimpleNamespace(mixed_precision="no"))
