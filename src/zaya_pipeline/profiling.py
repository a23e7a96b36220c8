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


# ---- host syncs -------------------------------------------------------------------------------------------
# On a GPU, reading a tensor's value on the host (.item(), float(t), bool(t), .tolist()) or an op whose output
# shape depends on the data (nonzero, bincount, masked_select, unique, ...) waits for the device: the host
# stops queueing work. ``torch.cuda.set_sync_debug_mode`` catches these on a GPU only; this catches the same
# calls on any device, CPU tests included, by the aten ops they dispatch to and the Tensor methods that read
# memory directly.

DATA_DEPENDENT_OPS = {
    "aten::_local_scalar_dense",  # .item(), float(t), int(t), bool(t)
    "aten::nonzero",
    "aten::nonzero_static",
    "aten::bincount",
    "aten::masked_select",
    "aten::unique_dim",
    "aten::_unique2",
    "aten::unique_consecutive",
    "aten::repeat_interleave",
}


class HostSyncs:
    """Context manager that records every host sync (see above) made inside it: ``.calls`` holds
    ``(what, where)`` pairs, ``where`` being the innermost frame of this project's code."""

    def __init__(self):
        self.calls: list[tuple[str, str]] = []

    def _record(self, what: str) -> None:
        import traceback

        frames = [
            f
            for f in traceback.extract_stack()[:-2]
            if "zaya_pipeline" in f.filename or "/tests/" in f.filename
        ]
        where = f"{frames[-1].filename.split('/')[-1]}:{frames[-1].lineno}" if frames else "?"
        self.calls.append((what, where))

    def __enter__(self) -> HostSyncs:
        from torch.utils._python_dispatch import TorchDispatchMode

        outer = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func._schema.name in DATA_DEPENDENT_OPS:
                    outer._record(func._schema.name)
                return func(*args, **(kwargs or {}))

        self._mode = _Mode()
        self._mode.__enter__()
        self._saved = {name: getattr(torch.Tensor, name) for name in ("tolist", "numpy")}
        for name, method in self._saved.items():

            def wrapper(t, *a, _name=name, _method=method, **k):
                outer._record(f"Tensor.{_name}")
                return _method(t, *a, **k)

            setattr(torch.Tensor, name, wrapper)
        return self

    def __exit__(self, *exc) -> None:
        for name, method in self._saved.items():
            setattr(torch.Tensor, name, method)
        self._mode.__exit__(*exc)
