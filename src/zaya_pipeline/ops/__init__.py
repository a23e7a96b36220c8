"""Autograd ops over the kernels with a guarded import and a plain-torch fallback."""

from zaya_pipeline.ops.expert_mlp import (
    BACKENDS,
    available_backends,
    check_backend,
    count_per_expert,
    expert_mlp,
    pick_backend,
    sort_by_expert,
)

__all__ = [
    "BACKENDS",
    "available_backends",
    "expert_mlp",
    "pick_backend",
    "check_backend",
    "count_per_expert",
    "sort_by_expert",
]
