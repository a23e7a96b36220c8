"""Expert parallelism: each rank of an EP group owns ``E / ep`` experts; tokens travel to them and back.

Dispatch for one MoE layer (every rank runs it on its own tokens):
1. sort the (token, slot) pairs by the rank that owns their expert and exchange the per-rank counts
   (the only host sync: ``all_to_all_single`` needs the split sizes);
2. send the token rows and their local expert ids with ``all_to_all_single`` (uneven splits, autograd-aware);
3. run the received rows through ``ops.expert_mlp`` on the local experts (weight 1, top-1 per row);
4. send the outputs back the same way and combine them with the routing weights on the token's own rank,
   so routing-weight gradients never leave it.

A rank that receives no rows still takes part in both exchanges and their backward, and its experts get
exact zero gradients (no hang, no ``None`` grads).

Gradient convention: every rank's loss is the mean over its own tokens, and the data-parallel reduction
averages gradients over ranks. The experts' weights receive contributions from the tokens of every EP rank,
so their gradients are divided by the EP size (in the dispatch, on the weights as used). Then, for
equal tokens per rank, every gradient equals the single-process gradient of the mean loss over the global
batch (tested).

Shape legend: T tokens, K experts per token, S = T * K pairs, R rows received, E experts, D model width.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from zaya_pipeline.ops import expert_mlp


def _exchange(x: torch.Tensor, out_splits: list[int], in_splits: list[int], group) -> torch.Tensor:
    return funcol.wait_tensor(funcol.all_to_all_single_autograd(x, out_splits, in_splits, group))


def expert_parallel_mlp(
    x_TD: torch.Tensor,
    topk_ids_TK: torch.Tensor,
    topk_weights_TK: torch.Tensor,
    w_gate_up_local: torch.Tensor,
    w_down_local: torch.Tensor,
    *,
    group: dist.ProcessGroup,
    backend: str = "auto",
) -> torch.Tensor:
    """``expert_mlp`` over experts spread across ``group``: this rank holds experts
    ``rank * E_local : (rank + 1) * E_local``; ``topk_ids_TK`` holds global expert ids, and the id one past
    the last expert marks a slot with no expert (computed nowhere, contributes nothing)."""
    ep = dist.get_world_size(group)
    num_local = w_gate_up_local.shape[0]
    T, K = topk_ids_TK.shape
    ids_S = topk_ids_TK.reshape(-1)
    # id ep * E_local ("no expert": a skipped or dropped slot) -> destination ep, sorted last and not sent
    dest_S = torch.div(ids_S, num_local, rounding_mode="floor")
    order_S = torch.argsort(dest_S, stable=True)
    send_counts = torch.bincount(dest_S, minlength=ep + 1)[:ep].contiguous()
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=group)
    send, recv = send_counts.tolist(), recv_counts.tolist()
    order_S = order_S[: sum(send)]
    token_S = order_S // K

    local_ids_S = ids_S[order_S] - dest_S[order_S] * num_local
    local_ids_R = torch.empty(sum(recv), dtype=local_ids_S.dtype, device=local_ids_S.device)
    dist.all_to_all_single(local_ids_R, local_ids_S, recv, send, group=group)
    x_RD = _exchange(x_TD[token_S], recv, send, group)
    if x_RD.shape[0]:
        ones_R1 = torch.ones(x_RD.shape[0], 1, dtype=x_RD.dtype, device=x_RD.device)
        y_RD = expert_mlp(x_RD, local_ids_R[:, None], ones_R1, w_gate_up_local, w_down_local, backend=backend)
    else:  # keep the graph (and so the backward exchange) alive; the local experts get zero gradients
        y_RD = x_RD * 0 + 0 * (w_gate_up_local.sum() + w_down_local.sum())
    y_SD = _exchange(y_RD, send, recv, group)
    weights_S = topk_weights_TK.reshape(-1)[order_S].to(y_SD.dtype)
    return torch.zeros_like(x_TD).index_add(0, token_S, y_SD * weights_S[:, None])


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; the backward multiplies the gradient by ``scale``."""

    @staticmethod
    def forward(ctx, x, scale: float):
        ctx.scale = scale
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.scale, None


class _ExpertParallelDispatch:
    """What a RoutedExperts module's ``dispatch`` hook holds under expert parallelism (a class: no closures).

    The 1 / ep gradient scale is applied to the weights as used here (after any FSDP unshard), so it holds
    whatever reduction follows (none, or FSDP's average over the experts' own shard group)."""

    def __init__(self, group: dist.ProcessGroup):
        self.group = group
        self.grad_scale = 1.0 / dist.get_world_size(group)

    def __call__(self, x_TD, topk_ids_TK, topk_weights_TK, w_gate_up, w_down, backend):
        w_gate_up = _ScaleGrad.apply(w_gate_up, self.grad_scale)
        w_down = _ScaleGrad.apply(w_down, self.grad_scale)
        return expert_parallel_mlp(
            x_TD, topk_ids_TK, topk_weights_TK, w_gate_up, w_down, group=self.group, backend=backend
        )


def apply_expert_parallel(model: torch.nn.Module, group: dist.ProcessGroup) -> None:
    """Keep only this rank's experts in every MoE layer of ``model`` and route their tokens through
    ``group``, with the 1 / ep gradient convention above. The first step of ``parallelize_zaya``."""
    from zaya_pipeline.model.moe import MoE

    ep, rank = dist.get_world_size(group), dist.get_rank(group)
    for module in model.modules():
        if not isinstance(module, MoE):
            continue
        num_local = module.num_experts // ep
        keep = slice(rank * num_local, (rank + 1) * num_local)
        for name in ("w_gate_up_EDF2", "w_down_EFD"):
            local = torch.nn.Parameter(getattr(module.experts, name).detach()[keep].clone())
            setattr(module.experts, name, local)
        module.experts.dispatch = _ExpertParallelDispatch(group)
        module.experts.first_expert = keep.start
