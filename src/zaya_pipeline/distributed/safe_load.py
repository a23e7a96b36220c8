"""Reading a checkpoint never runs code.

A checkpoint comes from disk, which may hold a file someone else put there; Python's pickle runs whatever a
file tells it to. So:

* the trainer state (Lightning's loop counters, LR schedulers, the module's extras, every rank's RNG states,
  the optimizers' param groups) is JSON: :func:`dump_state` / :func:`load_state`. JSON has no tuples, no
  tensors, no arrays and only string keys; those are written as tagged objects (``{"__tuple__": [...]}``,
  ``{"__tensor__": {dtype, shape, b64}}``, ``{"__ndarray__": ...}``, ``{"__items__": [[k, v], ...]}``) and
  rebuilt from plain data only;
* DCP's ``.metadata`` (a pickle in every DCP checkpoint) is read by :class:`SafeFileSystemReader` through an
  unpickler that resolves only DCP's own metadata classes, ``torch.Size``, dtypes, layouts and paths: a
  payload naming any other callable is refused before it runs;
* DCP reads each tensor with ``torch.load(weights_only=True)``; non-tensor (bytes) entries, which DCP would
  unpickle without restriction, are refused (:class:`TensorsOnlyLoadPlanner`): we store none.
"""

from __future__ import annotations

import base64
import io
import json
import math
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from zaya_pipeline.errors import ConfigError

# ----------------------------------------------------------------------------------------------------------
# Trainer state as tagged JSON


def _encode(value: Any, where: str) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"__float__": repr(value)}
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        raw = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
        dtype = str(t.dtype).removeprefix("torch.")
        return {"__tensor__": {"dtype": dtype, "shape": list(t.shape), "b64": base64.b64encode(raw).decode()}}
    if isinstance(value, np.ndarray):
        raw = base64.b64encode(np.ascontiguousarray(value).tobytes()).decode()
        return {"__ndarray__": {"dtype": value.dtype.str, "shape": list(value.shape), "b64": raw}}
    if isinstance(value, np.generic):
        return _encode(value.item(), where)
    if isinstance(value, tuple):
        return {"__tuple__": [_encode(v, f"{where}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [_encode(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in value):
            return {k: _encode(v, f"{where}.{k}") for k, v in value.items()}
        return {"__items__": [[_encode(k, where), _encode(v, f"{where}[{k!r}]")] for k, v in value.items()]}
    raise TypeError(f"trainer state {where}: cannot store a {type(value).__name__} in a checkpoint as data")


def _tensor(spec: dict) -> torch.Tensor:
    dtype = getattr(torch, spec["dtype"], None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown tensor dtype {spec['dtype']!r}")
    raw = bytearray(base64.b64decode(spec["b64"], validate=True))
    flat = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
    return flat.view(dtype).reshape(spec["shape"]).clone()


def _ndarray(spec: dict) -> np.ndarray:
    dtype = np.dtype(spec["dtype"])
    if dtype.hasobject:
        raise ValueError("object arrays are not data")
    raw = base64.b64decode(spec["b64"], validate=True)
    return np.frombuffer(raw, dtype=dtype).reshape(spec["shape"]).copy()


def _decode(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        ((tag, body),) = value.items()
        if tag == "__tuple__":
            return tuple(_decode(v) for v in body)
        if tag == "__items__":
            return {_decode(k): _decode(v) for k, v in body}
        if tag == "__tensor__":
            return _tensor(body)
        if tag == "__ndarray__":
            return _ndarray(body)
        if tag == "__float__":
            return float(body)
    return {k: _decode(v) for k, v in value.items()}


def dump_state(state: dict, path: Path) -> None:
    """Write ``state`` (plain types, tuples, tensors, numpy arrays) as tagged JSON to ``path``."""
    Path(path).write_text(json.dumps(_encode(state, "")), encoding="utf-8")


def load_state(path: Path) -> dict:
    """The state :func:`dump_state` wrote; ``ConfigError`` naming ``path`` for anything else."""
    try:
        return _decode(json.loads(Path(path).read_text(encoding="utf-8")))
    except (ValueError, TypeError, KeyError, RuntimeError) as exc:  # JSONDecodeError is a ValueError
        raise ConfigError(f"train.resume: {path} is not a trainer state one of ours ({exc})") from None


# ----------------------------------------------------------------------------------------------------------
# DCP metadata through an allow-listed unpickler

_DCP_METADATA = "torch.distributed.checkpoint.metadata"
ALLOWED_GLOBALS = {
    (_DCP_METADATA, name)
    for name in (
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorStorageMetadata",
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "TensorProperties",
        "_MEM_FORMAT_ENCODING",
    )
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PurePosixPath"),
    ("collections", "OrderedDict"),
}


class UnsafeCheckpointFile(ConfigError):
    """A checkpoint file asks to run code (or to build an object that is not checkpoint metadata)."""


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file, source: Path):
        super().__init__(file)
        self.source = source

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (module, name) in ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise UnsafeCheckpointFile(
            f"{self.source}: refused to load: it names {module}.{name}, which is not checkpoint metadata "
            "(loading it could run code); this file was not written by DCP"
        )


def read_dcp_metadata(path: Path) -> Any:
    """Unpickle a DCP ``.metadata`` file allowing only DCP's metadata classes."""
    from torch.distributed.checkpoint.metadata import Metadata

    path = Path(path)
    try:
        with path.open("rb") as f:
            meta = _MetadataUnpickler(io.BufferedReader(f), path).load()
    except UnsafeCheckpointFile:
        raise
    except Exception as exc:
        raise ConfigError(f"train.resume: {path} is not DCP checkpoint metadata ({exc})") from None
    if not isinstance(meta, Metadata):
        raise UnsafeCheckpointFile(f"{path}: holds a {type(meta).__name__}, not DCP checkpoint metadata")
    return meta


class SafeFileSystemReader(FileSystemReader):
    """DCP's file reader with :func:`read_dcp_metadata` in place of a plain ``pickle.load``."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        from torch.distributed.checkpoint.metadata import StorageMeta

        rank = kwargs.get("rank")
        meta = read_dcp_metadata(Path(self._get_metadata_path(rank)))
        if getattr(meta, "storage_meta", None) is None:
            meta.storage_meta = StorageMeta()
        meta.storage_meta.load_id = self.load_id
        return meta


class TensorsOnlyLoadPlanner(DefaultLoadPlanner):
    """Loads tensors only: a bytes entry would be unpickled without restriction by DCP, and we store none."""

    def load_bytes(self, read_item, value) -> None:
        raise UnsafeCheckpointFile(
            f"checkpoint entry {read_item.dest_index.fqn} is a pickled object: refused to load it"
        )
