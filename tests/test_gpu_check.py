"""`benchmarks/gpu_check.py` runs every section at a tiny size on the CPU and reports one row per measurement.

On the CPU it trains in the precision of `--mixed_precision auto`: fp32 on a CPU without native bf16 (an AVX2
host, or one capped to AVX2 with `ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2`), where bf16 would take
many minutes.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest
from helpers.paths import REPO_ROOT

from hfzoo.training.precision import resolve_mixed_precision

CHECK = REPO_ROOT / "benchmarks" / "gpu_check.py"


def load_check():
    spec = importlib.util.spec_from_file_location("gpu_check", CHECK)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_the_recipe_rate_leaves_out_the_first_window_and_weights_the_others_by_their_time():
    history = [  # the first window holds compilation: 10 steps of 100 tokens in 50 s
        {"step": 10, "step_seconds": 50.0, "tokens_per_second": 20.0, "mfu": 0.001},
        {"step": 20, "step_seconds": 1.0, "tokens_per_second": 1000.0, "mfu": 0.4},
        {"step": 30, "step_seconds": 4.0, "tokens_per_second": 250.0, "mfu": 0.1},
    ]
    tokens_per_s, mfu, steps = load_check().steady_rate(history)
    assert tokens_per_s == pytest.approx(2000 / 5)  # 2 x 1,000 tokens in 5 s, not the mean of the rates
    assert mfu == pytest.approx((0.4 * 1 + 0.1 * 4) / 5)
    assert steps == "11-30"
    without_peak = [{k: v for k, v in r.items() if k != "mfu"} for r in history]
    assert math.isnan(load_check().steady_rate(without_peak)[1])
    assert all(math.isnan(v) for v in load_check().steady_rate(history[:1])[:2])  # one window: nothing to time


def test_a_deepspeed_that_does_not_import_fails_its_section_before_any_launch(tmp_path):
    fake = tmp_path / "site" / "deepspeed"  # as a DeepSpeed missing one of its requirements
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("import einops_not_installed_here\n")
    check = load_check()
    env = {**os.environ, "PYTHONPATH": str(fake.parent)}
    setup = check.RecipeSetup([], env, tmp_path, tmp_path, "cpu_single_process.yaml", "")
    with pytest.raises(SystemExit, match="deepspeed does not import here.*einops_not_installed_here"):
        check.deepspeed_rows(argparse.Namespace(recipe_steps=4), setup)
    assert not list(tmp_path.glob("recipe-*.txt"))  # nothing was launched


@pytest.mark.slow
def test_the_gpu_check_runs_every_section_on_the_cpu(tmp_path, data_dir):
    out = tmp_path / "check.json"
    command = [sys.executable, str(CHECK), "--device", "cpu", "--tiny", "--recipe_steps", "4", "--data_dir",
               str(data_dir), "--output_json", str(out), "--log_dir", str(tmp_path / "logs")]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = json.loads(out.read_text())["rows"]
    assert {r["section"] for r in rows} == {"training", "recipe", "deepspeed", "generation", "flex"}
    assert "| section | measurement | hfzoo | reference | ratio | unit | note |" in proc.stdout
    for row in rows:  # a tiny model may add no resident memory the CPU's ru_maxrss can see
        assert math.isfinite(row["hfzoo"]) and (row["hfzoo"] > 0 or row["unit"] == "MiB"), row
    cases = {r["case"]: r for r in rows}
    # the recipes' --mixed_precision auto on the CPU: bf16 only where it is native (emulated bf16 is 100x slower)
    precision = "bf16" if resolve_mixed_precision("auto", device_type="cpu").mixed_precision == "bf16" else "fp32"
    assert f"gpt2 (small), {precision}, " in cases["tokens/s, eager"]["note"]
    for kind in ("eager", "compiled"):
        assert cases[f"tokens/s, {kind}"]["reference"] > 0  # transformers' rate beside hfzoo's
    assert cases["compile time (first step minus eager's)"]["hfzoo"] > 0
    # the recipe logs every step at this size: its rate without the first (compiling) step is far above the whole run's
    steady, whole = cases["tokens/s, compiled, steps 2-4"]["hfzoo"], cases["tokens/s, compiled, all 4 steps"]["hfzoo"]
    assert steady > whole and cases["MFU, compiled, steps 2-4"]["hfzoo"] > 0
    for name in ("compiled", "plain", "zero2", "zero3"):  # each launch's output is kept
        assert "Running training" in (tmp_path / "logs" / f"recipe-{name}.txt").read_text()
    # DeepSpeed trains the same model: its held-out loss after the same steps is the plain run's, up to rounding
    plain = cases["eval loss after 4 steps, plain"]["hfzoo"]
    for stage in (2, 3):
        assert cases[f"eval loss after 4 steps, ZeRO-{stage}"]["hfzoo"] == pytest.approx(plain, rel=1e-2)
    assert all(r["note"] == "same tokens as eager; hfzoo's q/k/v fused" for r in rows
               if r["case"].endswith(("eager", "compiled")) and r["section"] == "generation")  # fmt: skip


@pytest.mark.parametrize(
    ("arguments", "environment", "message"),
    [
        ([], {}, "name at least one stage"),
        (["check", "--sizes"], {}, "unknown argument --sizes"),
        (["check"], {"CHECK_SECTIONS": "training deepspeed"}, "CHECK_SECTIONS: unknown section deepspeed"),
    ],
)
def test_the_gpu_session_refuses_bad_arguments_before_any_work(arguments, environment, message, tmp_path):
    script = REPO_ROOT / "benchmarks" / "gpu_session.sh"
    env = {**os.environ, **environment, "OUT": str(tmp_path / "out")}
    proc = subprocess.run(["bash", str(script), *arguments], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()  # before any work


def test_a_generation_case_is_profiled_into_its_own_file(tmp_path, monkeypatch):
    import torch

    monkeypatch.syspath_prepend(str(REPO_ROOT / "benchmarks"))
    import generation

    model = generation.build_models("narrow", torch.device("cpu"))["hfzoo"]
    prompt = torch.randint(5, model.config.vocab_size, (2, 4))
    path = generation.profile_generation(model, prompt, 3, str(tmp_path / "profiles"), "hfzoo", "dynamic eager")
    assert path == tmp_path / "profiles" / "generation-b2-dynamic-eager-hfzoo.txt"
    text = path.read_text()
    assert text.startswith("one step: one generate call of 3 new tokens, batch 2\nprofiled steps: 1; wall per step: ")
    reads = float(text.split("values read back from the device per step (aten::_local_scalar_dense): ")[1].split()[0])
    assert reads >= 3  # greedy decoding asks after every token whether all sequences have finished
    assert "aten::addmm" in text
