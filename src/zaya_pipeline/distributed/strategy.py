"""Our Lightning strategies: checkpoints through ``distributed.checkpoint`` for every layout, and the mesh of
``parallel.strategy=fsdp2``.

* :class:`ZayaParallelStrategy` (``parallel.strategy=fsdp2``): Lightning's ModelParallelStrategy with our
  mesh. Lightning launches the processes (``parallel.devices``, or torchrun / SLURM environments) and sets
  up the process group (gloo on CPU, NCCL/RCCL on GPUs); this subclass builds the mesh from ``parallel.*``
  (``distributed.mesh``) and ``ZayaLitModule.configure_model`` applies ``parallelize_zaya`` on it.
* :class:`ZayaSingleDeviceStrategy`: one process, the default.

Both save and load checkpoints with :mod:`zaya_pipeline.distributed.checkpoint`, so a checkpoint of either
resumes in the other (and in any other mesh).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.strategies import ModelParallelStrategy, ParallelStrategy, SingleDeviceStrategy

from zaya_pipeline.config import ParallelConfig
from zaya_pipeline.distributed import checkpoint as ckpt
from zaya_pipeline.distributed.mesh import build_mesh, mesh_sizes


class DcpCheckpointing:
    """Strategy mixin: ``trainer.save_checkpoint`` and ``fit(ckpt_path=...)`` through our DCP format.

    Lightning builds its checkpoint dict (loops, LR schedulers, the module's ``on_save_checkpoint`` extras);
    the tensors of the model and the optimizers do not go through that dict: they are taken from the
    module and the optimizers directly, sharded as they are. Loading happens after setup, when the
    (parallelized) model and its optimizers exist.
    """

    def layout(self) -> dict:
        return {"strategy": type(self).__name__}

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        return True

    def lightning_module_state_dict(self) -> dict[str, Any]:
        return {}  # saved by save_checkpoint, sharded

    def optimizer_state(self, optimizer) -> dict[str, Any]:
        return {}

    def save_checkpoint(self, checkpoint: dict, filepath, storage_options: Any | None = None) -> None:
        rest = {k: v for k, v in checkpoint.items() if k not in ("state_dict", "optimizer_states")}
        ckpt.save_checkpoint(
            Path(filepath), self.lightning_module.model, self.optimizers, rest, self.layout()
        )

    def load_checkpoint(self, checkpoint_path, weights_only: bool | None = None) -> dict[str, Any]:
        meta = ckpt.load_checkpoint(Path(checkpoint_path), self.lightning_module.model, self.optimizers)
        return {**meta, "state_dict": {}, "optimizer_states": []}

    def load_model_state_dict(self, checkpoint, strict: bool = True, **kwargs) -> None:
        pass  # load_checkpoint filled the model

    def load_optimizer_state_dict(self, checkpoint) -> None:
        pass  # ... and the optimizers

    def remove_checkpoint(self, filepath) -> None:
        if self.is_global_zero:
            shutil.rmtree(filepath, ignore_errors=True)


class ZayaSingleDeviceStrategy(DcpCheckpointing, SingleDeviceStrategy):
    """One process on one device."""


def single_device(accelerator: str) -> torch.device:
    """The device of a one-process run for ``parallel.accelerator``."""
    if accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", 0)  # ROCm builds of torch use the cuda device type too
    return torch.device("cpu")


class ZayaParallelStrategy(DcpCheckpointing, ModelParallelStrategy):
    def __init__(self, parallel_cfg: ParallelConfig, num_experts: int):
        super().__init__(save_distributed_checkpoint=True)
        self.parallel_cfg = parallel_cfg
        self.num_experts = num_experts

    def setup_environment(self) -> None:
        ParallelStrategy.setup_environment(self)  # not ModelParallelStrategy's: it builds a (dp, tp) mesh
        self._setup_distributed()
        self.sizes = mesh_sizes(self.parallel_cfg, self.world_size, self.num_experts)
        self._device_mesh = build_mesh(self.sizes, self.root_device.type)
        self.lightning_module._device_mesh = self._device_mesh

    def layout(self) -> dict:
        s = self.sizes
        return {**super().layout(), "dp_replicate": s.dp_replicate, "dp_shard": s.dp_shard, "ep": s.ep}

    @property
    def distributed_sampler_kwargs(self) -> dict:
        return {"num_replicas": self.world_size, "rank": self.global_rank}
