"""`hfzoo.study.parallel`: `--parallel_runs N` shares a study among processes; `auto` sizes N for the machine."""

from __future__ import annotations

import re

import pytest
from helpers.study import PLANNED, read_results, tiny_study, without_timing

from hfzoo.study.runner import main
from hfzoo.study.settings import load_settings


@pytest.mark.slow
def test_parallel_runs_share_the_study_and_give_the_same_results(inputs, uninterrupted, tmp_path, capfd):
    """`--parallel_runs 2`: this process and a child split the runs, each run once, same results."""
    study = tiny_study(inputs, tmp_path / "study.yaml")
    main(["--study", str(study), "--output_dir", str(tmp_path / "out"), "--parallel_runs", "2"])
    started = re.findall(r"=== run \d+/6: (.+), seed (\d) \(.*, study process (\d+)\)", capfd.readouterr().out)
    assert sorted((v, int(s)) for v, s, _ in started) == sorted(PLANNED)
    assert len({pid for _, _, pid in started}) == 2  # both processes ran some of the runs
    assert without_timing(read_results(tmp_path / "out")) == without_timing(read_results(uninterrupted))


def test_parallel_runs_auto_sizing():
    """`auto` sizes from free memory, the per-run estimate and the cores (numbers injected: no GPU here)."""
    from hfzoo.study.parallel import CUDA_PROCESS_BYTES, estimate_run_bytes, plan_parallel_runs

    gib = 2**30
    # one H100 with 80 GiB free, 16 cores: memory allows 57 runs of 1.25 GiB; the cores cap it at 16
    plan = plan_parallel_runs(device="cuda", per_run_bytes=int(1.25 * gib), free_memory_bytes=80 * gib, cpu_cores=16)
    assert (plan.processes, plan.threads) == (16, 1) and "CPU cores" in plan.reason
    # 10 GiB free: floor(0.9 x 10 / 1.25) = 7 processes, 16 // 7 = 2 threads each
    plan = plan_parallel_runs(device="cuda", per_run_bytes=int(1.25 * gib), free_memory_bytes=10 * gib, cpu_cores=16)
    assert (plan.processes, plan.threads) == (7, 2) and "memory" in plan.reason
    # CPU: one single-threaded process per core while the RAM allows, at least one
    plan = plan_parallel_runs(device="cpu", per_run_bytes=gib, free_memory_bytes=64 * gib, cpu_cores=2)
    assert (plan.processes, plan.threads) == (2, 1)
    assert plan_parallel_runs(device="cpu", per_run_bytes=2 * gib, free_memory_bytes=gib, cpu_cores=8).processes == 1
    plan = plan_parallel_runs(device="cpu", per_run_bytes=gib, free_memory_bytes=64 * gib, cpu_cores=8, runs=3)
    assert (plan.processes, plan.threads) == (3, 2) and "runs left" in plan.reason  # no more processes than runs
    with pytest.raises(ValueError, match="per_run_bytes and cpu_cores must be positive"):
        plan_parallel_runs(device="cpu", per_run_bytes=0, free_memory_bytes=gib, cpu_cores=2)
    # the estimate: Korthikanti et al.'s s b h (34 + 5 a s / h) bytes per 16-bit layer, 16 bytes per parameter,
    # 3 fp32 copies of the logits, and the fixed per-process cost
    b, s_in, s_out, h, a, v = 16, 128, 30, 128, 2, 4096
    layers = 4 * s_in * b * h * (34 + 5 * a * s_in / h) + 4 * s_out * b * h * (34 + 5 * a * s_out / h)
    expected = CUDA_PROCESS_BYTES + 16 * 2_370_000 + layers + 12 * b * s_out * v
    kwargs = dict(batch_size=b, input_length=s_in, target_length=s_out, hidden_size=h, num_heads=a, encoder_layers=4,
                  decoder_layers=4, vocab_size=v, device="cuda")  # fmt: skip
    assert estimate_run_bytes(2_370_000, half_precision=True, **kwargs) == int(expected)
    assert estimate_run_bytes(2_370_000, half_precision=False, **kwargs) == int(expected + layers)


def test_parallel_runs_auto_resolves_here_and_bad_values_are_refused(inputs, tmp_path, capsys):
    from hfzoo.study.checks import check_settings
    from hfzoo.study.parallel import cpu_cores, resolve_parallel_runs
    from hfzoo.study.settings import resolve_paths

    settings = resolve_paths(load_settings(tiny_study(inputs, tmp_path / "study.yaml")))
    plan = resolve_parallel_runs(settings, 1, check_settings(settings)["tokenizer_fields"])
    assert plan.device == "cpu" and 1 <= plan.processes <= cpu_cores() and plan.threads >= 1
    assert plan.processes * plan.threads <= cpu_cores()
    study = str(tmp_path / "study.yaml")
    for value in ("0", "many", "-2"):
        with pytest.raises(SystemExit) as exc:
            main(["--study", study, "--output_dir", str(tmp_path / "out"), "--parallel_runs", value])
        assert exc.value.code == 2
        message = capsys.readouterr().err.strip()
        assert "\n" not in message and "argument --parallel_runs: expected a positive integer or 'auto'" in message
    assert not (tmp_path / "out").exists()
