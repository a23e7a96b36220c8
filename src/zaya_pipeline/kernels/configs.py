"""Tuning tables of the expert-MLP kernels: one table per (vendor, kernel), the vendor picked at import time.

* Interpreter (``TRITON_INTERPRET=1``, CPU tests): one config. The interpreter costs per program instance and
  cannot autotune several configs ("0 active drivers"), so a single, moderately big block.
* CUDA (tuned for Hopper, H100/H200; valid on Ampere): 128x128 / 128x64 / 64x128 tiles, BLOCK_K 64,
  3-4 pipeline stages (Hopper's shared memory holds 4 stages of 128x64 bf16 tiles of both operands).
* ROCm (MI300X, CDNA3 gfx942; the same table is compiled for gfx950 and gfx90a by the static report),
  selected when ``torch.version.hip`` is set. The AMD backend takes extra compile options as config keys:
    - ``waves_per_eu``: occupancy hint (wavefronts per SIMD); 2 lets the compiler use up to half of the
      512 VGPRs per lane for the accumulators of a 128x128 fp32 tile, 0 leaves the choice to the compiler.
    - ``matrix_instr_nonkdim``: the MFMA instruction shape; 16 selects 16x16xK MFMAs, which keep the
      LDS-to-register traffic lower than 32x32 for these tile sizes on CDNA3.
    - ``kpack``: K elements packed per MFMA operand load; 2 doubles the width of each shared-memory read on
      gfx942 (deprecated and forced to 1 from gfx950 on, where it has no effect).
  ``num_stages=2``: the AMD stream pipeliner double-buffers global loads; more stages only cost LDS.
  ``num_warps`` counts 64-wide wavefronts on AMD, so 4 warps = 256 threads, as 8 warps on NVIDIA.
  **These ROCm configs have not been run: no AMD GPU was available.** They are checked statically (every
  config compiles for gfx942, gfx950 and gfx90a without spills and within the LDS: ``zaya kernels``,
  docs/kernels.md); autotuning picks among them on the device.

``ZAYA_TRITON_AUTOTUNE=0`` (set before the import) keeps only the first config of each table: the GPU tests
use it, since they would otherwise compile every config for each of their shapes.

Why each table holds what it holds is argued from the static report in docs/kernels.md.
"""

from __future__ import annotations

import os

import triton

# kernel (as named in kernels/expert_mlp.py, without "_kernel") -> the table it autotunes over
KERNEL_TABLE = {"gate_up": "gate_up", "grouped_gemm": "gemm", "down_bwd": "down_bwd", "grouped_dw": "dw"}


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def is_rocm() -> bool:
    import torch

    return torch.version.hip is not None


def runtime_vendor() -> str:
    return "rocm" if is_rocm() else "cuda"


_INTERPRETER_BLOCK = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64}

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages). Every row must compile without spills for sm_90 and
# sm_80 (the static report's test): the 128x128 tile runs with 8 warps, as 4 warps hold 128 fp32 accumulators
# per thread and spill on sm_80; 128x256 spills on sm_80 (and twice over in the gate|up pair).
_CUDA_GEMM = [
    (128, 128, 64, 8, 3),
    (128, 128, 64, 8, 4),
    (128, 64, 64, 4, 4),
    (64, 128, 64, 4, 4),
    (64, 64, 64, 4, 4),
]
# down_bwd's epilogue (the SwiGLU backward, w * h and the routing-weight grad) keeps four fp32 tiles live
# next to the accumulator: at most 32 accumulator elements per thread fit without spilling on NVIDIA.
_CUDA_DOWN_BWD = [
    (128, 64, 64, 8, 3),
    (64, 128, 64, 8, 3),
    (128, 64, 64, 8, 4),
    (64, 64, 64, 4, 4),
]
# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, waves_per_eu, matrix_instr_nonkdim, kpack)
_ROCM_GEMM = [
    (128, 128, 64, 8, 2, 16, 2),
    (128, 128, 64, 4, 2, 16, 2),
    (256, 128, 64, 8, 2, 16, 2),
    (128, 64, 64, 4, 0, 16, 2),
    (64, 128, 64, 4, 0, 16, 2),
    (64, 64, 64, 4, 0, 16, 1),
]
# 512 VGPRs (with AGPRs) per lane hold down_bwd's epilogue at 64 accumulator elements per lane, not 128
_ROCM_DOWN_BWD = [
    (128, 128, 64, 8, 2, 16, 2),
    (128, 64, 64, 4, 0, 16, 2),
    (64, 128, 64, 4, 0, 16, 2),
    (64, 64, 64, 4, 0, 16, 1),
]
_TABLES = {
    "cuda": {"gemm": _CUDA_GEMM, "gate_up": _CUDA_GEMM, "down_bwd": _CUDA_DOWN_BWD, "dw": _CUDA_GEMM},
    "rocm": {"gemm": _ROCM_GEMM, "gate_up": _ROCM_GEMM, "down_bwd": _ROCM_DOWN_BWD, "dw": _ROCM_GEMM},
}
_HALF_N = {"gate_up"}  # two accumulators (gate and up): tiles half as wide in N


def table(name: str, vendor: str, arch: str = "") -> list[triton.Config]:
    """Every config of tuning table ``name`` ("gemm", "gate_up", "down_bwd", "dw") for ``vendor``, whatever
    machine this runs on (the static report compiles them all). ``arch`` gfx950 takes kpack 1 (the compiler
    forces it there)."""
    configs = []
    for row in _TABLES[vendor][name]:
        bm, bn, bk, warps = row[:4]
        bn = bn // 2 if name in _HALF_N else bn
        meta = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}
        if vendor == "rocm":
            waves, nonk, kpack = row[4:]
            kpack = 1 if arch == "gfx950" else kpack
            meta.update(waves_per_eu=waves, matrix_instr_nonkdim=nonk, kpack=kpack)
            configs.append(triton.Config(meta, num_warps=warps, num_stages=2))
        else:
            configs.append(triton.Config(meta, num_warps=warps, num_stages=row[4]))
    unique = {}
    for c in configs:  # halving N can collapse two entries into one
        unique.setdefault((tuple(sorted(c.kwargs.items())), c.num_warps, c.num_stages), c)
    return list(unique.values())


def kernel_configs(kernel: str) -> list[triton.Config]:
    """The configs ``kernel`` autotunes over in this process: the interpreter's single config, or the table of
    the runtime's vendor (only its first config with ``ZAYA_TRITON_AUTOTUNE=0``)."""
    if interpreting():
        return [triton.Config(dict(_INTERPRETER_BLOCK), num_warps=4, num_stages=1)]
    configs = table(KERNEL_TABLE[kernel], runtime_vendor(), rocm_arch())
    if os.environ.get("ZAYA_TRITON_AUTOTUNE", "1") == "0":  # GPU tests: compile one config per shape only
        return configs[:1]
    return configs


def rocm_arch() -> str:
    """gfx942, gfx950, ... of this process's AMD GPU; "" elsewhere."""
    import torch

    if interpreting() or torch.version.hip is None:
        return ""
    return getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "gcnArchName", "").split(
        ":"
    )[0]


def xcd_count() -> int:
    """XCDs (dies with their own L2) of this process's GPU: 8 on MI300X / MI325X / MI355X (gfx942, gfx950;
    MI300A's 6 are told apart by its 228 CUs), else 1. Under the interpreter 3, so that the CPU parity tests
    run the remap (with a count that divides no grid evenly)."""
    if interpreting():
        return 3
    if rocm_arch() in ("gfx942", "gfx950"):
        import torch

        return (
            6
            if torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count == 228
            else 8
        )
    return 1


def tile_order() -> dict[str, int]:
    """Constexprs of the row-tiled GEMMs' tile order (kernels._row_tile): GROUP_M row tiles per group (2 under
    the interpreter, so small test problems span several groups) and the XCD count."""
    return {"GROUP_M": 2 if interpreting() else 8, "NUM_XCDS": xcd_count()}


def permute_block(num_experts_pow2: int) -> int:
    """Rows per program of the permutation kernels: a (rows x experts) one-hot of 4096 elements on a GPU
    (registers); 1024 under the interpreter, so that the tests' small batches span several blocks."""
    budget = 1 << 10 if interpreting() else 1 << 12
    return max(16, budget // num_experts_pow2)


def combine_config() -> dict[str, int]:
    """Block sizes of the memory-bound top-k combine (no tl.dot, so no autotuning needed)."""
    if interpreting():
        return {"BLOCK_T": 64, "BLOCK_D": 128}
    return {"BLOCK_T": 16, "BLOCK_D": 256}
