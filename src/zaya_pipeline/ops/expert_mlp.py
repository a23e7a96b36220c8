"""Routed SwiGLU expert MLP: ``y_TD = sum_k w_TK[:, k] * SwiGLU_{ids_TK[:, k]}(x_TD)``, dropless.

Backends: ``loop`` is the plain-torch reference (sort the (token, slot) pairs by expert, one pair of matmuls
per expert that received tokens, ``index_add`` back); ``auto`` picks the best available backend (only
``loop`` exists so far; Triton / grouped_mm backends plug in here). Autograd comes from the torch ops.

Shape legend:
    T  tokens            D  model width         F  expert hidden width
    E  experts           K  experts per token   S  routed (token, slot) pairs = T * K
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from zaya_pipeline.errors import ConfigError

BACKENDS = ("auto", "loop")


def _expert_mlp_loop(
    x_TD: torch.Tensor,
    topk_ids_TK: torch.Tensor,
    topk_weights_TK: torch.Tensor,
    w_gate_up_EDF2: torch.Tensor,
    w_down_EFD: torch.Tensor,
) -> torch.Tensor:
    num_experts, _, hidden2 = w_gate_up_EDF2.shape
    hidden = hidden2 // 2
    top_k = topk_ids_TK.shape[1]
    ids_S = topk_ids_TK.reshape(-1)
    # A stable sort keeps each expert's tokens in token order: results do not depend on sort internals.
    order_S = torch.argsort(ids_S, stable=True)
    token_S = order_S // top_k
    weights_S = topk_weights_TK.reshape(-1)[order_S].to(x_TD.dtype)
    x_SD = x_TD[token_S]
    num_tokens_per_expert_E = torch.bincount(ids_S, minlength=num_experts)
    # unbind / split instead of indexing: the backward of w[e] or x[a:b] writes into a zero tensor of the full
    # size, once per expert; split and unbind backpropagate with a single concatenation.
    w_gate_up_DF2 = w_gate_up_EDF2.unbind(0)
    w_down_FD = w_down_EFD.unbind(0)
    counts = num_tokens_per_expert_E.tolist()
    ys = []
    for e, x_ND in enumerate(torch.split(x_SD, counts)):
        if counts[e] == 0:
            continue
        gate_NF, up_NF = (x_ND @ w_gate_up_DF2[e]).split(hidden, dim=-1)
        ys.append((F.silu(gate_NF) * up_NF) @ w_down_FD[e])
    if not ys:  # no tokens at all (T == 0)
        return torch.zeros_like(x_TD)
    y_SD = torch.cat(ys) * weights_S[:, None]
    return torch.zeros_like(x_TD).index_add(0, token_S, y_SD)


def resolve_backend(backend: str) -> Callable[..., torch.Tensor]:
    """The implementation behind a backend name; unknown names are a config error."""
    if backend not in BACKENDS:
        raise ConfigError(
            f"model.moe.expert_backend: unknown backend {backend!r}; choose from {list(BACKENDS)}"
        )
    return _expert_mlp_loop  # "auto" = the only backend so far


def expert_mlp(
    x_TD: torch.Tensor,
    topk_ids_TK: torch.Tensor,
    topk_weights_TK: torch.Tensor,
    w_gate_up_EDF2: torch.Tensor,
    w_down_EFD: torch.Tensor,
    backend: str = "auto",
) -> torch.Tensor:
    """Weighted sum over each token's K chosen experts of ``(silu(x W_gate) * (x W_up)) W_down``.

    ``w_gate_up_EDF2`` holds the gate projection in its first F columns and the up projection in the last F.
    """
    return resolve_backend(backend)(x_TD, topk_ids_TK, topk_weights_TK, w_gate_up_EDF2, w_down_EFD)
