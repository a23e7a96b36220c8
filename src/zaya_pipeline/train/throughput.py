"""Peak matmul throughput per device, and model FLOPs utilisation (MFU) against it.

    MFU = tokens/s per device x training FLOPs per token / peak FLOP/s of one device

The FLOPs per token are ``3 x model.sizing.forward_flops_per_token`` (active parameters plus attention,
the PaLM convention): recomputation under activation checkpointing is not counted, so MFU measures the
model's useful work, not what the hardware executed.

The peak comes from, in this order:

1. ``$ZAYA_PEAK_TFLOPS`` (TFLOP/s per device, for hardware the table lacks, or to compare with another
   convention);
2. on CUDA and ROCm GPUs, ``PEAK_TABLE`` (vendor datasheet figures, dense, i.e. without 2:4 sparsity),
   matched on ``torch.cuda.get_device_name``. A GPU that is not in the table gets no MFU (logged once):
   a guessed peak would make the number meaningless;
3. on CPU, the spec peak of the threads torch uses: clock (the highest of /proc/cpuinfo's ``cpu MHz`` and
   cpufreq's maximum) x FLOPs per cycle of the widest FMA the CPU's flags name (AVX-512: 64 fp32, AVX2+FMA:
   32, AVX: 16, else SSE: 8; bf16 doubles with AVX512_BF16, AMX-BF16 gives 1024). A peak measured with a few
   matmuls is only a lower bound (on a loaded 2-core machine it came out at 0.047 TFLOP/s, a quarter of the
   spec, and MFU read 119%), so it is only the fallback where /proc/cpuinfo is missing (macOS).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from zaya_pipeline.errors import ConfigError
from zaya_pipeline.utils import get_logger

log = get_logger("train")

PEAK_ENV = "ZAYA_PEAK_TFLOPS"


@dataclass(frozen=True)
class DevicePeak:
    name: str
    pattern: str  # regular expression searched in torch.cuda.get_device_name()
    tflops: dict[str, float]  # matmul dtype ("fp32", "tf32", "bf16", "fp16") -> dense TFLOP/s


# Dense (no 2:4 sparsity) peak TFLOP/s from the vendors' datasheets.
# * NVIDIA H100 Tensor Core GPU datasheet: H100 SXM FP32 67, TF32 989, BF16 1,979, FP16 1,979 (TF32, BF16 and
#   FP16 "shown with sparsity", dense is one half); H100 PCIe FP32 51, TF32 756, BF16/FP16 1,513 (sparse).
# * NVIDIA H200 Tensor Core GPU datasheet: H200 SXM FP32 67, TF32 989, BF16/FP16 1,979 (sparse), as H100 SXM
#   (the same GH100 compute; H200 differs in memory).
# * AMD Instinct MI300X datasheet: FP32 matrix 163.4, TF32 653.7, FP16 1,307.4, BF16 1,307.4 (dense; with
#   structured sparsity TF32 1,307.4, FP16/BF16 2,614.9).
# "fp32" is plain IEEE fp32 (CUDA cores / FP32 matrix), what torch uses unless
# torch.set_float32_matmul_precision("high"|"medium") allows TF32; the "tf32" peak assumes it then runs (on
# ROCm that depends on the ROCm/hipBLASLt version). H100/H200 NVL boards and GH200 run at other clocks and
# power and are left out rather than matched to the SXM figures.
PEAK_TABLE: tuple[DevicePeak, ...] = (
    DevicePeak(
        "H100 PCIe", r"\bH100\b.*\bPCIe\b", {"fp32": 51.0, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5}
    ),
    DevicePeak(
        "H100 SXM",
        r"\bH100\b(?!.*\b(PCIe|NVL)\b)",
        {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5},
    ),
    DevicePeak(
        "H200 SXM", r"\bH200\b(?!.*\bNVL\b)", {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5}
    ),
    DevicePeak("MI300X", r"\bMI300X\b", {"fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4}),
)

_MATMUL_DTYPE = {
    "32-true": "fp32",
    "32": "fp32",
    "bf16-mixed": "bf16",
    "bf16-true": "bf16",
    "bf16-master": "bf16",
    "bf16": "bf16",
    "16-mixed": "fp16",
    "16-true": "fp16",
    "16": "fp16",
}
_TORCH_DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Peak:
    flops: float  # FLOP/s of one device
    source: str  # where the figure comes from, for the log and MLflow


def matmul_dtype(precision: str, device_type: str = "cpu", param_dtype: str = "float32") -> str | None:
    """The dtype the matmuls run in under Lightning precision ``precision`` (None: not a matmul dtype we
    have peaks for, e.g. "64-true"). ``param_dtype`` is FSDP2's compute dtype (``parallel.param_dtype``
    under ``parallel.strategy=fsdp2``): "bfloat16" with "32-true" runs the matmuls in bf16 over fp32
    master weights. On GPUs fp32 becomes tf32 when torch's float32 matmul precision allows it."""
    dtype = _MATMUL_DTYPE.get(str(precision))
    if dtype == "fp32" and param_dtype == "bfloat16":
        return "bf16"
    if dtype == "fp32" and device_type == "cuda" and torch.get_float32_matmul_precision() != "highest":
        return "tf32"
    return dtype


def table_peak(device_name: str, dtype: str) -> Peak | None:
    """The datasheet peak of the GPU torch names ``device_name`` for matmuls in ``dtype``, or None."""
    for entry in PEAK_TABLE:
        if re.search(entry.pattern, device_name) and dtype in entry.tflops:
            tflops = entry.tflops[dtype]
            return Peak(tflops * 1e12, f"{entry.name} {dtype} dense datasheet peak {tflops:g} TFLOP/s")
    return None


@functools.cache
def _measured_cpu_flops(dtype: str, threads: int) -> float:
    generator = torch.Generator().manual_seed(0)  # the global RNG, which training uses, stays untouched
    best = 0.0
    for n in (512, 1024):
        a = torch.randn(n, n, generator=generator).to(_TORCH_DTYPE[dtype])
        b = torch.randn(n, n, generator=generator).to(_TORCH_DTYPE[dtype])
        a @ b  # warm-up: the first call picks and prepares the kernel
        for _ in range(3):
            t0 = time.perf_counter()
            a @ b
            best = max(best, 2 * n**3 / (time.perf_counter() - t0))
    return best


def _cpuinfo() -> tuple[float, set[str]] | None:
    """(highest clock in Hz, CPU flags) from /proc/cpuinfo and cpufreq, or None off Linux."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    mhz = [float(m) for m in re.findall(r"^cpu MHz\s*:\s*([\d.]+)", text, flags=re.M)]
    for path in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/cpufreq/cpuinfo_max_freq"):
        with contextlib.suppress(OSError, ValueError):
            mhz.append(int(path.read_text()) / 1000)  # kHz
    flags = re.search(r"^(?:flags|Features)\s*:\s*(.*)$", text, flags=re.M)
    if not mhz or flags is None:
        return None
    return max(mhz) * 1e6, set(flags.group(1).split())


def flops_per_cycle(flags: set[str], dtype: str) -> int:
    """Peak FLOPs per cycle per core for ``dtype`` matmuls from the CPU's flags (two FMA pipes assumed)."""
    if dtype == "bf16" and "amx_bf16" in flags:
        return 1024
    fp32 = 64 if "avx512f" in flags else 32 if {"avx2", "fma"} <= flags else 16 if "avx" in flags else 8
    return fp32 * 2 if dtype == "bf16" and "avx512_bf16" in flags else fp32


def spec_cpu_peak(dtype: str = "fp32") -> Peak | None:
    """threads x clock x :func:`flops_per_cycle`, or None where /proc/cpuinfo does not say."""
    info = _cpuinfo()
    if info is None:
        return None
    hz, flags = info
    threads = torch.get_num_threads()
    flops = threads * hz * flops_per_cycle(flags, dtype)
    return Peak(flops, f"CPU {dtype} spec peak {flops / 1e12:.3g} TFLOP/s ({threads} x {hz / 1e9:.2f} GHz)")


def measured_cpu_peak(dtype: str = "fp32") -> Peak:
    """The best FLOP/s of square ``dtype`` matmuls (512 and 1024, 3 repeats) with torch's current thread
    count; measured once per process and thread count (~0.1 s on 2 cores)."""
    threads = torch.get_num_threads()
    flops = _measured_cpu_flops(dtype, threads)
    plural = "s" if threads != 1 else ""
    return Peak(flops, f"CPU {dtype} measured peak {flops / 1e12:.3g} TFLOP/s ({threads} thread{plural})")


def env_peak() -> Peak | None:
    """``$ZAYA_PEAK_TFLOPS`` (TFLOP/s per device), or None when unset."""
    raw = os.environ.get(PEAK_ENV, "").strip()
    if not raw:
        return None
    try:
        tflops = float(raw)
    except ValueError:
        tflops = math.nan
    if not (math.isfinite(tflops) and tflops > 0):
        raise ConfigError(f"{PEAK_ENV}={raw!r}: expected a positive number of TFLOP/s per device")
    return Peak(tflops * 1e12, f"{PEAK_ENV}={tflops:g} TFLOP/s")


def device_name(device: torch.device) -> str:
    """What torch calls ``device``: the GPU's name (CUDA and ROCm alike), else "cpu"."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return device.type


@functools.cache
def _log_once(message: str) -> None:
    log.info(message)


def resolve_peak(
    device_type: str, name: str, precision: str, param_dtype: str = "float32", log_reason: bool = True
) -> Peak | None:
    """The peak FLOP/s of one device for training at ``precision`` (and FSDP2 ``param_dtype``, see
    ``matmul_dtype``); None when there is no trustworthy figure (with one log line per process saying why,
    unless ``log_reason`` is False). ``device_type`` is torch's ("cuda" on ROCm too), ``name`` as from
    ``device_name``."""
    say = _log_once if log_reason else lambda message: None
    peak = env_peak()
    if peak is not None:
        return peak
    dtype = matmul_dtype(precision, device_type, param_dtype)
    if dtype is None:
        say(f"MFU not reported: no peak for train.precision={precision!r} (set ${PEAK_ENV})")
        return None
    if device_type == "cpu":
        dtype = "fp32" if dtype == "tf32" else dtype
        return spec_cpu_peak(dtype) or measured_cpu_peak(dtype)
    if device_type == "cuda":
        peak = table_peak(name, dtype)
        if peak is None:
            backend = f"ROCm {torch.version.hip}" if torch.version.hip else f"CUDA {torch.version.cuda}"
            say(
                f"MFU not reported: {name!r} ({backend}) has no {dtype} peak in train/throughput.PEAK_TABLE; "
                f"set ${PEAK_ENV} to its dense TFLOP/s per device"
            )
        return peak
    say(f"MFU not reported: no peak for device type {device_type!r} (set ${PEAK_ENV})")
    return None


def mfu(tokens_per_s_per_device: float, flops_per_token: float, peak_flops: float) -> float:
    """Model FLOPs utilisation: the fraction of one device's peak that the model's FLOPs use."""
    return tokens_per_s_per_device * flops_per_token / peak_flops
