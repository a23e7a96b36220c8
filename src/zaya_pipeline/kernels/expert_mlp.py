"""Triton kernels of the routed SwiGLU expert MLP (dropless, no padding copies), for CUDA, ROCm and the
CPU interpreter from one source. The autograd wrapper that launches them is ``ops.triton_expert_mlp``.

Rows are the routed (token, slot) pairs in expert-sorted order: expert e owns rows
``offsets[e] : offsets[e] + counts[e]``. Kernels gather token rows through ``sorted_pair_S`` instead of
materialising a permuted copy of x (ScatterMoE's idea), and an M tile never spans two experts: tile i of the
grid maps to (expert, first row) from the per-expert tile counts, recomputed in every program from
``counts_E`` so the tiling follows whatever BLOCK_M the autotuner picked, with no host sync.

Kernels:
* ``count_kernel``, ``scan_kernel``, ``place_kernel`` — the permutation: per-block histograms (many
  programs), one scan of the (blocks x experts) counts, then every row's stable place (many programs) →
  counts, offsets, the stable expert-sorted order and its inverse.
* ``gate_up_kernel`` — gathered x @ W_gate|up[e] with SwiGLU fused in the epilogue (stores gate|up and h).
* ``grouped_gemm_kernel`` — sorted rows @ W[e] (W transposed by strides): down forward, dX of gate|up.
* ``down_bwd_kernel`` — dy gathered @ W_down[e]^T, fused with the routing-weight grad, w * h for dW_down and
  the SwiGLU backward.
* ``grouped_dw_kernel`` — per-expert A_e^T @ B_e over the expert's rows: dW_gate_up and dW_down.

The row-tiled GEMMs run on a 1D grid in grouped tile order (``GROUP_M`` row tiles sweep the N tiles
together, for L2 reuse) and, on multi-XCD AMD GPUs, remapped so neighbouring tiles share an XCD.
* ``combine_kernel`` — the weighted top-k un-permute: y[t] = sum_k w[t, k] * rows[pos(t, k)].

Shape legend:
    T  tokens   K  experts per token   S  routed rows = T * K   E  experts
    D  model width   F  expert hidden width   N  output columns of a GEMM   R  reduction length
"""

from __future__ import annotations

import triton
import triton.language as tl

from zaya_pipeline.kernels.configs import combine_config, kernel_configs


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
def _idx(x, WIDE: tl.constexpr):
    """Row indices as offsets: int64 only when a tensor of the launch has 2^31 elements or more (the host
    sets WIDE). 32-bit offset tensors take half the registers, and the AMD backend turns loads with 32-bit
    offsets into buffer loads."""
    if WIDE:
        return x.to(tl.int64)
    return x


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
def _xcd_remap(pid, num_pids, NUM_XCDS: tl.constexpr):
    """The logical tile a workgroup takes, so that consecutive logical tiles run on one XCD.

    AMD's CDNA3/4 GPUs (MI300X, MI355X: 8 XCDs, each with its own L2) hand workgroup p to XCD p % NUM_XCDS.
    Remapped, XCD x runs the contiguous logical range of its workgroups, so tiles that share operands (the
    grouped order below) share that XCD's L2. A bijection on [0, num_pids) for any num_pids; NUM_XCDS = 1
    (NVIDIA, one-die AMD) is the identity."""
    if NUM_XCDS == 1:
        return pid
    xcd = pid % NUM_XCDS
    local = pid // NUM_XCDS
    per_xcd = num_pids // NUM_XCDS  # every XCD gets per_xcd workgroups, the first `extra` one more
    extra = num_pids % NUM_XCDS
    return xcd * per_xcd + tl.minimum(xcd, extra) + local


@triton.jit
def _grouped_order(pid, num_m, num_n, GROUP_M: tl.constexpr):
    """(M tile, N tile) of linear tile ``pid``: groups of GROUP_M M tiles sweep all N tiles before the next
    group starts, so a wave of programs reads GROUP_M row blocks and the weight columns they need, which stay
    in L2, rather than every row block once per N tile."""
    width = GROUP_M * num_n
    first_m = (pid // width) * GROUP_M
    rows_here = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (pid % width) % rows_here, (pid % width) // rows_here


@triton.jit
def _row_tile(counts_ptr, E, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, E_POW2: tl.constexpr,
              GROUP_M: tl.constexpr, NUM_XCDS: tl.constexpr):  # fmt: skip
    """(expert, rows, row_ok, N tile) of this program of a row-tiled GEMM on a 1D grid of
    (M tile upper bound) x (N tiles) programs."""
    num_n = tl.cdiv(N, BLOCK_N)
    num_pids = tl.num_programs(0)
    pid = _xcd_remap(tl.program_id(0), num_pids, NUM_XCDS)
    pid_m, pid_n = _grouped_order(pid, num_pids // num_n, num_n, GROUP_M)
    expert, rows, row_ok = _tile_rows(pid_m, counts_ptr, E, BLOCK_M, E_POW2)
    return expert, rows, row_ok, pid_n


@triton.jit
def _rows_matmul(
    a_ptr, a_rows, stride_a, row_ok, b_base, stride_bk, stride_bn, cols, col_ok, K,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr, WIDE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """fp32 (BLOCK_M, BLOCK_N) tile of A[a_rows, :K] @ B[:K, cols]: A rows by index (gathered or not),
    B by strides (so a transposed view costs nothing)."""
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        a = tl.load(
            a_ptr + _idx(a_rows, WIDE)[:, None] * stride_a + ks[None, :],
            mask=row_ok[:, None] & k_ok[None, :], other=0.0,
        )  # fmt: skip
        b = tl.load(
            b_base + ks[:, None] * stride_bk + cols[None, :] * stride_bn,
            mask=k_ok[:, None] & col_ok[None, :], other=0.0,
        )  # fmt: skip
        acc = _dot(a, b, acc, UPCAST, PRECISION)
    return acc


@triton.jit
def count_kernel(ids_ptr, block_counts_ptr, S, BLOCK_S: tl.constexpr, E_POW2: tl.constexpr):
    """Permutation pass 1 (one program per block of BLOCK_S rows): rows per expert in this block."""
    b = tl.program_id(0)
    e_idx = tl.arange(0, E_POW2)
    s = b * BLOCK_S + tl.arange(0, BLOCK_S)
    ids = tl.load(ids_ptr + s, mask=s < S, other=-1).to(tl.int32)
    counts = tl.sum((ids[:, None] == e_idx[None, :]).to(tl.int32), 0)
    tl.store(block_counts_ptr + b * E_POW2 + e_idx, counts)


@triton.jit
def scan_kernel(
    block_counts_ptr, block_base_ptr, counts_ptr, offsets_ptr, num_blocks, E,
    BLOCK_B: tl.constexpr, E_POW2: tl.constexpr,
):  # fmt: skip
    """Permutation pass 2 (one program, over num_blocks x E counts): each block's first place within each
    expert (block_base), the per-expert counts and the expert offsets."""
    e_idx = tl.arange(0, E_POW2)
    total = tl.zeros([E_POW2], dtype=tl.int32)
    for b0 in range(0, num_blocks, BLOCK_B):
        bs = b0 + tl.arange(0, BLOCK_B)
        ptrs = bs[:, None] * E_POW2 + e_idx[None, :]
        ok = (bs < num_blocks)[:, None]
        c = tl.load(block_counts_ptr + ptrs, mask=ok, other=0)
        tl.store(block_base_ptr + ptrs, tl.cumsum(c, 0) - c + total[None, :], mask=ok)
        total += tl.sum(c, 0)
    ends = tl.cumsum(total, 0)
    tl.store(counts_ptr + e_idx, total, mask=e_idx < E)
    tl.store(offsets_ptr + 1 + e_idx, ends, mask=e_idx < E)
    tl.store(offsets_ptr + e_idx, ends - total, mask=e_idx == 0)


@triton.jit
def place_kernel(
    ids_ptr, block_base_ptr, offsets_ptr, sorted_pair_ptr, pair_pos_ptr, S, E,
    BLOCK_S: tl.constexpr, E_POW2: tl.constexpr,
):  # fmt: skip
    """Permutation pass 3 (one program per block): each row's stable place, expert offset + the block's
    base within the expert + its rank among the block's rows of that expert."""
    b = tl.program_id(0)
    e_idx = tl.arange(0, E_POW2)
    s = b * BLOCK_S + tl.arange(0, BLOCK_S)
    ids = tl.load(ids_ptr + s, mask=s < S, other=-1).to(tl.int32)
    onehot = (ids[:, None] == e_idx[None, :]).to(tl.int32)
    base = tl.load(block_base_ptr + b * E_POW2 + e_idx) + tl.load(
        offsets_ptr + e_idx, mask=e_idx <= E, other=0
    )
    rank = tl.cumsum(onehot, 0) - onehot + base[None, :]
    pos = tl.sum(rank * onehot, 1)
    tl.store(pair_pos_ptr + s, pos, mask=s < S)
    tl.store(sorted_pair_ptr + pos, s, mask=s < S)


@triton.jit
def _gate_up_kernel(
    x_ptr, w_ptr, gu_ptr, h_ptr, sorted_pair_ptr, counts_ptr,
    E, D, F, stride_xt, stride_we, stride_wd, stride_wf,
    TOP_K: tl.constexpr, E_POW2: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr, WIDE: tl.constexpr,
    GROUP_M: tl.constexpr, NUM_XCDS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """gu[r] = x[token(r)] @ W_gu[e] for the rows r of expert e, and h[r] = silu(gate) * up.
    gu is (S, 2F), h (S, F)."""
    expert, rows, row_ok, pid_n = _row_tile(counts_ptr, E, F, BLOCK_M, BLOCK_N, E_POW2, GROUP_M, NUM_XCDS)
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
            x_ptr + _idx(token, WIDE)[:, None] * stride_xt + ks[None, :],
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
    gu_ptrs = gu_ptr + _idx(rows, WIDE)[:, None] * (2 * F) + cols[None, :]
    tl.store(gu_ptrs, gate, mask=out_ok)
    tl.store(gu_ptrs + F, up, mask=out_ok)
    # h from the rounded gate/up: exactly what the backward recomputes from the saved gu
    gate32 = gate.to(tl.float32)
    h = gate32 * tl.sigmoid(gate32) * up.to(tl.float32)
    tl.store(h_ptr + _idx(rows, WIDE)[:, None] * F + cols[None, :], _cast(h, out_dtype, UPCAST), mask=out_ok)


@triton.jit
def _grouped_gemm_kernel(
    a_ptr, b_ptr, c_ptr, counts_ptr, E, R, N,
    stride_am, stride_be, stride_br, stride_bn, stride_cm,
    E_POW2: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr, WIDE: tl.constexpr,
    GROUP_M: tl.constexpr, NUM_XCDS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """c[r] = a[r] @ B[e] (R x N, any strides) for the expert-sorted rows r of expert e."""
    expert, rows, row_ok, pid_n = _row_tile(counts_ptr, E, N, BLOCK_M, BLOCK_N, E_POW2, GROUP_M, NUM_XCDS)
    if expert >= E:
        return
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    b_base = b_ptr + expert.to(tl.int64) * stride_be
    acc = _rows_matmul(
        a_ptr, rows, stride_am, row_ok, b_base, stride_br, stride_bn, cols, col_ok, R,
        UPCAST, PRECISION, WIDE, BLOCK_M, BLOCK_N, BLOCK_K,
    )  # fmt: skip
    c_ptrs = c_ptr + _idx(rows, WIDE)[:, None] * stride_cm + cols[None, :]
    tl.store(c_ptrs, _cast(acc, c_ptr.dtype.element_ty, UPCAST), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _down_bwd_kernel(
    dy_ptr, w_ptr, gu_ptr, route_w_ptr, dgu_ptr, hw_ptr, dw_part_ptr, sorted_pair_ptr, counts_ptr,
    E, D, F, stride_dyt, stride_we, stride_wf, stride_wd, num_n_tiles,
    TOP_K: tl.constexpr, E_POW2: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr, WIDE: tl.constexpr,
    GROUP_M: tl.constexpr, NUM_XCDS: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """g = dy[token(r)] @ W_down[e]^T for the F columns of this tile, then in the epilogue:
    d(routing weight)[pair] partial = sum_f g * h (one partial per F tile, summed by the caller),
    hw = w * h (hw_ptr, (S, F): the A operand of dW_down, so that kernel neither recomputes the SwiGLU nor
    scales its B rows), dh = w * g, and the SwiGLU backward into dgu (S, 2F):
    d gate = dh * up * silu'(gate), d up = dh * silu(gate).
    """
    expert, rows, row_ok, pid_n = _row_tile(counts_ptr, E, F, BLOCK_M, BLOCK_N, E_POW2, GROUP_M, NUM_XCDS)
    if expert >= E:
        return
    pair = tl.load(sorted_pair_ptr + rows, mask=row_ok, other=0)
    token = pair // TOP_K
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)  # F columns
    col_ok = cols < F
    w_base = w_ptr + expert.to(tl.int64) * stride_we
    acc = _rows_matmul(  # W_down[e]^T by strides: element (d, f) of the (D, F) view
        dy_ptr, token, stride_dyt, row_ok, w_base, stride_wd, stride_wf, cols, col_ok, D,
        UPCAST, PRECISION, WIDE, BLOCK_M, BLOCK_N, BLOCK_K,
    )  # fmt: skip
    ok = row_ok[:, None] & col_ok[None, :]
    out_dtype = dgu_ptr.dtype.element_ty
    route_w = tl.load(route_w_ptr + pair, mask=row_ok, other=0.0).to(tl.float32)
    # The epilogue is ordered so that at most four (BLOCK_M, BLOCK_N) fp32 tiles are live next to the
    # addresses (acc, silu, dsilu, up), and one offset tensor serves gu and dgu: the static report
    # (zaya kernels) showed the straightforward order spilling on every target.
    offs = _idx(rows, WIDE)[:, None] * (2 * F) + cols[None, :]
    gate = tl.load(gu_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    sig = tl.sigmoid(gate)
    silu = gate * sig
    dsilu = sig + silu * (1.0 - sig)  # d silu / d gate
    dh = acc * route_w[:, None]
    tl.store(dgu_ptr + offs + F, _cast(dh * silu, out_dtype, UPCAST), mask=ok)
    up = tl.load(gu_ptr + offs + F, mask=ok, other=0.0).to(tl.float32)
    tl.store(dgu_ptr + offs, _cast(dh * up * dsilu, out_dtype, UPCAST), mask=ok)
    h = silu * up
    tl.store(dw_part_ptr + _idx(pair, WIDE) * num_n_tiles + pid_n, tl.sum(acc * h, 1), mask=row_ok)
    h_offs = _idx(rows, WIDE)[:, None] * F + cols[None, :]
    tl.store(hw_ptr + h_offs, _cast(h * route_w[:, None], out_dtype, UPCAST), mask=ok)


@triton.jit
def _grouped_dw_kernel(
    a_ptr, b_ptr, dw_ptr, sorted_pair_ptr, offsets_ptr, M, N,
    stride_a, stride_b, stride_we, stride_wm,
    TOP_K: tl.constexpr, A_GATHER: tl.constexpr, B_GATHER: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr, WIDE: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """dW[e] (M x N) = A_e^T @ B_e over expert e's rows. A row r is a[token(r)] (A_GATHER) or a[r]; B row r
    is b[token(r)] (B_GATHER) or b[r]. An expert with no rows gets zeros."""
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
        a_rows = rows
        b_rows = rows
        if A_GATHER or B_GATHER:
            token = tl.load(sorted_pair_ptr + rows, mask=r_ok, other=0) // TOP_K
            if A_GATHER:
                a_rows = token
            if B_GATHER:
                b_rows = token
        a = tl.load(  # (BLOCK_M, BLOCK_K) = A^T
            a_ptr + _idx(a_rows, WIDE)[None, :] * stride_a + ms[:, None],
            mask=m_ok[:, None] & r_ok[None, :], other=0.0,
        )  # fmt: skip
        b = tl.load(
            b_ptr + _idx(b_rows, WIDE)[:, None] * stride_b + ns[None, :],
            mask=r_ok[:, None] & n_ok[None, :], other=0.0,
        )  # fmt: skip
        acc = _dot(a, b, acc, UPCAST, PRECISION)
    dw_ptrs = dw_ptr + expert.to(tl.int64) * stride_we + ms[:, None] * stride_wm + ns[None, :]
    tl.store(dw_ptrs, _cast(acc, dw_ptr.dtype.element_ty, UPCAST), mask=m_ok[:, None] & n_ok[None, :])


@triton.jit
def _combine_kernel(
    rows_ptr, pair_pos_ptr, route_w_ptr, offsets_ptr, out_ptr, T, D, E,
    TOP_K: tl.constexpr, HAS_WEIGHTS: tl.constexpr, UPCAST: tl.constexpr, WIDE: tl.constexpr,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """out[t] = sum_k w[t, k] * rows[pos(t, k)] (w = 1 without HAS_WEIGHTS), in fp32, in a fixed order.
    Slots with no expert (id E) sort past the experts' rows, at pos >= offsets[E]; their rows were never
    written and are not read."""
    ts = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = ts < T
    ds = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    d_ok = (ds < D)[None, :]
    routed_rows = tl.load(offsets_ptr + E)
    acc = tl.zeros([BLOCK_T, BLOCK_D], dtype=tl.float32)
    for k in tl.static_range(TOP_K):
        pair = ts * TOP_K + k
        pos = tl.load(pair_pos_ptr + pair, mask=t_ok, other=0)
        ok = (t_ok & (pos < routed_rows))[:, None] & d_ok
        row = tl.load(rows_ptr + _idx(pos, WIDE)[:, None] * D + ds[None, :], mask=ok, other=0.0)
        if HAS_WEIGHTS:
            route_w = tl.load(route_w_ptr + pair, mask=t_ok, other=0.0).to(tl.float32)
            row = row.to(tl.float32) * route_w[:, None]
        acc += row.to(tl.float32)
    out = _cast(acc, out_ptr.dtype.element_ty, UPCAST)
    tl.store(out_ptr + _idx(ts, WIDE)[:, None] * D + ds[None, :], out, mask=t_ok[:, None] & d_ok)


_GEMM_KEY = ["N", "R"]
gate_up_kernel = triton.autotune(configs=kernel_configs("gate_up"), key=["D", "F"])(_gate_up_kernel)
grouped_gemm_kernel = triton.autotune(configs=kernel_configs("grouped_gemm"), key=_GEMM_KEY)(
    _grouped_gemm_kernel
)
down_bwd_kernel = triton.autotune(  # partials of a config with a smaller BLOCK_N must not linger
    configs=kernel_configs("down_bwd"), key=["D", "F"], reset_to_zero=["dw_part_ptr"]
)(_down_bwd_kernel)
grouped_dw_kernel = triton.autotune(configs=kernel_configs("grouped_dw"), key=["M", "N"])(_grouped_dw_kernel)
combine_kernel = _combine_kernel
COMBINE_CONFIG = combine_config()
