"""`hfzoo.training.launch_config`: the launch config a recipe was started with, checked against its engine.

Every shipped `accelerate_configs/` file passes; a file with another engine's section or keys, keys of no
engine, or values its engine refuses is refused in one line naming the file and the key (DeepSpeed's values by
DeepSpeed's own config class). The recipe finds its file from the `accelerate launch` command line that started
it, and refuses before any data or model work (one real single-process launch).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers.launch import recipe_args
from helpers.paths import REPO_ROOT

from hfzoo.training.launch_config import (
    CONFIG_ENV,
    LaunchConfigError,
    check_launch_config,
    check_launch_environment,
    find_launch_config,
    launcher_config_file,
)

CONFIGS = REPO_ROOT / "accelerate_configs"


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_every_shipped_launch_config_passes(name):
    assert check_launch_config(CONFIGS / name)["distributed_type"] in (
        "NO",
        "MULTI_CPU",
        "MULTI_GPU",
        "DEEPSPEED",
        "FSDP",
    )


def _with(name: str, path: Path, **sections) -> Path:
    """A shipped config with `sections` merged in (a dict value updates that section), written to `path`."""
    config = yaml.safe_load((CONFIGS / name).read_text())
    for key, value in sections.items():
        config[key] = {**(config.get(key) or {}), **value} if isinstance(value, dict) else value
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.parametrize(
    "name, sections, expected",
    [
        ("fsdp2.yaml", {"deepspeed_config": {"zero_stage": 2}},
         "deepspeed_config: settings of DEEPSPEED, but distributed_type is FSDP (accelerate would ignore them)"),
        ("fsdp2.yaml", {"fsdp_config": {"zero_stage": 3}},
         "fsdp_config.zero_stage: not an FSDP setting of accelerate (a DeepSpeed setting"),
        ("fsdp2.yaml", {"fsdp_config": {"fsdp_sharding_strategy": "SHARD_EVERYTHING"}},
         "fsdp_config.fsdp_sharding_strategy='SHARD_EVERYTHING': FSDP accepts ['FULL_SHARD', "),
        ("fsdp2.yaml", {"fsdp_config": {"fsdp_state_dict_type": "SHARDED"}},
         "fsdp_config.fsdp_state_dict_type='SHARDED': FSDP accepts ['FULL_STATE_DICT', 'LOCAL_STATE_DICT', "
         "'SHARDED_STATE_DICT']"),
        ("fsdp2.yaml", {"fsdp_config": {"fsdp_version": 3}}, "fsdp_config.fsdp_version=3: FSDP accepts [1, 2]"),
        ("deepspeed_zero2.yaml", {"deepspeed_config": {"zero_stage": 4}},
         "deepspeed_config.zero_stage: Input should be 0, 1, 2, 3"),
        ("deepspeed_zero2.yaml", {"deepspeed_config": {"offload_optimizer_device": "gpu"}},
         "deepspeed_config.offload_optimizer_device: Input should be 'none', 'cpu' or 'nvme' (got 'gpu')"),
        ("deepspeed_zero2.yaml", {"deepspeed_config": {"fsdp_version": 2}},
         "deepspeed_config.fsdp_version: not a DeepSpeed setting of accelerate"),
        ("deepspeed_zero2.yaml", {"fsdp_config": {"fsdp_version": 2}},
         "fsdp_config: settings of FSDP, but distributed_type is DEEPSPEED"),
        ("ddp.yaml", {"deepspeed_config": {"zero_stage": 3}},
         "deepspeed_config: settings of DEEPSPEED, but distributed_type is MULTI_GPU"),
        ("cpu_single_process.yaml", {"fsdp_config": {"fsdp_version": 2}},
         "fsdp_config: settings of FSDP, but distributed_type is NO"),
        ("ddp.yaml", {"zero_stage": 2}, "zero_stage: not an accelerate launch setting (a DeepSpeed setting: put it"),
        ("ddp.yaml", {"num_proceses": 2}, "num_proceses: not an accelerate launch setting"),
        ("ddp.yaml", {"distributed_type": "ZERO"}, "distributed_type='ZERO': expected one of ["),
    ],
    ids=["fsdp-with-deepspeed-section", "zero-stage-in-fsdp", "sharding-strategy", "state-dict-type", "fsdp-version",
         "zero-stage-4", "offload-device", "fsdp-key-in-deepspeed", "deepspeed-with-fsdp-section",
         "ddp-with-deepspeed-section", "no-engine-with-fsdp-section", "top-level-engine-key", "unknown-key",
         "distributed-type"],
)  # fmt: skip
def test_a_launch_config_its_engine_would_ignore_or_refuse_is_refused_in_one_line(name, sections, expected, tmp_path):
    path = _with(name, tmp_path / "bad.yaml", **sections)
    with pytest.raises(LaunchConfigError) as err:
        check_launch_config(path)
    message = str(err.value)
    assert message.startswith(f"{path}: ") and expected in message and "\n" not in message, message


def test_a_deepspeed_json_is_validated_by_deepspeed(tmp_path):
    ds = tmp_path / "ds.json"
    path = _with("deepspeed_zero2.yaml", tmp_path / "c.yaml", deepspeed_config={"deepspeed_config_file": str(ds)})
    path.write_text(path.read_text().replace("  zero_stage: 2\n", "").replace("  offload_optimizer_device: none\n", "")
                    .replace("  offload_param_device: none\n", ""))  # fmt: skip
    ds.write_text(
        json.dumps({"zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}, "bf16": {"enabled": "auto"}})
    )
    check_launch_config(path)  # good
    ds.write_text(json.dumps({"zero_optimization": {"stage": 2, "offload_param": {"device": "disk"}}}))
    with pytest.raises(LaunchConfigError, match=rf"^{ds}: zero_optimization.offload_param.device: Input should be"):
        check_launch_config(path)
    ds.write_text("{not json")
    with pytest.raises(LaunchConfigError, match=rf"deepspeed_config_file: {ds}: not JSON"):
        check_launch_config(path)
    both = _with("deepspeed_zero2.yaml", tmp_path / "both.yaml", deepspeed_config={"deepspeed_config_file": str(ds)})
    with pytest.raises(LaunchConfigError, match=r"deepspeed_config.offload_optimizer_device: set in .* instead"):
        check_launch_config(both)


def test_the_launchers_config_file_is_found_from_its_command_line(tmp_path):
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--config_file", "c.yaml",
              "recipes/pretrain.py", "--config_file", "not-this.yaml"]  # fmt: skip
    assert launcher_config_file(launch, tmp_path) == tmp_path / "c.yaml"
    assert launcher_config_file(
        ["/venv/bin/accelerate", "launch", "--config_file=/a/b.yaml", "x.py"], tmp_path
    ) == Path("/a/b.yaml")
    assert (
        launcher_config_file(["/venv/bin/accelerate", "launch", "x.py"], tmp_path) is None
    )  # accelerate's default file
    assert launcher_config_file(["torchrun", "--nproc_per_node", "2", "x.py"], tmp_path) is False
    # not launched by accelerate (no ACCELERATE_MIXED_PRECISION) -> nothing to check; HFZOO_ACCELERATE_CONFIG wins
    assert find_launch_config({}) is None
    assert find_launch_config({CONFIG_ENV: str(tmp_path / "c.yaml")}) == tmp_path / "c.yaml"


def test_the_launchers_environment_is_checked_when_its_file_cannot_be_seen():
    check_launch_environment({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "3"})
    check_launch_environment(
        {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "FSDP_STATE_DICT_TYPE": "FULL_STATE_DICT"}
    )
    with pytest.raises(LaunchConfigError, match=r"ACCELERATE_DEEPSPEED_ZERO_STAGE: Input should be 0, 1, 2, 3"):
        check_launch_environment({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "4"})
    with pytest.raises(LaunchConfigError, match=r"FSDP_SHARDING_STRATEGY='EVERYTHING': FSDP accepts \['FULL_SHARD'"):
        check_launch_environment({"ACCELERATE_USE_FSDP": "true", "FSDP_SHARDING_STRATEGY": "EVERYTHING"})


def test_a_launched_recipe_refuses_another_engines_keys_before_any_work(tmp_path, small_jsonl_xz, tokenizer_dir):
    """One real `accelerate launch` (one process): the recipe finds the launcher's file and refuses it first."""
    config = _with("cpu_single_process.yaml", tmp_path / "launch.yaml", fsdp_config={"fsdp_version": 2})
    out = tmp_path / "missing" / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--config_file", "launch.yaml",
         str(REPO_ROOT / "recipes" / "pretrain.py"), *recipe_args(small_jsonl_xz, tokenizer_dir, out, 4),
         "--checkpointing_steps", "4"],
        cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: {config}: fsdp_config: settings of FSDP, but distributed_type is NO (accelerate would "
                      "ignore them); remove the section or set distributed_type: FSDP"], proc.stderr[-3000:]  # fmt: skip
    assert "Tokeniz" not in proc.stderr and "Map" not in proc.stderr  # no data work
    assert not (tmp_path / "missing").exists()  # nothing left on disk
