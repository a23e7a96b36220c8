"""The row-tiled GEMMs' tile order (kernels.expert_mlp._xcd_remap, _grouped_order), run under the Triton
interpreter: every grid maps one-to-one onto its tiles, for any grid and XCD count, and the remap gives each
XCD a contiguous range of logical tiles."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from zaya_pipeline.kernels.expert_mlp import _grouped_order, _xcd_remap  # noqa: E402
from zaya_pipeline.ops import triton_expert_mlp  # noqa: E402,F401  (switches Triton to its interpreter on CPU)


@triton.jit
def _order_kernel(out_ptr, num_n, NUM_XCDS: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    num_pids = tl.num_programs(0)
    logical = _xcd_remap(pid, num_pids, NUM_XCDS)
    pid_m, pid_n = _grouped_order(logical, num_pids // num_n, num_n, GROUP_M)
    tl.store(out_ptr + pid * 3, logical)
    tl.store(out_ptr + pid * 3 + 1, pid_m)
    tl.store(out_ptr + pid * 3 + 2, pid_n)


@pytest.mark.parametrize(
    "num_m,num_n,xcds,group_m", [(7, 3, 8, 2), (16, 4, 8, 8), (5, 5, 3, 4), (9, 2, 1, 8), (1, 1, 8, 8)]
)
def test_tile_order_is_a_bijection(num_m, num_n, xcds, group_m):
    grid = num_m * num_n
    out = torch.full((grid, 3), -1, dtype=torch.int32)
    _order_kernel[(grid,)](out, num_n, NUM_XCDS=xcds, GROUP_M=group_m)
    logical, m, n = out.T.tolist()
    assert sorted(logical) == list(range(grid))
    assert sorted(zip(m, n, strict=True)) == [(i, j) for i in range(num_m) for j in range(num_n)]
    # workgroup p runs on XCD p % xcds; each XCD's logical tiles are one contiguous range
    for x in range(xcds):
        mine = sorted(logical[p] for p in range(x, grid, xcds))
        assert mine == list(range(mine[0], mine[0] + len(mine))) if mine else True
    # the grouped order: the first group_m * num_n logical tiles cover group_m row tiles, all columns
    first = {(m[p], n[p]) for p in range(grid) if logical[p] < min(group_m, num_m) * num_n}
    assert first == {(i, j) for i in range(min(group_m, num_m)) for j in range(num_n)}
