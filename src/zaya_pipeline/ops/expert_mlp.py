"""Routed SwiGLU expert MLP: ``y_TD = sum_k w_TK[:, k] * SwiGLU_{ids_TK[:, k]}(x_TD)``, dropless.

Backends (forward and backward for all):
* ``loop`` — the plain-torch reference: sort the (token, slot) pairs by expert, one pair of matmuls per expert
  that received tokens, ``index_add`` back. Autograd comes from the torch ops.
* ``grouped_mm`` — the same sort, then ``torch.nn.functional.grouped_mm`` over the expert-sorted rows (one
  call per projection, no per-expert Python loop and no host sync).
* ``triton`` — our kernels (``zaya_pipeline.kernels``) behind an autograd Function
  (``ops.triton_expert_mlp``): permutation by histogram + prefix sum, gathered grouped GEMMs with SwiGLU
  fused in, a top-k combine. On a CPU tensor it runs under the Triton interpreter (tests only: it is slow).
* ``auto`` — the best available backend for the tensor's device and dtype (see ``pick_backend``).

Shape legend:
    T  tokens            D  model width         F  expert hidden width
    E  experts           K  experts per token   S  routed (token, slot) pairs = T * K
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import torch
import torch.nn.functional as F

from zaya_pipeline.errors import ConfigError
from zaya_pipeline.ops.autograd import register_expert_autograd

BACKENDS = ("auto", "loop", "grouped_mm", "triton")


def count_per_expert(ids: torch.Tensor, num_bins: int) -> torch.Tensor:
    """int64 (num_bins,) histogram of ``ids`` (values in [0, num_bins)). A scatter-add, not ``bincount``,
    whose output size depends on the data: this one traces into a compiled graph with no host sync."""
    flat = ids.reshape(-1)
    return torch.zeros(num_bins, dtype=torch.int64, device=ids.device).scatter_add_(
        0, flat, torch.ones_like(flat)
    )


def sort_by_expert(topk_ids_TK: torch.Tensor, num_experts: int):
    """Expert-sorted order of the (token, slot) pairs: (order_S, token_S, num_tokens_per_expert_E).

    The sort is stable, so each expert's rows stay in token order and results never depend on sort internals.
    Slots with id ``num_experts`` (no expert: skipped or dropped) sort after every expert's rows and are not
    counted."""
    ids_S = topk_ids_TK.reshape(-1)
    order_S = torch.argsort(ids_S, stable=True)
    counts_E = count_per_expert(ids_S, num_experts + 1)[:num_experts]
    return order_S, order_S // topk_ids_TK.shape[1], counts_E


def _expert_mlp_loop(x_TD, topk_ids_TK, topk_weights_TK, w_gate_up_EDF2, w_down_EFD) -> torch.Tensor:
    hidden = w_down_EFD.shape[1]
    order_S, token_S, num_tokens_per_expert_E = sort_by_expert(topk_ids_TK, w_gate_up_EDF2.shape[0])
    counts = num_tokens_per_expert_E.tolist()
    kept = sum(counts)  # the rows of slots with no expert come last: drop them
    order_S, token_S = order_S[:kept], token_S[:kept]
    weights_S = topk_weights_TK.reshape(-1)[order_S].to(x_TD.dtype)
    x_SD = x_TD[token_S]
    # unbind / split instead of indexing: the backward of w[e] or x[a:b] writes into a zero tensor of the full
    # size, once per expert; split and unbind backpropagate with a single concatenation.
    w_gate_up_DF2 = w_gate_up_EDF2.unbind(0)
    w_down_FD = w_down_EFD.unbind(0)
    ys = []
    for e, x_ND in enumerate(torch.split(x_SD, counts)):
        if counts[e] == 0:
            continue
        gate_NF, up_NF = (x_ND @ w_gate_up_DF2[e]).split(hidden, dim=-1)
        ys.append((F.silu(gate_NF) * up_NF) @ w_down_FD[e])
    if not ys:  # no routed slot at all
        return x_TD * 0 + 0 * topk_weights_TK.sum().to(x_TD.dtype)  # zeros that keep the graph
    y_SD = torch.cat(ys) * weights_S[:, None]
    return torch.zeros_like(x_TD).index_add(0, token_S, y_SD)


def grouped_mm_aligned(d_model: int, hidden: int, dtype: torch.dtype) -> bool:
    """grouped_mm needs every row stride to be a multiple of 16 bytes (D and F multiples of 4 in fp32)."""
    per_16_bytes = 16 // torch.empty((), dtype=dtype).element_size()
    return d_model % per_16_bytes == 0 and hidden % per_16_bytes == 0


# ---- grouped_mm: a custom op (forward and backward), so torch.compile traces through it ------------------
# The forward returns what the backward needs as extra outputs (a custom op saves nothing itself). Rows of
# slots with no expert (id E) sort last, past offsets[-1]: grouped_mm leaves them uninitialised, so every
# result taken from them is masked with torch.where (not multiplied: 0 * garbage may be NaN).


@torch.library.custom_op("zaya::grouped_mm_expert_mlp", mutates_args=())
def _gmm_forward(
    x_TD: torch.Tensor,
    topk_ids_TK: torch.Tensor,
    topk_weights_TK: torch.Tensor,
    w_gate_up_EDF2: torch.Tensor,
    w_down_EFD: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y_TD, x_SD, gu_S2F, h_SF, order_S, offsets_E)."""
    hidden = w_down_EFD.shape[1]
    order_S, token_S, counts_E = sort_by_expert(topk_ids_TK, w_gate_up_EDF2.shape[0])
    offsets_E = counts_E.cumsum(0).to(torch.int32)  # end row of each expert's group
    valid_S1 = (torch.arange(order_S.shape[0], device=order_S.device) < offsets_E[-1])[:, None]
    route_w_S = topk_weights_TK.reshape(-1)[order_S]
    x_SD = x_TD.index_select(0, token_S)
    gu_S2F = F.grouped_mm(x_SD, w_gate_up_EDF2, offs=offsets_E)
    h_SF = F.silu(gu_S2F[:, :hidden]).mul_(gu_S2F[:, hidden:])
    y_SD = F.grouped_mm(h_SF, w_down_EFD, offs=offsets_E).mul_(route_w_S.to(x_TD.dtype)[:, None])
    y_SD = torch.where(valid_S1, y_SD, 0)
    return (
        _scatter_rows(y_SD, token_S, x_TD.shape[0], topk_ids_TK.shape[1]),
        x_SD,
        gu_S2F,
        h_SF,
        order_S,
        offsets_E,
    )


@_gmm_forward.register_fake
def _(x_TD, topk_ids_TK, topk_weights_TK, w_gate_up_EDF2, w_down_EFD):
    S, F2 = topk_ids_TK.numel(), w_gate_up_EDF2.shape[2]
    new = x_TD.new_empty
    return (
        torch.empty_like(x_TD),
        new(S, x_TD.shape[1]),
        new(S, F2),
        new(S, F2 // 2),
        topk_ids_TK.new_empty(S),
        torch.empty(w_gate_up_EDF2.shape[0], dtype=torch.int32, device=x_TD.device),
    )


@torch.library.custom_op("zaya::grouped_mm_expert_mlp_backward", mutates_args=())
def _gmm_backward(
    dy_TD: torch.Tensor,
    x_SD: torch.Tensor,
    gu_S2F: torch.Tensor,
    h_SF: torch.Tensor,
    order_S: torch.Tensor,
    offsets_E: torch.Tensor,
    topk_weights_TK: torch.Tensor,
    w_gate_up_EDF2: torch.Tensor,
    w_down_EFD: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx_TD, d_weights_TK, dw_gate_up_EDF2, dw_down_EFD): no concatenations, writes into output slices,
    and the routing-weight grad as <dy W_down^T, h> (the same trick as the Triton kernels)."""
    hidden = w_down_EFD.shape[1]
    top_k = topk_weights_TK.shape[1]
    valid_S1 = (torch.arange(order_S.shape[0], device=order_S.device) < offsets_E[-1])[:, None]
    token_S = order_S // top_k
    route_w_S = topk_weights_TK.reshape(-1)[order_S]
    gate_SF, up_SF = gu_S2F[:, :hidden], gu_S2F[:, hidden:]
    w_S1 = route_w_S.to(dy_TD.dtype)[:, None]
    dy_SD = dy_TD.index_select(0, token_S)
    g_SF = F.grouped_mm(dy_SD, w_down_EFD.transpose(1, 2), offs=offsets_E)  # dy W_down^T, unweighted
    d_route_w_S = torch.where(valid_S1[:, 0], torch.linalg.vecdot(g_SF.float(), h_SF.float()), 0)  # fp32
    d_route_w_TK = torch.empty_like(d_route_w_S).index_copy_(0, order_S, d_route_w_S)
    dw_down_EFD = F.grouped_mm(h_SF.t(), dy_SD.mul_(w_S1), offs=offsets_E)
    dh_SF = g_SF.mul_(w_S1)
    dgu_S2F = torch.empty_like(gu_S2F)
    torch.mul(dh_SF, F.silu(gate_SF), out=dgu_S2F[:, hidden:])
    torch.ops.aten.silu_backward.grad_input(dh_SF.mul_(up_SF), gate_SF, grad_input=dgu_S2F[:, :hidden])
    dw_gate_up_EDF2 = F.grouped_mm(x_SD.t(), dgu_S2F, offs=offsets_E)
    dx_SD = torch.where(valid_S1, F.grouped_mm(dgu_S2F, w_gate_up_EDF2.transpose(1, 2), offs=offsets_E), 0)
    dx_TD = _scatter_rows(dx_SD, token_S, dy_TD.shape[0], top_k)
    return (
        dx_TD,
        d_route_w_TK.view_as(topk_weights_TK).to(topk_weights_TK.dtype),
        dw_gate_up_EDF2,
        dw_down_EFD,
    )


@_gmm_backward.register_fake
def _(dy_TD, x_SD, gu_S2F, h_SF, order_S, offsets_E, topk_weights_TK, w_gate_up_EDF2, w_down_EFD):
    return (
        torch.empty_like(dy_TD),
        torch.empty_like(topk_weights_TK),
        torch.empty_like(w_gate_up_EDF2),
        torch.empty_like(w_down_EFD),
    )


# backward(dy, x_SD, gu_S2F, h_SF, order_S, offsets_E, topk_weights_TK, w_gate_up_EDF2, w_down_EFD)
register_expert_autograd(_gmm_forward, _gmm_backward, lambda inputs, output: (*output[1:], *inputs[2:]))


def _scatter_rows(rows_SD: torch.Tensor, token_S: torch.Tensor, num_tokens: int, top_k: int) -> torch.Tensor:
    """Sum the expert-sorted rows back into their tokens; with K = 1 it is a permutation (no zero fill)."""
    if top_k == 1:
        return rows_SD.new_empty(num_tokens, rows_SD.shape[1]).index_copy_(0, token_S, rows_SD)
    return rows_SD.new_zeros(num_tokens, rows_SD.shape[1]).index_add_(0, token_S, rows_SD)


def _expert_mlp_grouped_mm(x_TD, topk_ids_TK, topk_weights_TK, w_gate_up_EDF2, w_down_EFD) -> torch.Tensor:
    hidden = w_down_EFD.shape[1]
    if not grouped_mm_aligned(x_TD.shape[1], hidden, x_TD.dtype):
        raise ValueError(
            f"expert_mlp(backend='grouped_mm'): D={x_TD.shape[1]} and F={hidden} must be multiples of "
            f"{16 // x_TD.element_size()} for {x_TD.dtype} (16-byte strides); use backend 'triton' or 'loop'"
        )
    if x_TD.shape[0] == 0:
        return torch.zeros_like(x_TD)
    return _gmm_forward(x_TD.contiguous(), topk_ids_TK, topk_weights_TK, w_gate_up_EDF2, w_down_EFD)[0]


def _expert_mlp_triton(*args) -> torch.Tensor:
    from zaya_pipeline.ops.triton_expert_mlp import expert_mlp_triton  # imports Triton: only when used

    return expert_mlp_triton(*args)


_IMPLEMENTATIONS: dict[str, Callable[..., torch.Tensor]] = {
    "loop": _expert_mlp_loop,
    "grouped_mm": _expert_mlp_grouped_mm,
    "triton": _expert_mlp_triton,
}


def triton_available() -> bool:
    """Triton is installed (the ``triton`` extra); it also runs on CPU tensors under the interpreter."""
    return importlib.util.find_spec("triton") is not None


KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # grouped_mm and our kernels; loop takes any


def available_backends(
    device: torch.device | str, dtype: torch.dtype = torch.float32, dims: tuple[int, int] | None = None
) -> list[str]:
    """Concrete backends that run on ``device`` for ``dtype`` (and ``dims`` = (D, F) when given), in the
    order ``auto`` prefers them."""
    device = torch.device(device)
    if dtype not in KERNEL_DTYPES:
        return ["loop"]
    grouped = ["grouped_mm"] if dims is None or grouped_mm_aligned(*dims, dtype) else []
    triton = ["triton"] if triton_available() else []
    if device.type == "cuda":  # CUDA and ROCm (torch.version.hip) both report "cuda"
        # torch's grouped_mm kernels take bf16 only on GPU. On one H200 (2026-12-04, docs/kernels.md) our
        # Triton kernels were slightly slower than grouped_mm at the ZAYA1 shape, so auto prefers grouped_mm
        # where it applies; scripts/gpu_check.sh's benchmark decides whether triton goes first.
        if dtype == torch.bfloat16:
            return grouped + triton + ["loop"]
        return triton + ["loop"]
    # CPU: the interpreter runs Triton for tests, far too slowly for training, so auto never picks it.
    return grouped + ["loop"] + triton


def pick_backend(
    device: torch.device | str, dtype: torch.dtype = torch.float32, dims: tuple[int, int] | None = None
) -> str:
    """What ``auto`` runs (docs/kernels.md): grouped_mm on CPU and for bf16 on a GPU, Triton for the other
    GPU dtypes; loop for float64 and where neither applies (sizes grouped_mm cannot stride)."""
    return available_backends(device, dtype, dims)[0]


def check_backend(backend: str) -> None:
    """Raise a config error for an unknown backend name, or for ``triton`` without Triton installed."""
    if backend not in BACKENDS:
        raise ConfigError(
            f"model.moe.expert_backend: unknown backend {backend!r}; choose from {list(BACKENDS)}"
        )
    if backend == "triton" and not triton_available():
        raise ConfigError(
            "model.moe.expert_backend=triton needs Triton: pip install -e '.[triton]' (or choose auto)"
        )


def expert_mlp(
    x_TD: torch.Tensor,
    topk_ids_TK: torch.Tensor,
    topk_weights_TK: torch.Tensor,
    w_gate_up_EDF2: torch.Tensor,
    w_down_EFD: torch.Tensor,
    backend: str = "auto",
) -> torch.Tensor:
    """Weighted sum over each token's K chosen experts of ``(silu(x W_gate) * (x W_up)) W_down``.

    ``w_gate_up_EDF2`` (E, D, 2F) holds the gate projection in its first F columns and the up projection in
    the last F; ``w_down_EFD`` is (E, F, D). Gradients flow to x, both weights and the routing weights.

    Under ``torch.autocast`` (Lightning's ``bf16-mixed``) x and the expert weights are cast to the autocast
    dtype first, as autocast does for ``matmul``: the autograd Functions behind the backends are not on
    autocast's op lists, and would otherwise run the GEMMs in fp32 (fp32 params, fp32 norm outputs).
    """
    x_TD, w_gate_up_EDF2, w_down_EFD = _autocast_inputs(x_TD, w_gate_up_EDF2, w_down_EFD)
    if backend not in _IMPLEMENTATIONS:
        check_backend(backend)  # raises for unknown names
        backend = pick_backend(x_TD.device, x_TD.dtype, (x_TD.shape[1], w_down_EFD.shape[1]))
    return _IMPLEMENTATIONS[backend](x_TD, topk_ids_TK, topk_weights_TK, w_gate_up_EDF2, w_down_EFD)


def _autocast_inputs(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``tensors`` in the autocast dtype when autocast is on for their device (floating ones only)."""
    device_type = tensors[0].device.type
    if not torch.is_autocast_enabled(device_type):
        return tensors
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(t.to(dtype) if t.is_floating_point() else t for t in tensors)
