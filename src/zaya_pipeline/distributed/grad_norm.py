"""Global gradient-norm clipping over FSDP2 x EP parameters that live on different meshes.

``torch.nn.utils.clip_grad_norm_`` stacks the per-parameter norms, which fails when the routed experts and
the other weights are DTensors on different meshes ("All operands ... must have the same mesh"). Here
each rank sums the squares of its local gradient shards and one all-reduce over the world adds them up.
Every FSDP shard and every expert-parallel shard lives on exactly one rank per HSDP replica, so dividing by
``dp_replicate`` counts each gradient element once.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


@torch.no_grad()
def clip_grad_norm_(
    parameters: Iterable[torch.Tensor], max_norm: float, dp_replicate: int = 1
) -> torch.Tensor:
    """Scale the gradients so that their global L2 norm is at most ``max_norm``; returns the norm before."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return torch.zeros(())
    local = [_local(g) for g in grads]
    sq = torch.stack([g.float().square().sum() for g in local]).sum()
    if dist.is_initialized():
        dist.all_reduce(sq)
        sq = sq / dp_replicate
    norm = sq.sqrt()
    scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    for g in local:
        g.mul_(scale.to(g.dtype))
    return norm
