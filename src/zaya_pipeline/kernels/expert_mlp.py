"""Triton kernels of the routed SwiGLU expert MLP (dropless, no padding copies), for CUDA, ROCm and the
CPU interpreter from one source. The autograd wrapper that launches them is ``ops.triton_expert_mlp``.

Rows are the routed (token, slot) pairs in expert-sorted order: expert e owns rows
``offsets[e] : offsets[e] + counts[e]``. Kernels gather token rows through ``sorted_pair_S`` instead of
materialising a permuted copy of x (ScatterMoE's idea), and an M tile never spans two experts: tile i of the
grid maps to (expert, first row) from the per-expert tile counts, recomputed in every program from
``counts_E`` so the tiling follows whatever BLOCK_M the autotuner picked, with no host sync.

Kernels:
* ``align_kernel`` — histogram + prefix sum → counts, offsets, the stable expert-sorted order and its inverse.
* ``gate_up_kernel`` — gathered x @ W_gate|up[e] with SwiGLU fused in the epilogue (stores gate|up and h).
* ``grouped_gemm_kernel`` — sorted rows @ W[e] (W transposed by strides): down forward, dX of gate|up.
* ``down_bwd_kernel`` — dy gathered @ W_down[e]^T, fused with the routing-weight grad and the SwiGLU backward.
* ``grouped_dw_kernel`` — per-expert A_e^T @ B_e over the expert's rows: dW_gate_up and dW_down.
* ``combine_kernel`` — the weighted top-k un-permute: y[t] = sum_k w[t, k] * rows[pos(t, k)].

Shape legend:
    T  tokens   K  experts per token   S  routed rows = T * K   E  experts
    D  model width   F  expert hidden width   N  output columns of a GEMM   R  reduction length
"""

from __future__ import annotations

import triton
import triton.language as tl

from zaya_pipeline.kernels.configs import combine_config, dw_configs, gemm_configs


@triton.jit
def _dot(a, b, acc, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    # UPCAST only under the interpreter (bf16 inputs), whose bf16 tl.dot is wrong; GPUs take bf16 natively.
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision=PRECISION)


@triton.jit
def _cast(x, dtype, UPCAST: tl.constexpr):
    """x.to(dtype), rounding to nearest even. The interpreter truncates fp32 -> bf16 instead, so under it
    (UPCAST) the rounding is done on the bits first; the final cast then only drops zero bits."""
    if UPCAST:
        bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(dtype)


@triton.jit
def _tile_rows(pid_m, counts_ptr, E, BLOCK_M: tl.constexpr, E_POW2: tl.constexpr):
    """(expert, its BLOCK_M rows, which of them are real) of M tile ``pid_m``; expert == E for the grid's
    spare tiles."""
    e_idx = tl.arange(0, E_POW2)
    counts = tl.load(counts_ptr + e_idx, mask=e_idx < E, other=0)
    tiles = (counts + BLOCK_M - 1) // BLOCK_M
    tile_end = tl.cumsum(tiles, 0)
    expert = tl.sum((tile_end <= pid_m).to(tl.int32), 0)  # number of experts whose tiles end before pid_m
    mine = e_idx == expert
    row_end = tl.sum(tl.where(mine, tl.cumsum(counts, 0), 0), 0)
    row_begin = row_end - tl.sum(tl.where(mine, counts, 0), 0)
    tile_begin = tl.sum(tl.where(mine, tile_end - tiles, 0), 0)
    rows = row_begin + (pid_m - tile_begin) * BLOCK_M + tl.arange(0, BLOCK_M)
    return expert, rows, rows < row_end


@triton.jit
def _rows_matmul(
    a_ptr, a_rows, stride_a, row_ok, b_base, stride_bk, stride_bn, cols, col_ok, K,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """fp32 (BLOCK_M, BLOCK_N) tile of A[a_rows, :K] @ B[:K, cols]: A rows by index (gathered or not),
    B by strides (so a transposed view costs nothing)."""
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        a = tl.load(
            a_ptr + a_rows.to(tl.int64)[:, None] * stride_a + ks[None, :],
            mask=row_ok[:, None] & k_ok[None, :], other=0.0,
        )  # fmt: skip
        b = tl.load(
            b_base + ks[:, None] * stride_bk + cols[None, :] * stride_bn,
            mask=k_ok[:, None] & col_ok[None, :], other=0.0,
        )  # fmt: skip
        acc = _dot(a, b, acc, UPCAST, PRECISION)
    return acc


@triton.jit
def align_kernel(
    ids_ptr, counts_ptr, offsets_ptr, sorted_pair_ptr, pair_pos_ptr, S, E,
    BLOCK_S: tl.constexpr, E_POW2: tl.constexpr,
):  # fmt: skip
    """One program: pass 1 counts rows per expert, pass 2 gives each row its stable place in its expert."""
    e_idx = tl.arange(0, E_POW2)
    counts = tl.zeros([E_POW2], dtype=tl.int32)
    for start in range(0, S, BLOCK_S):
        s = start + tl.arange(0, BLOCK_S)
        ids = tl.load(ids_ptr + s, mask=s < S, other=-1).to(tl.int32)
        counts += tl.sum((ids[:, None] == e_idx[None, :]).to(tl.int32), 0)
    ends = tl.cumsum(counts, 0)
    tl.store(counts_ptr + e_idx, counts, mask=e_idx < E)
    tl.store(offsets_ptr + 1 + e_idx, ends, mask=e_idx < E)
    tl.store(offsets_ptr + e_idx, ends - counts, mask=e_idx == 0)
    next_free = ends - counts
    for start in range(0, S, BLOCK_S):
        s = start + tl.arange(0, BLOCK_S)
        ids = tl.load(ids_ptr + s, mask=s < S, other=-1).to(tl.int32)
        onehot = (ids[:, None] == e_idx[None, :]).to(tl.int32)
        rank = tl.cumsum(onehot, 0) - onehot + next_free[None, :]
        pos = tl.sum(rank * onehot, 1)
        tl.store(pair_pos_ptr + s, pos, mask=s < S)
        tl.store(sorted_pair_ptr + pos, s, mask=s < S)
        next_free += tl.sum(onehot, 0)


@triton.jit
def _gate_up_kernel(
    x_ptr, w_ptr, gu_ptr, h_ptr, sorted_pair_ptr, counts_ptr,
    E, D, F, stride_xt, stride_we, stride_wd, stride_wf,
    TOP_K: tl.constexpr, E_POW2: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """gu[r] = x[token(r)] @ W_gu[e] for the rows r of expert e, and h[r] = silu(gate) * up.
    gu is (S, 2F), h (S, F)."""
    pid_n = tl.program_id(1)  # M tiles on axis 0: it has no 65535 limit, and neighbours share W columns
    expert, rows, row_ok = _tile_rows(tl.program_id(0), counts_ptr, E, BLOCK_M, E_POW2)
    if expert >= E:
        return
    token = tl.load(sorted_pair_ptr + rows, mask=row_ok, other=0) // TOP_K
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < F
    w_base = w_ptr + expert.to(tl.int64) * stride_we
    acc_gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, D, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < D
        a = tl.load(
            x_ptr + token.to(tl.int64)[:, None] * stride_xt + ks[None, :],
            mask=row_ok[:, None] & k_ok[None, :], other=0.0,
        )  # fmt: skip
        w_ptrs = w_base + ks[:, None] * stride_wd + cols[None, :] * stride_wf
        w_ok = k_ok[:, None] & col_ok[None, :]
        acc_gate = _dot(a, tl.load(w_ptrs, mask=w_ok, other=0.0), acc_gate, UPCAST, PRECISION)
        acc_up = _dot(a, tl.load(w_ptrs + F * stride_wf, mask=w_ok, other=0.0), acc_up, UPCAST, PRECISION)
    out_ok = row_ok[:, None] & col_ok[None, :]
    out_dtype = gu_ptr.dtype.element_ty
    gate = _cast(acc_gate, out_dtype, UPCAST)
    up = _cast(acc_up, out_dtype, UPCAST)
    gu_ptrs = gu_ptr + rows.to(tl.int64)[:, None] * (2 * F) + cols[None, :]
    tl.store(gu_ptrs, gate, mask=out_ok)
    tl.store(gu_ptrs + F, up, mask=out_ok)
    # h from the rounded gate/up: exactly what the backward recomputes from the saved gu
    gate32 = gate.to(tl.float32)
    h = gate32 * tl.sigmoid(gate32) * up.to(tl.float32)
    tl.store(h_ptr + rows.to(tl.int64)[:, None] * F + cols[None, :], _cast(h, out_dtype, UPCAST), mask=out_ok)


@triton.jit
def _grouped_gemm_kernel(
    a_ptr, b_ptr, c_ptr, counts_ptr, E, R, N,
    stride_am, stride_be, stride_br, stride_bn, stride_cm,
    E_POW2: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """c[r] = a[r] @ B[e] (R x N, any strides) for the expert-sorted rows r of expert e."""
    pid_n = tl.program_id(1)  # M tiles on axis 0: it has no 65535 limit, and neighbours share W columns
    expert, rows, row_ok = _tile_rows(tl.program_id(0), counts_ptr, E, BLOCK_M, E_POW2)
    if expert >= E:
        return
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    b_base = b_ptr + expert.to(tl.int64) * stride_be
    acc = _rows_matmul(
        a_ptr, rows, stride_am, row_ok, b_base, stride_br, stride_bn, cols, col_ok, R,
        UPCAST, PRECISION, BLOCK_M, BLOCK_N, BLOCK_K,
    )  # fmt: skip
    c_ptrs = c_ptr + rows.to(tl.int64)[:, None] * stride_cm + cols[None, :]
    tl.store(c_ptrs, _cast(acc, c_ptr.dtype.element_ty, UPCAST), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _down_bwd_kernel(
    dy_ptr, w_ptr, gu_ptr, route_w_ptr, dgu_ptr, dw_part_ptr, sorted_pair_ptr, counts_ptr,
    E, D, F, stride_dyt, stride_we, stride_wf, stride_wd, num_n_tiles,
    TOP_K: tl.constexpr, E_POW2: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """g = dy[token(r)] @ W_down[e]^T for the F columns of this tile, then in the epilogue:
    d(routing weight)[pair] partial = sum_f g * h (one partial per F tile, summed by the caller),
    dh = w * g, and the SwiGLU backward into dgu (S, 2F):
    d gate = dh * up * silu'(gate), d up = dh * silu(gate).
    """
    pid_n = tl.program_id(1)  # M tiles on axis 0: it has no 65535 limit, and neighbours share W columns
    expert, rows, row_ok = _tile_rows(tl.program_id(0), counts_ptr, E, BLOCK_M, E_POW2)
    if expert >= E:
        return
    pair = tl.load(sorted_pair_ptr + rows, mask=row_ok, other=0)
    token = pair // TOP_K
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # F columns
    col_ok = cols < F
    w_base = w_ptr + expert.to(tl.int64) * stride_we
    acc = _rows_matmul(  # W_down[e]^T by strides: element (d, f) of the (D, F) view
        dy_ptr, token, stride_dyt, row_ok, w_base, stride_wd, stride_wf, cols, col_ok, D,
        UPCAST, PRECISION, BLOCK_M, BLOCK_N, BLOCK_K,
    )  # fmt: skip
    ok = row_ok[:, None] & col_ok[None, :]
    gu_ptrs = gu_ptr + rows.to(tl.int64)[:, None] * (2 * F) + cols[None, :]
    gate = tl.load(gu_ptrs, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(gu_ptrs + F, mask=ok, other=0.0).to(tl.float32)
    sig = tl.sigmoid(gate)
    silu = gate * sig
    tl.store(dw_part_ptr + pair.to(tl.int64) * num_n_tiles + pid_n, tl.sum(acc * silu * up, 1), mask=row_ok)
    route_w = tl.load(route_w_ptr + pair, mask=row_ok, other=0.0).to(tl.float32)
    dh = acc * route_w[:, None]
    d_gate = dh * up * sig * (1.0 + gate * (1.0 - sig))
    out_dtype = dgu_ptr.dtype.element_ty
    dgu_ptrs = dgu_ptr + rows.to(tl.int64)[:, None] * (2 * F) + cols[None, :]
    tl.store(dgu_ptrs, _cast(d_gate, out_dtype, UPCAST), mask=ok)
    tl.store(dgu_ptrs + F, _cast(dh * silu, out_dtype, UPCAST), mask=ok)


@triton.jit
def _grouped_dw_kernel(
    a_ptr, b_ptr, dw_ptr, sorted_pair_ptr, route_w_ptr, offsets_ptr, M, N, F_SWIGLU,
    stride_a, stride_b, stride_we, stride_wm,
    TOP_K: tl.constexpr, A_GATHER: tl.constexpr, A_SWIGLU: tl.constexpr, B_GATHER: tl.constexpr,
    B_SCALE: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """dW[e] (M x N) = A_e^T @ B_e over expert e's rows. A row r is a[token(r)] (A_GATHER) or a[r], or
    silu(gate) * up recomputed from gu[r] (A_SWIGLU, M = F); B row r is b[token(r)] (B_GATHER) or b[r],
    times the routing weight (B_SCALE). An expert with no rows gets zeros."""
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    expert = tl.program_id(2)
    row_begin = tl.load(offsets_ptr + expert)
    row_end = tl.load(offsets_ptr + expert + 1)
    ms = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = ms < M
    ns = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = ns < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for r0 in range(row_begin, row_end, BLOCK_K):
        rows = r0 + tl.arange(0, BLOCK_K)
        r_ok = rows < row_end
        pair = tl.load(sorted_pair_ptr + rows, mask=r_ok, other=0)
        a_rows = rows
        if A_GATHER:
            a_rows = pair // TOP_K
        b_rows = rows
        if B_GATHER:
            b_rows = pair // TOP_K
        a_ok = m_ok[:, None] & r_ok[None, :]
        a_ptrs = a_ptr + a_rows.to(tl.int64)[None, :] * stride_a + ms[:, None]  # (BLOCK_M, BLOCK_K) = A^T
        a = tl.load(a_ptrs, mask=a_ok, other=0.0)
        if A_SWIGLU:
            gate = a.to(tl.float32)
            up = tl.load(a_ptrs + F_SWIGLU, mask=a_ok, other=0.0).to(tl.float32)
            a = _cast(gate * tl.sigmoid(gate) * up, a_ptr.dtype.element_ty, UPCAST)
        b = tl.load(
            b_ptr + b_rows.to(tl.int64)[:, None] * stride_b + ns[None, :],
            mask=r_ok[:, None] & n_ok[None, :], other=0.0,
        )  # fmt: skip
        if B_SCALE:
            route_w = tl.load(route_w_ptr + pair, mask=r_ok, other=0.0).to(tl.float32)
            b = _cast(b.to(tl.float32) * route_w[:, None], b_ptr.dtype.element_ty, UPCAST)
        acc = _dot(a, b, acc, UPCAST, PRECISION)
    dw_ptrs = dw_ptr + expert.to(tl.int64) * stride_we + ms[:, None] * stride_wm + ns[None, :]
    tl.store(dw_ptrs, _cast(acc, dw_ptr.dtype.element_ty, UPCAST), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _combine_kernel(
    rows_ptr, pair_pos_ptr, route_w_ptr, out_ptr, T, D,
    TOP_K: tl.constexpr, HAS_WEIGHTS: tl.constexpr, UPCAST: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """out[t] = sum_k w[t, k] * rows[pos(t, k)] (w = 1 without HAS_WEIGHTS), in fp32, in a fixed order."""
    ts = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = ts < T
    ds = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    ok = t_ok[:, None] & (ds < D)[None, :]
    acc = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        pair = ts * TOP_K + k
        pos = tl.load(pair_pos_ptr + pair, mask=t_ok, other=0)
        row = tl.load(rows_ptr + pos.to(tl.int64)[:, None] * D + ds[None, :], mask=ok, other=0.0)
        if HAS_WEIGHTS:
            route_w = tl.load(route_w_ptr + pair, mask=t_ok, other=0.0).to(tl.float32)
            row = row.to(tl.float32) * route_w[:, None]
        acc += row.to(tl.float32)
    out = _cast(acc, out_ptr.dtype.element_ty, UPCAST)
    tl.store(out_ptr + ts.to(tl.int64)[:, None] * D + ds[None, :], out, mask=ok)


_GEMM_KEY = ["N", "R"]
gate_up_kernel = triton.autotune(configs=gemm_configs(fused_pair=True), key=["D", "F"])(_gate_up_kernel)
grouped_gemm_kernel = triton.autotune(configs=gemm_configs(), key=_GEMM_KEY)(_grouped_gemm_kernel)
down_bwd_kernel = triton.autotune(  # partials of a config with a smaller BLOCK_N must not linger
    configs=gemm_configs(), key=["D", "F"], reset_to_zero=["dw_part_ptr"]
)(_down_bwd_kernel)
grouped_dw_kernel = triton.autotune(configs=dw_configs(), key=["M", "N"])(_grouped_dw_kernel)
combine_kernel = _combine_kernel
COMBINE_CONFIG = combine_config()
