"""Tuning tables of the expert-MLP kernels, one per vendor, picked at import time.

* Interpreter (``TRITON_INTERPRET=1``, CPU tests): one config. The interpreter costs per program instance and
  cannot autotune several configs ("0 active drivers"), so a single, moderately big block.
* CUDA (tuned for Hopper, H100/H200; valid on Ampere): 128x128 / 128x64 / 64x128 tiles, BLOCK_K 64,
  3-4 pipeline stages (Hopper's shared memory holds 4 stages of 128x64 bf16 tiles of both operands).
* ROCm (MI300X, CDNA3 gfx942), selected when ``torch.version.hip`` is set. The AMD backend takes extra
  compile options as config keys:
    - ``waves_per_eu``: occupancy hint (wavefronts per SIMD); 2 lets the compiler use up to half of the
      512 VGPRs per lane for the accumulators of a 128x128 fp32 tile, 0 leaves the choice to the compiler.
    - ``matrix_instr_nonkdim``: the MFMA instruction shape; 16 selects 16x16xK MFMAs, which keep the
      LDS-to-register traffic lower than 32x32 for these tile sizes on CDNA3.
    - ``kpack``: K elements packed per MFMA operand load; 2 doubles the width of each shared-memory read on
      gfx942 (deprecated and forced to 1 from gfx950 on, where it has no effect).
  ``num_stages=2``: the AMD stream pipeliner double-buffers global loads; more stages only cost LDS.
  ``num_warps`` counts 64-wide wavefronts on AMD, so 4 warps = 256 threads, as 8 warps on NVIDIA.
  **These ROCm configs have not been run: no AMD GPU was available.** They follow AMD's published Triton
  tuning guidance for MI300X; autotuning picks among them on the device.

``ZAYA_TRITON_AUTOTUNE=0`` (set before the import) keeps only the first config of the table: the GPU tests
use it, since they would otherwise compile every config for each of their shapes.

The gate|up kernel keeps two accumulators (gate and up), so its tiles are half as wide in N.
"""

from __future__ import annotations

import os

import triton


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def is_rocm() -> bool:
    import torch

    return torch.version.hip is not None


_INTERPRETER_BLOCK = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64}

# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages)
_CUDA_GEMM = [
    (128, 128, 64, 8, 3),
    (128, 128, 64, 4, 4),
    (128, 64, 64, 4, 4),
    (64, 128, 64, 4, 4),
    (128, 256, 64, 8, 3),
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


def _configs(fused_pair: bool) -> list[triton.Config]:
    if interpreting():
        return [triton.Config(dict(_INTERPRETER_BLOCK), num_warps=4, num_stages=1)]
    configs = []
    if is_rocm():
        for bm, bn, bk, warps, waves, nonk, kpack in _ROCM_GEMM:
            bn = bn // 2 if fused_pair else bn
            meta = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}
            meta.update(waves_per_eu=waves, matrix_instr_nonkdim=nonk, kpack=kpack)
            configs.append(triton.Config(meta, num_warps=warps, num_stages=2))
    else:
        for bm, bn, bk, warps, stages in _CUDA_GEMM:
            bn = bn // 2 if fused_pair else bn
            meta = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}
            configs.append(triton.Config(meta, num_warps=warps, num_stages=stages))
    unique = {}
    for c in configs:  # halving N for the fused pair can collapse two entries into one
        unique.setdefault((tuple(sorted(c.kwargs.items())), c.num_warps, c.num_stages), c)
    if os.environ.get("ZAYA_TRITON_AUTOTUNE", "1") == "0":  # GPU tests: compile one config per shape only
        return list(unique.values())[:1]
    return list(unique.values())


def gemm_configs(fused_pair: bool = False) -> list[triton.Config]:
    """Configs of the row-tiled grouped GEMMs (gate|up forward, down forward, dX, down backward)."""
    return _configs(fused_pair)


def dw_configs() -> list[triton.Config]:
    """Configs of the weight-gradient kernel (tiles over the weight, reduction over the expert's rows)."""
    return _configs(False)


def combine_config() -> dict[str, int]:
    """Block sizes of the memory-bound top-k combine (no tl.dot, so no autotuning needed)."""
    if interpreting():
        return {"BLOCK_T": 64, "BLOCK_D": 128}
    return {"BLOCK_T": 16, "BLOCK_D": 256}
