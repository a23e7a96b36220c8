"""MFU: the per-device peak table, the env override, the measured CPU peak, and train/mfu in a real run."""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path

import pytest
import torch
from test_train_stage import debug_config, log_steps

from zaya_pipeline.data.loader import read_token_meta
from zaya_pipeline.errors import ConfigError
from zaya_pipeline.model.sizing import forward_flops_per_token
from zaya_pipeline.train import callbacks, throughput
from zaya_pipeline.train.run import resolve_model_config, train
from zaya_pipeline.train.throughput import (
    PEAK_ENV,
    flops_per_cycle,
    matmul_dtype,
    measured_cpu_peak,
    mfu,
    resolve_peak,
    spec_cpu_peak,
    table_peak,
)


@pytest.fixture(autouse=True)
def no_env_peak(monkeypatch):
    monkeypatch.delenv(PEAK_ENV, raising=False)


@pytest.mark.parametrize(
    "name, dtype, tflops",
    [
        ("NVIDIA H200", "bf16", 989.5),
        ("NVIDIA H200", "fp32", 67.0),
        ("NVIDIA H100 80GB HBM3", "bf16", 989.5),
        ("NVIDIA H100 80GB HBM3", "tf32", 494.5),
        ("NVIDIA H100 PCIe", "bf16", 756.5),
        ("AMD Instinct MI300X", "bf16", 1307.4),
        ("AMD Instinct MI300X", "fp16", 1307.4),
        ("AMD Instinct MI300X", "fp32", 163.4),
        ("AMD Instinct MI300X VF", "bf16", 1307.4),  # a virtual function of the same chip
    ],
)
def test_table_peak_of_names_as_torch_reports_them(name, dtype, tflops):
    peak = table_peak(name, dtype)
    assert peak.flops == pytest.approx(tflops * 1e12)
    assert dtype in peak.source


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA A100-SXM4-80GB",
        "NVIDIA H100 NVL",  # other clocks and power than SXM: not matched to the SXM figures
        "NVIDIA H200 NVL",
        "NVIDIA GH200 480GB",
        "AMD Instinct MI250X",
        "AMD Instinct MI300A",
        "",  # some ROCm containers report no name
    ],
)
def test_devices_not_in_the_table_have_no_peak(name):
    assert table_peak(name, "bf16") is None


def test_precision_picks_the_matmul_dtype():
    assert matmul_dtype("bf16-mixed") == matmul_dtype("bf16-true") == "bf16"
    assert matmul_dtype("16-mixed") == "fp16"
    assert matmul_dtype("32-true", "cuda") == "fp32"
    assert matmul_dtype("64-true") is None
    # FSDP2 with parallel.param_dtype=bfloat16 computes in bf16 over fp32 master weights
    assert matmul_dtype("32-true", "cuda", param_dtype="bfloat16") == "bf16"
    assert matmul_dtype("bf16-mixed", "cuda", param_dtype="float32") == "bf16"
    peak = resolve_peak("cuda", "AMD Instinct MI300X", "32-true", "bfloat16")
    assert peak.flops == pytest.approx(1307.4e12)
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        assert matmul_dtype("32-true", "cuda") == "tf32"
        assert matmul_dtype("32-true", "cpu") == "fp32"
    finally:
        torch.set_float32_matmul_precision(before)


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture
def train_log():
    logger, handler = logging.getLogger("zaya.train"), Records()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler.messages
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_unknown_gpu_reports_no_mfu_and_says_why_once(train_log):
    name = "NVIDIA Imaginary X9 (test_throughput)"  # unique: the reason is logged once per process
    assert resolve_peak("cuda", name, "bf16-mixed") is None
    assert resolve_peak("cuda", name, "bf16-mixed") is None
    why = [m for m in train_log if name in m]
    assert len(why) == 1 and "MFU not reported" in why[0] and PEAK_ENV in why[0]
    assert resolve_peak("cuda", "NVIDIA H200", "bf16-mixed").flops == pytest.approx(989.5e12)


def test_env_override(monkeypatch):
    monkeypatch.setenv(PEAK_ENV, "123.5")
    for device_type, name in (("cuda", "NVIDIA Imaginary X9"), ("cuda", "NVIDIA H200"), ("cpu", "cpu")):
        peak = resolve_peak(device_type, name, "bf16-mixed")
        assert peak.flops == pytest.approx(123.5e12) and PEAK_ENV in peak.source
    for bad in ("abc", "0", "-3", "nan", "inf"):
        monkeypatch.setenv(PEAK_ENV, bad)
        with pytest.raises(ConfigError, match=PEAK_ENV):
            resolve_peak("cpu", "cpu", "32-true")


def test_cpu_peak_is_measured_quickly_once_and_leaves_the_global_rng_alone():
    throughput._measured_cpu_flops.cache_clear()
    rng = torch.get_rng_state()
    t0 = time.perf_counter()
    peak = measured_cpu_peak("fp32")
    assert time.perf_counter() - t0 < 1.0
    assert torch.equal(torch.get_rng_state(), rng)
    assert math.isfinite(peak.flops) and peak.flops > 1e9  # any CPU torch runs on does > 1 GFLOP/s
    assert f"({torch.get_num_threads()} thread" in peak.source
    assert measured_cpu_peak("fp32") == peak  # cached: the same measurement


def test_the_cpu_peak_is_the_spec_peak_whatever_else_runs():
    """MFU on CPU divides by the spec peak: a matmul measured on a busy machine gave a quarter of it and MFU
    read 119%. The peak is the same with both cores busy, and above what a matmul reaches."""
    import subprocess
    import sys

    spec = spec_cpu_peak("fp32")
    if spec is None:
        pytest.skip("no /proc/cpuinfo: the measured peak is the fallback")
    assert resolve_peak("cpu", "cpu", "32-true") == spec
    assert resolve_peak("cpu", "cpu", "bf16-mixed") == spec_cpu_peak("bf16")
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        assert resolve_peak("cpu", "cpu", "32-true") == spec
    finally:
        for proc in busy:
            proc.kill()
    throughput._measured_cpu_flops.cache_clear()
    assert spec.flops >= measured_cpu_peak("fp32").flops  # a measurement can only be below the peak


def test_flops_per_cycle_follow_the_widest_fma():
    assert flops_per_cycle({"sse2"}, "fp32") == 8
    assert flops_per_cycle({"avx"}, "fp32") == 16
    assert flops_per_cycle({"avx", "avx2", "fma"}, "fp32") == 32
    assert flops_per_cycle({"avx2", "fma", "avx512f"}, "fp32") == 64
    assert flops_per_cycle({"avx2", "fma", "avx512f", "avx512_bf16"}, "bf16") == 128
    assert flops_per_cycle({"avx2", "fma"}, "bf16") == 32  # upcast to fp32: no faster
    assert flops_per_cycle({"avx512f", "amx_bf16"}, "bf16") == 1024


def test_mfu_arithmetic():
    # 10,000 tokens/s on one MI300X at 6 GFLOP per token: 6e13 FLOP/s of 1,307.4e12 peak -> 4.589%
    assert mfu(10_000, 6e9, 1307.4e12) == pytest.approx(0.045893, rel=1e-4)
    assert mfu(2_000, 3e9, 989.5e12) == pytest.approx(6.0 / 989.5)


def test_training_logs_mfu_to_mlflow(tmp_path, token_dir):
    from mlflow import MlflowClient

    short = ("train.max_steps=4", "train.val_every=2", "train.log_every=2", "train.schedule.warmup_steps=2")
    cfg = debug_config(tmp_path, token_dir, *short)
    model_cfg = resolve_model_config(cfg.model, read_token_meta(Path(token_dir)))
    flops = 3 * forward_flops_per_token(model_cfg, cfg.train.seq_len)
    summary = train(cfg)

    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    run = client.get_run(summary["run_id"]).info.run_id
    history = {
        key: {m.step: m.value for m in client.get_metric_history(run, key)}
        for key in ("train/mfu", "train/tflops_per_device", "train/tokens_per_s")
    }
    peak_tflops = client.get_metric_history(run, "train/peak_tflops_per_device")[0].value
    assert peak_tflops > 1e-3  # measured on this CPU
    assert sorted(history["train/mfu"]) == log_steps(cfg)
    for step, value in history["train/mfu"].items():
        tflops = history["train/tokens_per_s"][step] * flops / 1e12  # one process: per device = all
        assert history["train/tflops_per_device"][step] == pytest.approx(tflops, rel=1e-6)
        assert value == pytest.approx(tflops / peak_tflops, rel=1e-6)
        assert 0 < value < 1
    metrics = json.loads((tmp_path / "reports" / "train.json").read_text())
    assert 0 < metrics["mfu"] < 1 and metrics["peak_tflops_per_device"] == pytest.approx(peak_tflops)


def test_summary_for_train_json_is_the_median_over_intervals():
    telemetry = callbacks.ThroughputMeter(2, 6, flops_per_token=1_000_000, peak_flops=2e12)
    assert telemetry.throughput_summary() == {}  # nothing logged yet
    for step, tokens_per_s in ((2, 1000.0), (4, 3000.0), (6, 2000.0)):
        metrics = telemetry._mfu_metrics(step, tokens_per_s)
        assert metrics["train/mfu"] == pytest.approx(tokens_per_s * 1e6 / 2e12)
    assert telemetry.throughput_summary() == pytest.approx(
        {"mfu": 2000 * 1e6 / 2e12, "tflops_per_device": 2000 * 1e6 / 1e12, "peak_tflops_per_device": 2.0}
    )
    assert callbacks.ThroughputMeter(2, 6)._mfu_metrics(2, 1000.0) == {}  # no FLOPs given: no MFU
