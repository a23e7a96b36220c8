"""The ``triton`` backend of ``expert_mlp``: an autograd Function over ``zaya_pipeline.kernels.expert_mlp``.

Forward: permute (histogram + prefix sum) → gate|up GEMM with SwiGLU fused → down GEMM → weighted combine.
Saved for backward: the inputs, the gate|up pre-activations ``gu_S2F`` and the int32 routing maps; h and the
expert outputs are recomputed or folded away, so the backward holds less than the ``loop`` backend's autograd
graph (x gathered, gate|up, silu, h and the expert outputs).

Backward: ``down_bwd`` (dy @ W_down^T with the routing-weight grad and the SwiGLU backward fused) → dW_down
and dW_gate|up (grouped A^T B over each expert's rows) → dX rows (grouped GEMM) → unweighted combine to
tokens. Every reduction runs in a fixed order, so results are deterministic (no atomics).

Importing this module imports Triton. On a machine without a GPU it switches Triton to its interpreter
(``TRITON_INTERPRET=1``) before the kernels are defined, so CPU tensors work (slowly: for tests). The mode
is fixed per process at the first import.

Shape legend: T tokens, K experts per token, S = T * K rows, E experts, D model width, F expert hidden width.
"""

from __future__ import annotations

import os
import sys

import torch

# The interpreter must be on before Triton itself is imported (its own tl.* helpers are jit functions).
_TRITON_IMPORTED_FIRST = "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1"
if not torch.cuda.is_available() and not _TRITON_IMPORTED_FIRST:
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402

from zaya_pipeline.kernels import configs  # noqa: E402
from zaya_pipeline.kernels import expert_mlp as kernels  # noqa: E402
from zaya_pipeline.kernels.configs import interpreting  # noqa: E402
from zaya_pipeline.ops.autograd import register_expert_autograd  # noqa: E402


def _flags(dtype: torch.dtype) -> dict:
    """Constexpr flags of every kernel for inputs of ``dtype``."""
    return {
        "UPCAST": interpreting() and dtype == torch.bfloat16,
        # the interpreter's bf16 tl.dot is wrong and its bf16 cast truncates: upcast and round by hand there
        # fp32 inputs get exact fp32 products (not tf32): fp32 is the parity / debugging dtype here.
        # 16-bit inputs: the backend's default (gfx950 accepts no "tf32", so none is named)
        "PRECISION": "ieee" if dtype == torch.float32 else None,
    }


def _wide(S: int, T: int, D: int, F: int, E: int) -> bool:
    """Whether a tensor of the op has 2^31 elements or more, so the kernels need 64-bit row offsets."""
    return max(S * max(2 * F, D), T * D, E * D * 2 * F) >= 2**31


def permute(topk_ids_TK: torch.Tensor, num_experts: int):
    """Expert-sorted routing maps, on device with no host sync:
    (counts_E, offsets_E1, sorted_pair_S, pair_pos_S), all int32. Row p of the sorted order is pair
    ``sorted_pair_S[p]`` = token * K + slot; ``pair_pos_S`` is the inverse. Stable: ties keep pair order.
    Id ``num_experts`` (a slot with no expert) is one more bucket, after every expert's rows
    (from ``offsets_E1[-1]`` on), and is not counted in ``counts_E``.
    Three launches: per-block histograms and places run one program per block of rows; one program scans
    the (blocks x experts) counts between them."""
    ids_S = topk_ids_TK.reshape(-1).contiguous()
    S = ids_S.numel()
    device = ids_S.device
    e_pow2 = triton.next_power_of_2(num_experts + 1)  # the experts and the "no expert" bucket
    block_s = min(configs.permute_block(e_pow2), max(16, triton.next_power_of_2(max(S, 1))))
    num_blocks = max(1, triton.cdiv(S, block_s))
    counts_E = torch.empty(num_experts, dtype=torch.int32, device=device)
    offsets_E1 = torch.empty(num_experts + 1, dtype=torch.int32, device=device)
    sorted_pair_S = torch.empty(S, dtype=torch.int32, device=device)
    pair_pos_S = torch.empty(S, dtype=torch.int32, device=device)
    block_counts = torch.empty(num_blocks, e_pow2, dtype=torch.int32, device=device)
    block_base = torch.empty_like(block_counts)
    blocks = {"BLOCK_S": block_s, "E_POW2": e_pow2}
    kernels.count_kernel[(num_blocks,)](ids_S, block_counts, S, **blocks)
    kernels.scan_kernel[(1,)](
        block_counts, block_base, counts_E, offsets_E1, num_blocks, num_experts,
        BLOCK_B=max(1, min(triton.next_power_of_2(num_blocks), 4096 // e_pow2)), E_POW2=e_pow2,
    )  # fmt: skip
    kernels.place_kernel[(num_blocks,)](
        ids_S, block_base, offsets_E1, sorted_pair_S, pair_pos_S, S, num_experts, **blocks
    )  # fmt: skip
    return counts_E, offsets_E1, sorted_pair_S, pair_pos_S


def _row_grid(S: int, E: int, N: int):
    # 1D: (M tiles) x (N tiles); Σ_e ceil(c_e / BM) <= S / BM + E M tiles, and the spare ones exit at once
    return lambda meta: ((triton.cdiv(S, meta["BLOCK_M"]) + E) * triton.cdiv(N, meta["BLOCK_N"]),)


def _combine(rows_SD, routing, route_w_S, T: int, top_k: int, out_dtype, wide: bool) -> torch.Tensor:
    _, offsets_E1, _, pair_pos_S = routing
    D = rows_SD.shape[1]
    out_TD = torch.empty(T, D, dtype=out_dtype, device=rows_SD.device)
    cfg = kernels.COMBINE_CONFIG
    grid = (triton.cdiv(T, cfg["BLOCK_T"]), triton.cdiv(D, cfg["BLOCK_D"]))
    weights = route_w_S if route_w_S is not None else pair_pos_S  # unused pointer without HAS_WEIGHTS
    kernels.combine_kernel[grid](
        rows_SD, pair_pos_S, weights, offsets_E1, out_TD, T, D, offsets_E1.shape[0] - 1,
        TOP_K=top_k, HAS_WEIGHTS=route_w_S is not None,
        UPCAST=_flags(out_dtype)["UPCAST"], WIDE=wide, **cfg,
    )  # fmt: skip
    return out_TD


def _grouped_gemm(a_SR, w_ERN_view, counts_E, flags) -> torch.Tensor:
    """c[r] = a[r] @ W[e] for expert-sorted rows; ``w_ERN_view`` may be a transposed view (strides only)."""
    S, R = a_SR.shape
    E, _, N = w_ERN_view.shape
    c_SN = torch.empty(S, N, dtype=a_SR.dtype, device=a_SR.device)
    kernels.grouped_gemm_kernel[_row_grid(S, E, N)](
        a_SR, w_ERN_view, c_SN, counts_E, E, R, N,
        a_SR.stride(0), *w_ERN_view.stride(), c_SN.stride(0),
        E_POW2=triton.next_power_of_2(E), **flags, **configs.tile_order(),
    )  # fmt: skip
    return c_SN


def _grouped_dw(a, b, routing, M, N, E, top_k, *, a_gather, b_gather, dtype, flags):
    _, offsets_E1, sorted_pair_S, _ = routing
    dw_EMN = torch.empty(E, M, N, dtype=dtype, device=a.device)

    def grid(meta):
        return (triton.cdiv(N, meta["BLOCK_N"]), triton.cdiv(M, meta["BLOCK_M"]), E)

    kernels.grouped_dw_kernel[grid](
        a, b, dw_EMN, sorted_pair_S, offsets_E1, M, N,
        a.stride(0), b.stride(0), dw_EMN.stride(0), dw_EMN.stride(1),
        TOP_K=top_k, A_GATHER=a_gather, B_GATHER=b_gather, **flags,
    )  # fmt: skip
    return dw_EMN


# The op is a torch custom op (forward and backward), so torch.compile traces through it as one node; the
# forward returns what the backward needs as extra outputs (a custom op saves nothing itself).


@torch.library.custom_op("zaya::triton_expert_mlp", mutates_args=())
def _forward(
    x_TD: torch.Tensor,
    topk_ids_TK: torch.Tensor,
    topk_weights_TK: torch.Tensor,
    w_gate_up_EDF2: torch.Tensor,
    w_down_EFD: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y_TD, gu_S2F, counts_E, offsets_E1, sorted_pair_S, pair_pos_S)."""
    T, D = x_TD.shape
    E, _, F2 = w_gate_up_EDF2.shape
    F = F2 // 2
    top_k = topk_ids_TK.shape[1]
    S = T * top_k
    flags = _flags(x_TD.dtype) | {"WIDE": _wide(S, T, D, F, E)}
    route_w_S = topk_weights_TK.reshape(-1).contiguous()
    routing = permute(topk_ids_TK, E)
    counts_E, _, sorted_pair_S, _ = routing
    gu_S2F = torch.empty(S, 2 * F, dtype=x_TD.dtype, device=x_TD.device)
    h_SF = torch.empty(S, F, dtype=x_TD.dtype, device=x_TD.device)
    kernels.gate_up_kernel[_row_grid(S, E, F)](
        x_TD, w_gate_up_EDF2, gu_S2F, h_SF, sorted_pair_S, counts_E, E, D, F,
        x_TD.stride(0), *w_gate_up_EDF2.stride(),
        TOP_K=top_k, E_POW2=triton.next_power_of_2(E), **flags, **configs.tile_order(),
    )  # fmt: skip
    o_SD = _grouped_gemm(h_SF, w_down_EFD, counts_E, flags)
    del h_SF
    y_TD = _combine(o_SD, routing, route_w_S, T, top_k, x_TD.dtype, flags["WIDE"])
    return (y_TD, gu_S2F, *routing)


@_forward.register_fake
def _(x_TD, topk_ids_TK, topk_weights_TK, w_gate_up_EDF2, w_down_EFD):
    S, E = topk_ids_TK.numel(), w_gate_up_EDF2.shape[0]
    int32 = {"dtype": torch.int32, "device": x_TD.device}
    return (
        torch.empty_like(x_TD),
        x_TD.new_empty(S, w_gate_up_EDF2.shape[2]),
        torch.empty(E, **int32),
        torch.empty(E + 1, **int32),
        torch.empty(S, **int32),
        torch.empty(S, **int32),
    )


@torch.library.custom_op("zaya::triton_expert_mlp_backward", mutates_args=())
def _backward(
    dy_TD: torch.Tensor,
    x_TD: torch.Tensor,
    topk_weights_TK: torch.Tensor,
    w_gate_up_EDF2: torch.Tensor,
    w_down_EFD: torch.Tensor,
    gu_S2F: torch.Tensor,
    counts_E: torch.Tensor,
    offsets_E1: torch.Tensor,
    sorted_pair_S: torch.Tensor,
    pair_pos_S: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx_TD, d_weights_TK, dw_gate_up_EDF2, dw_down_EFD)."""
    routing = (counts_E, offsets_E1, sorted_pair_S, pair_pos_S)
    T, D = x_TD.shape
    E, F = w_down_EFD.shape[:2]
    top_k = topk_weights_TK.shape[1]
    S = T * top_k
    flags = _flags(x_TD.dtype) | {"WIDE": _wide(S, T, D, F, E)}
    route_w_S = topk_weights_TK.reshape(-1).contiguous()
    e_pow2 = triton.next_power_of_2(E)

    # dgu (S, 2F) and the routing-weight grad, in per-F-tile partials (fp32; zeroed for the autotuner)
    min_block_n = min(c.kwargs["BLOCK_N"] for c in kernels.down_bwd_kernel.configs)
    n_part = triton.cdiv(F, min_block_n)
    dw_part_SP = torch.zeros(S, n_part, dtype=torch.float32, device=x_TD.device)
    dgu_S2F = torch.empty_like(gu_S2F)
    hw_SF = torch.empty(S, F, dtype=gu_S2F.dtype, device=gu_S2F.device)  # w * h: dW_down's A operand
    kernels.down_bwd_kernel[_row_grid(S, E, F)](
        dy_TD, w_down_EFD, gu_S2F, route_w_S, dgu_S2F, hw_SF, dw_part_SP, sorted_pair_S, counts_E,
        E, D, F, dy_TD.stride(0), *w_down_EFD.stride(), n_part,
        TOP_K=top_k, E_POW2=e_pow2, **flags, **configs.tile_order(),
    )  # fmt: skip
    d_weights_TK = dw_part_SP.sum(1).to(topk_weights_TK.dtype).view_as(topk_weights_TK)

    common = {"E": E, "top_k": top_k, "routing": routing, "flags": flags}
    dw_down = _grouped_dw(
        hw_SF, dy_TD, M=F, N=D, a_gather=False, b_gather=True, dtype=w_down_EFD.dtype, **common
    )
    del hw_SF
    dw_gate_up = _grouped_dw(
        x_TD, dgu_S2F, M=D, N=2 * F, a_gather=True, b_gather=False, dtype=w_gate_up_EDF2.dtype, **common
    )  # fmt: skip
    dx_SD = _grouped_gemm(dgu_S2F, w_gate_up_EDF2.transpose(1, 2), counts_E, flags)
    dx_TD = _combine(dx_SD, routing, None, T, top_k, x_TD.dtype, flags["WIDE"])
    return dx_TD, d_weights_TK, dw_gate_up, dw_down


@_backward.register_fake
def _(dy_TD, x_TD, topk_weights_TK, w_gate_up_EDF2, w_down_EFD, *saved):
    return (
        torch.empty_like(x_TD),
        torch.empty_like(topk_weights_TK),
        torch.empty_like(w_gate_up_EDF2),
        torch.empty_like(w_down_EFD),
    )


# backward(dy, x_TD, topk_weights_TK, w_gate_up_EDF2, w_down_EFD, gu_S2F, *routing)
register_expert_autograd(_forward, _backward, lambda inputs, output: (inputs[0], *inputs[2:], *output[1:]))


def expert_mlp_triton(x_TD, topk_ids_TK, topk_weights_TK, w_gate_up_EDF2, w_down_EFD) -> torch.Tensor:
    """``expert_mlp`` on the Triton kernels (see the module docstring)."""
    if x_TD.dtype != w_gate_up_EDF2.dtype or x_TD.dtype != w_down_EFD.dtype:
        raise ValueError(
            f"expert_mlp(backend='triton'): x ({x_TD.dtype}) and the expert weights ({w_gate_up_EDF2.dtype}, "
            f"{w_down_EFD.dtype}) must share a dtype"
        )
    if x_TD.device.type == "cpu" and (_TRITON_IMPORTED_FIRST or not interpreting()):
        raise RuntimeError(
            "expert_mlp(backend='triton') got CPU tensors, but Triton was imported without its interpreter "
            "in this process; set TRITON_INTERPRET=1 before anything imports triton to run the kernels on CPU"
        )
    if x_TD.shape[0] == 0:
        return torch.zeros_like(x_TD)  # as the loop backend
    return _forward(x_TD.contiguous(), topk_ids_TK, topk_weights_TK, w_gate_up_EDF2, w_down_EFD)[0]
