"""A full, single-device state dict of a parallelized ZayaLM, for model.pt and the registry."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

WRAPPERS = ("._checkpoint_wrapped_module", "._orig_mod")  # activation checkpointing, torch.compile


def full_state_dict(model: torch.nn.Module, ep_group=None) -> dict[str, torch.Tensor]:
    """Every tensor gathered to its full single-device shape, on CPU, under its plain ZayaLM name.

    A collective: every rank must call it. FSDP shards are gathered with ``full_tensor``; the routed
    experts, which differ between the ranks of an expert-parallel group, are concatenated over ``ep_group``.
    """
    ep = dist.get_world_size(ep_group) if ep_group is not None else 1
    out = {}
    for name, tensor in model.state_dict().items():
        full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        if ep > 1 and ".experts." in name:
            parts = [torch.empty_like(full) for _ in range(ep)]
            dist.all_gather(parts, full.contiguous(), group=ep_group)
            full = torch.cat(parts)
        for wrapper in WRAPPERS:
            name = name.replace(wrapper, "")
        out[name] = full.detach().cpu()
    return out
