"""How much memory autograd keeps for backward: the bytes of the tensors a forward saves.

Useful to compare implementations of one op (e.g. the expert MLP backends): the inputs and weights exist
whatever the implementation, so only what the op adds on top of them is counted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch


def _storage_key_and_bytes(t: torch.Tensor) -> tuple[tuple, int]:
    """(identity of t's storage, its size in bytes); tensors without a plain storage count their elements."""
    try:
        storage = t.untyped_storage()
        return (t.device, storage.data_ptr()), storage.nbytes()
    except (RuntimeError, NotImplementedError):  # sparse, nested, ... tensors: no single storage
        return ("tensor", id(t)), t.numel() * t.element_size()


def saved_activation_bytes(
    fn: Callable[[], torch.Tensor], inputs: Iterable[torch.Tensor]
) -> tuple[torch.Tensor, int]:
    """Run ``out = fn()`` and return ``(out, bytes)``: the total size of the distinct storages autograd saved
    for backward during the call, leaving out the storages of ``inputs`` (and of any view of them).

    Storages are told apart by data pointer, so a tensor saved by several nodes (or several views of one
    buffer) counts once, and a whole storage counts even when only a view of it was saved. ``out`` keeps
    its graph: the caller can backpropagate through it as usual.
    """
    excluded = {_storage_key_and_bytes(t)[0] for t in inputs}
    saved: dict[tuple, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key, nbytes = _storage_key_and_bytes(t)
        if key not in excluded:
            saved[key] = nbytes
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(saved.values())
