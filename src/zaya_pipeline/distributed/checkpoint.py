"""Training checkpoints with ``torch.distributed.checkpoint`` (DCP): one format for one process and for
FSDP2 × expert parallel, loadable into any other world size or mesh.

A checkpoint is a directory ``<paths.checkpoints>/step<N>`` holding:

* the DCP shards and ``.metadata``: the model's and the optimizers' tensors under their plain ZayaLM names.
  FSDP shards are DTensors (DCP reshards them on load). The routed experts are stored one entry per expert
  (``<name>#e<global expert id>``, also for their optimizer states): expert parallelism and FSDP both split
  the expert dim, so every expert lives whole on one rank, and any layout can read back the experts it owns;
* ``trainer.json``: what Lightning's checkpoint holds besides tensors (loop progress and step, LR
  schedulers, the module's data position and spike guard), the optimizers' param groups, the RNG states of
  every rank and the layout it was saved with.

Loading never runs code (:mod:`zaya_pipeline.distributed.safe_load`): the trainer state is JSON, DCP's
``.metadata`` pickle goes through an allow-listed unpickler and the shards hold tensors only (read with
``weights_only=True``). Checkpoints of older versions (``trainer.pt``, a full pickle) are refused.

Atomic: everything is written into a hidden ``.step<N>.partial`` directory that rank 0 renames once every
rank has finished, so a directory named ``step<N>`` is always complete and a crash mid-save leaves only a
partial directory that ``latest_checkpoint`` ignores (and the next save removes).

Loading goes through DCP's ``get_*_state_dict`` / ``set_*_state_dict``. The optimizer's target state is
built before the model's weights are read (building it runs one zero-LR step on zero gradients to create
the state tensors, which must not touch loaded weights).
"""

from __future__ import annotations

import pickle
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.tensor import DTensor

from zaya_pipeline.distributed.safe_load import (
    SafeFileSystemReader,
    TensorsOnlyLoadPlanner,
    UnsafeCheckpointFile,
    dump_state,
    load_state,
    read_dcp_metadata,
)
from zaya_pipeline.errors import ConfigError, MachineError, environment_error
from zaya_pipeline.utils import get_logger

log = get_logger("train")

TRAINER_FILE = "trainer.json"
LEGACY_TRAINER_FILE = "trainer.pt"  # a full pickle: checkpoints that have it are not loaded
STEP_DIR = re.compile(r"^step(\d+)$")
EXPERT_SEP = "#e"


def checkpoint_name(step: int) -> str:
    return f"step{step:07d}"


def is_complete(path: Path) -> bool:
    return path.is_dir() and (path / ".metadata").is_file() and (path / TRAINER_FILE).is_file()


def checkpoint_step(path: Path) -> int:
    """The step of a ``step<N>`` directory, -1 for any other name."""
    m = STEP_DIR.match(path.name)
    return int(m.group(1)) if m else -1


def list_checkpoints(directory: Path) -> list[Path]:
    """Complete checkpoints in ``directory``, oldest first."""
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if checkpoint_step(p) >= 0 and is_complete(p)]
    return sorted(found, key=checkpoint_step)


def latest_checkpoint(directory: Path) -> Path | None:
    found = list_checkpoints(directory)
    return found[-1] if found else None


def legacy_checkpoints(directory: Path) -> list[Path]:
    """``step<N>`` directories of older versions (a pickled ``trainer.pt``), which are never loaded."""
    if not directory.is_dir():
        return []
    found = [
        p for p in directory.iterdir() if checkpoint_step(p) >= 0 and (p / LEGACY_TRAINER_FILE).is_file()
    ]
    return sorted(found, key=checkpoint_step)


def check_loadable(path: Path) -> None:
    """``ConfigError`` naming ``path`` unless it is a complete checkpoint of this version."""
    if (path / LEGACY_TRAINER_FILE).is_file() and not (path / TRAINER_FILE).is_file():
        raise ConfigError(
            f"train.resume: {path} was saved by an older version as a pickle ({LEGACY_TRAINER_FILE}), which "
            "can run code when loaded: not loaded; move it away and start a fresh run"
        )
    if not is_complete(path):
        raise ConfigError(
            f"train.resume: {path} is not a complete checkpoint directory (.metadata and {TRAINER_FILE})"
        )


# ----------------------------------------------------------------------------------------------------------
# Expert entries: split along the expert dim into one entry per global expert id


def _is_expert(name: str) -> bool:
    return ".experts.w_" in name


def _expert_rows(name: str, tensor: torch.Tensor, first_expert: dict[str, int]) -> tuple[torch.Tensor, int]:
    """The rows of expert tensor ``name`` this rank holds (a view of its storage) and the global id of the
    first one. FSDP2 shards dim 0 like ``torch.chunk`` over each Shard(0) mesh dim; EP adds the offset of this
    rank's experts (``RoutedExperts.first_expert``)."""
    offset = first_expert.get(name.rsplit(".", 1)[0], 0)
    if not isinstance(tensor, DTensor):
        return tensor, offset
    local = tensor.to_local()
    rows = tensor.shape[0]
    start = 0
    for dim, placement in enumerate(tensor.placements):
        if placement.is_shard(0):
            size, coord = tensor.device_mesh.size(dim), tensor.device_mesh.get_local_rank(dim)
            chunk = -(-rows // size)
            start += min(coord * chunk, rows)
            rows = max(0, min(chunk, rows - coord * chunk))
        elif not placement.is_replicate():
            raise ValueError(f"{name}: cannot checkpoint an expert tensor placed as {placement}")
    if local.shape[0] != rows:
        raise AssertionError(f"{name}: local shard has {local.shape[0]} rows, expected {rows}")
    return local, offset + start


def _split_experts(flat: dict[str, Any], first_expert: dict[str, int]) -> dict[str, Any]:
    """``flat`` with every expert tensor (dim 0 = experts) replaced by one entry per local expert."""
    out = {}
    for name, value in flat.items():
        base = name.split("/", 1)[0]
        if isinstance(value, torch.Tensor) and _is_expert(base) and value.dim() >= 1:
            rows, first = _expert_rows(base, value, first_expert)
            for i in range(rows.shape[0]):
                out[f"{name}{EXPERT_SEP}{first + i}"] = rows[i]
        else:
            out[name] = value
    return out


def _first_experts(model: torch.nn.Module) -> dict[str, int]:
    """Module name → global id of its first local expert, for every RoutedExperts (from expert_parallel)."""
    from zaya_pipeline.model.moe import RoutedExperts

    out = {}
    for name, module in model.named_modules():
        if isinstance(module, RoutedExperts):
            for wrapper in ("._checkpoint_wrapped_module", "._orig_mod"):
                name = name.replace(wrapper, "")
            out[name] = getattr(module, "first_expert", 0)
    return out


# ----------------------------------------------------------------------------------------------------------
# The tensors of model + optimizers, flat


def _tensors(model: torch.nn.Module, optimizers: list[torch.optim.Optimizer]) -> tuple[dict, dict, list]:
    """(flat dict DCP saves/loads, model state dict, optimizer state dicts). The flat dict holds the very
    tensors of the two state dicts (or views of them), so loading into it fills both. Names:
    ``<fqn>`` for weights, ``<fqn>/optim<i>.<state>`` for optimizer states. Only tensors: the param groups
    (plain data) travel in the trainer state."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    optim_states = [get_optimizer_state_dict(model, opt) for opt in optimizers]  # before the model: see top
    model_state = get_model_state_dict(model)
    flat: dict[str, Any] = dict(model_state)
    for i, state in enumerate(optim_states):
        for fqn, per_param in state["state"].items():
            for key, value in per_param.items():
                flat[f"{fqn}/optim{i}.{key}"] = value
    return _split_experts(flat, _first_experts(model)), model_state, optim_states


def _drop_absent_optimizer_states(flat: dict, optim_states: list[dict], saved: set[str]) -> None:
    """Forget the optimizer states the checkpoint lacks: parameters that never had a gradient in the saved
    run (e.g. the first layer's EDA scale) have none, while building the target state gives every
    parameter one."""
    for name in [n for n in flat if "/optim" in n and n not in saved]:
        del flat[name]
        fqn, rest = name.split("/", 1)
        index, key = rest.removeprefix("optim").split(".", 1)
        per_param = optim_states[int(index)]["state"].get(fqn, {})
        per_param.pop(key.split(EXPERT_SEP, 1)[0], None)
    for state in optim_states:
        for fqn in [f for f, per_param in state["state"].items() if not per_param]:
            del state["state"][fqn]


def _restore_param_groups(meta: dict, optim_states: list[dict], path: Path) -> None:
    groups = meta.pop("zaya_param_groups", None)
    if not isinstance(groups, list) or len(groups) != len(optim_states):
        raise ConfigError(
            f"train.resume: {path} holds param groups of {len(groups or [])} optimizers, not "
            f"{len(optim_states)}"
        )
    for state, saved in zip(optim_states, groups, strict=True):
        state["param_groups"] = saved


# ----------------------------------------------------------------------------------------------------------
# Save / load


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _world() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _rng_states() -> list[dict]:
    """Every rank's RNG states (torch, CUDA, numpy, python), gathered."""
    from lightning.fabric.utilities.seed import _collect_rng_states

    mine = _collect_rng_states()
    if not dist.is_initialized():
        return [mine]
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return everyone


def save_checkpoint(
    path: Path,
    model: torch.nn.Module,
    optimizers: list[torch.optim.Optimizer],
    trainer_state: dict,
    layout: dict,
) -> Path:
    """Write checkpoint ``path`` (a ``step<N>`` directory) atomically; a collective. Returns ``path``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    path = Path(path)
    partial = path.with_name(f".{path.name}.partial")
    if _rank() == 0:
        for stale in path.parent.glob(".step*.partial"):  # saves a crash interrupted
            shutil.rmtree(stale, ignore_errors=True)
        partial.mkdir(parents=True)
    _barrier()
    flat, _, optim_states = _tensors(model, optimizers)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed is (not|dis)abled.*")
        warnings.filterwarnings("ignore", message=".*process group is not initialized.*")
        try:
            dcp.save(flat, checkpoint_id=str(partial), no_dist=not dist.is_initialized())
        except (Exception, CheckpointException) as exc:  # DCP's is a BaseException
            if (known := _save_error(exc, path)) is None:
                raise
            raise known from None
    rng = _rng_states()
    if _rank() == 0:
        meta = {
            **trainer_state,
            "zaya_param_groups": [state["param_groups"] for state in optim_states],
            "zaya_rng": rng,
            "zaya_layout": {**layout, "world_size": _world()},
        }
        dump_state(meta, partial / TRAINER_FILE)
        if path.exists():  # a checkpoint of the same step from an earlier attempt
            shutil.rmtree(path)
        partial.rename(path)
    _barrier()
    return path


def _save_error(exc: BaseException, path: Path) -> MachineError | None:
    """A failed save as one line when the disk is full: DCP wraps torch's writer, whose error on a full disk
    is ``unexpected pos 704 vs 598`` with no errno, so the free space left decides (under 1 MiB: full)."""
    if (known := environment_error(exc)) is not None:
        return known
    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:
        return None
    if free >= 1 << 20:
        return None
    return MachineError(
        f"No space left on device: cannot write checkpoint {path} ({free:,} bytes free in {path.parent}); "
        "free some space or set paths.checkpoints elsewhere"
    )


def _unsafe_cause(exc: BaseException) -> str | None:
    """Why DCP's load failed, when it was a refusal to unpickle (ours, or ``torch.load(weights_only=True)``'s
    in a shard). DCP wraps the per-rank errors in a ``CheckpointException`` (a ``BaseException``)."""
    causes = [exc, *(wrapped[0] for wrapped in getattr(exc, "failures", {}).values())]
    for cause in causes:
        if isinstance(cause, UnsafeCheckpointFile):
            return str(cause)
        if isinstance(cause, pickle.UnpicklingError) and "Weights only load failed" in str(cause):
            return "a shard holds a pickled object, not a tensor: refused to load it"
    return None


def load_checkpoint(path: Path, model: torch.nn.Module, optimizers: list[torch.optim.Optimizer]) -> dict:
    """Fill ``model`` and ``optimizers`` from checkpoint ``path`` (saved with any layout) and restore this
    rank's RNG state; returns the trainer state (Lightning's checkpoint dict without tensors). A
    collective."""
    import torch.distributed.checkpoint as dcp
    from lightning.fabric.utilities.seed import _set_rng_states
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    path = Path(path)
    check_loadable(path)
    meta = load_state(path / TRAINER_FILE)
    saved = meta.get("zaya_layout", {})
    if _rank() == 0:
        log.info("loading %s (saved by %s processes, %s)", path, saved.get("world_size", "?"), saved)
    flat, model_state, optim_states = _tensors(model, optimizers)
    stored_meta = read_dcp_metadata(path / ".metadata").state_dict_metadata
    found = [n for n in flat if n in stored_meta]
    not_tensors = [n for n in found if not isinstance(stored_meta[n], TensorStorageMetadata)]
    if not_tensors:
        raise UnsafeCheckpointFile(
            f"train.resume: {path} stores {not_tensors[0]} as a pickled object: refused to load it"
        )
    stored = set(stored_meta)
    missing = sorted(n for n in flat if "/optim" not in n and "param_groups" not in n and n not in stored)
    if missing:
        raise ConfigError(
            f"train.resume: {path} does not fit this model: it lacks {len(missing)} of its tensors "
            f"(e.g. {', '.join(missing[:3])}); it was saved with {saved}"
        )
    _drop_absent_optimizer_states(flat, optim_states, stored)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed is (not|dis)abled.*")
        warnings.filterwarnings("ignore", message=".*process group is not initialized.*")
        try:
            dcp.load(
                flat,
                storage_reader=SafeFileSystemReader(str(path)),
                planner=TensorsOnlyLoadPlanner(),
                no_dist=not dist.is_initialized(),
            )
        except (Exception, CheckpointException) as exc:
            if unsafe := _unsafe_cause(exc):
                raise UnsafeCheckpointFile(f"train.resume: {path}: {unsafe}") from None
            # e.g. a tensor of another shape: DCP says which deep in its message
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
            why = next((line for line in lines if "mismatch" in line.lower()), lines[-1] if lines else "")
            raise ConfigError(
                f"train.resume: {path} does not fit this model and optimizer ({why}); "
                f"it was saved with {saved}"
            ) from exc
    _restore_param_groups(meta, optim_states, path)
    set_model_state_dict(model, model_state)
    lenient = StateDictOptions(strict=False)  # parameters without a saved state get none, as when saved
    for opt, state in zip(optimizers, optim_states, strict=True):
        set_optimizer_state_dict(model, opt, state, options=lenient)
    rng = meta.pop("zaya_rng")
    _set_rng_states(rng[_rank() % len(rng)])
    return meta
