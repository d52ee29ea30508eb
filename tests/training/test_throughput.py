"""Throughput accounting (`hfzoo.training.throughput`): GPU datasheet peaks, the cached CPU peak, MFU arithmetic.

The FLOPs formula itself is checked against hand counts and torch's FlopCounterMode in tests/models/test_flops.py;
the recipes' logged figures in tests/pretraining/test_pretrain_recipe.py and tests/finetuning/test_glue_recipe.py.
"""

from __future__ import annotations

import json

import pytest
import torch

from hfzoo.models.flops import count_training_flops
from hfzoo.models.presets import build_config
from hfzoo.training import throughput
from hfzoo.training.throughput import (
    PeakTflops,
    Throughput,
    datasheet_peak_tflops,
    pretraining_flops_per_token,
    resolve_peak_tflops,
)


@pytest.mark.parametrize(
    ("name", "precision", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4),
        ("NVIDIA H100 PCIe", "bf16", 756.5),
        ("NVIDIA H100 NVL", "fp32", 60.0),
        ("NVIDIA H200", "fp16", 989.4),
        ("NVIDIA GH200 480GB", "bf16", 989.4),
        ("NVIDIA A100-SXM4-80GB", "fp32", 19.5),
        ("NVIDIA A100-PCIE-40GB", "tf32", 156.0),
        ("NVIDIA L4", "bf16", 121.0),
        ("NVIDIA L40S", "bf16", 362.0),  # not L4's
        ("NVIDIA A10", "bf16", 125.0),
        ("NVIDIA A10G", "bf16", None),  # not A10's: a different chip
        ("NVIDIA GeForce GTX 1080", "fp32", None),
    ],
)
def test_datasheet_lookup_takes_the_longest_whole_word_match(name, precision, expected):
    assert datasheet_peak_tflops(name, precision) == expected


def test_datasheet_lookup_refuses_an_unknown_precision():
    with pytest.raises(ValueError, match="int8"):
        datasheet_peak_tflops("NVIDIA H100", "int8")


def test_cpu_peak_is_measured_once_per_key_and_cached(tmp_path, monkeypatch):
    cache = tmp_path / "hfzoo" / "cpu_peak_tflops.json"
    monkeypatch.setattr(throughput, "cpu_peak_cache_file", lambda: cache)
    calls = []

    def fake_measure(precision):
        calls.append(precision)
        return {"fp32": 0.25, "bf16": 2.0}[precision]

    monkeypatch.setattr(throughput, "measure_cpu_peak_tflops", fake_measure)
    cpu = torch.device("cpu")
    assert resolve_peak_tflops(cpu, "no").tflops == 0.25
    assert resolve_peak_tflops(cpu, "no").tflops == 0.25
    assert resolve_peak_tflops(cpu, "bf16").tflops == 2.0
    assert calls == ["fp32", "bf16"]
    keys = list(json.loads(cache.read_text()))
    assert len(keys) == 2 and all(f"{torch.get_num_threads()} threads" in k for k in keys)
    threads = torch.get_num_threads()
    try:  # another thread count is another measurement
        torch.set_num_threads(threads + 1)
        resolve_peak_tflops(cpu, "no")
    finally:
        torch.set_num_threads(threads)
    assert calls == ["fp32", "bf16", "fp32"]
    cache.write_text("not json")  # a damaged cache is measured again and rewritten
    assert resolve_peak_tflops(cpu, "no").tflops == 0.25 and len(calls) == 4
    assert len(json.loads(cache.read_text())) == 1


def test_cpu_matmul_benchmark_measures_a_plausible_peak():
    tflops = throughput.measure_cpu_peak_tflops("fp32", size=256, min_seconds=0.01)
    assert 1e-4 < tflops < 100  # a CPU core does more than 0.1 GFLOP/s and far less than 100 TFLOP/s
    with pytest.raises(ValueError, match="int8"):
        throughput.measure_cpu_peak_tflops("int8")


def test_peak_override_and_its_validation():
    assert resolve_peak_tflops(torch.device("cpu"), "bf16", 3.5) == PeakTflops(3.5, "--peak_tflops")
    with pytest.raises(ValueError, match="--peak_tflops must be positive"):
        resolve_peak_tflops(torch.device("cpu"), "bf16", 0.0)


def test_metrics_arithmetic():
    meter = Throughput(PeakTflops(2.0, "test"), num_devices=2)
    record = meter.metrics(tokens=1000, flops=8e12, seconds=2.0)
    assert record == pytest.approx({"flops_per_token": 8e9, "tokens_per_second": 500, "tflops": 4.0, "mfu": 1.0})
    assert "mfu" not in Throughput(PeakTflops(None, "unknown GPU")).metrics(10, 1e12, 1.0)
    assert set(meter.metrics(10, 0.0, 1.0)) == {"flops_per_token", "tokens_per_second"}  # FLOPs unknown


def test_pretraining_flops_per_token_counts_per_text_token():
    config = build_config("encoder-decoder-tiny", "vocab_size=128")
    # span corruption: 20 text tokens become 16 encoder inputs and 6 targets
    assert pretraining_flops_per_token(config, 16, 20, 6) == count_training_flops(config, 16, 6).total / 20
    decoder = build_config("decoder-tiny", "vocab_size=128")
    assert pretraining_flops_per_token(decoder, 32, 32) == count_training_flops(decoder, 32).per_token


def test_an_mfu_above_100_percent_measures_the_cpu_peak_again(tmp_path, monkeypatch):
    """A peak measured under load is too low: the run's achieved rate exceeding it measures it again."""
    cache = tmp_path / "cpu_peak_tflops.json"
    monkeypatch.setattr(throughput, "cpu_peak_cache_file", lambda: cache)
    measured = iter([0.1, 0.5, 0.4])  # under load, then quiet, then under load again
    monkeypatch.setattr(throughput, "measure_cpu_peak_tflops", lambda precision: next(measured))
    meter = Throughput(resolve_peak_tflops(torch.device("cpu"), "bf16"))
    assert meter.peak.tflops == 0.1 and meter.peak.precision == "bf16"
    assert meter.metrics(tokens=1, flops=0.05e12, seconds=1.0)["mfu"] == pytest.approx(0.5)  # below: kept
    assert meter.metrics(tokens=1, flops=0.3e12, seconds=1.0)["mfu"] == pytest.approx(0.6)  # 0.3 > 0.1: 0.5 now
    assert json.loads(cache.read_text()) == {throughput._cpu_peak_key("bf16"): 0.5}
    record = meter.metrics(tokens=1, flops=0.8e12, seconds=1.0)  # above even a new measurement (0.4)
    assert record["mfu"] == pytest.approx(1.0) and "raised to a run's achieved rate" in meter.peak.source
    assert resolve_peak_tflops(torch.device("cpu"), "bf16").tflops == pytest.approx(0.8)  # the cache keeps the max
    fixed = Throughput(resolve_peak_tflops(torch.device("cpu"), "bf16", 0.2))  # --peak_tflops is never changed
    assert fixed.metrics(tokens=1, flops=0.4e12, seconds=1.0)["mfu"] == pytest.approx(2.0)


def test_the_cpu_peak_is_keyed_by_the_capped_capability_class(tmp_path, monkeypatch):
    """An AVX-512 host capped to AVX2 computes bf16 a hundred times slower: its own peak, not the uncapped one."""
    cache = tmp_path / "cpu_peak_tflops.json"
    monkeypatch.setattr(throughput, "cpu_peak_cache_file", lambda: cache)
    monkeypatch.setattr(throughput, "measure_cpu_peak_tflops", lambda precision: 1.0)
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    throughput.cached_cpu_peak_tflops("bf16")
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    monkeypatch.setattr(throughput, "measure_cpu_peak_tflops", lambda precision: 0.002)
    assert throughput.cached_cpu_peak_tflops("bf16") == 0.002
    assert len(json.loads(cache.read_text())) == 2


def test_a_slow_cpu_precision_is_measured_on_smaller_matrices(monkeypatch):
    """bf16 emulated at a few GFLOP/s would take seconds per product of 2,048: the size shrinks to fit."""
    sizes = []
    real_mm = torch.mm

    def slow_mm(a, b):
        sizes.append(a.shape[0])
        time_per_flop = 1 / 2e9  # 2 GFLOP/s
        deadline = throughput.time.perf_counter() + 2 * a.shape[0] ** 3 * time_per_flop
        while throughput.time.perf_counter() < deadline:
            pass
        return real_mm(a, b)

    monkeypatch.setattr(torch, "mm", slow_mm)
    start = throughput.time.perf_counter()
    tflops = throughput.measure_cpu_peak_tflops("fp32", min_seconds=0.3)
    assert throughput.time.perf_counter() - start < 3  # not 3 x 8.6 s
    assert max(sizes) < 2048 and tflops == pytest.approx(0.002, rel=0.5)
