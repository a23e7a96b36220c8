"""Autograd ops over the kernels with a guarded import and a plain-torch fallback."""

from zaya_pipeline.ops.expert_mlp import BACKENDS, expert_mlp, resolve_backend

__all__ = ["BACKENDS", "expert_mlp", "resolve_backend"]
