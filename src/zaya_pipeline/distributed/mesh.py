"""The device mesh from ``parallel.*``: data-parallel replicate × (FSDP shard outside EP) × expert parallel.

Expert-parallel ranks are taken from the FSDP sharding dimension (as torchtitan does): with
``dp_shard = 4, ep = 2`` non-expert weights are sharded 4 ways, experts are split over 2 ranks and each
expert's weights are sharded over the remaining 2. Sizes are checked up front, with errors that name the
config keys and the numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from zaya_pipeline.config import ParallelConfig
from zaya_pipeline.errors import ConfigError

MESH_DIMS = ("dp_replicate", "dp_shard_out_ep", "ep")


@dataclass(frozen=True)
class MeshSizes:
    dp_replicate: int
    dp_shard: int
    ep: int

    @property
    def dp_shard_out_ep(self) -> int:
        """FSDP degree of the expert weights (the sharding ranks outside one expert-parallel group)."""
        return self.dp_shard // self.ep

    @property
    def world_size(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.dp_replicate, self.dp_shard_out_ep, self.ep)


def mesh_sizes(cfg: ParallelConfig, world_size: int, num_experts: int) -> MeshSizes:
    """Validated mesh sizes for ``world_size`` processes and a model with ``num_experts`` experts."""
    for key in ("dp_replicate", "ep"):
        if getattr(cfg, key) < 1:
            raise ConfigError(f"parallel.{key} must be >= 1, got {getattr(cfg, key)}")
    if world_size % cfg.dp_replicate:
        raise ConfigError(
            f"parallel.dp_replicate={cfg.dp_replicate} does not divide the world size {world_size}"
        )
    dp_shard = world_size // cfg.dp_replicate if cfg.dp_shard == -1 else cfg.dp_shard
    if dp_shard < 1:
        raise ConfigError(f"parallel.dp_shard must be >= 1 or -1 (= the rest), got {cfg.dp_shard}")
    if cfg.dp_replicate * dp_shard != world_size:
        raise ConfigError(
            f"parallel.dp_replicate × parallel.dp_shard = {cfg.dp_replicate} × {dp_shard} = "
            f"{cfg.dp_replicate * dp_shard}, but the world size is {world_size}"
        )
    if dp_shard % cfg.ep:
        raise ConfigError(
            f"parallel.ep={cfg.ep} must divide parallel.dp_shard={dp_shard}: expert-parallel ranks are taken "
            "from the sharding dimension"
        )
    if num_experts % cfg.ep:
        raise ConfigError(f"model.moe.num_experts={num_experts} is not divisible by parallel.ep={cfg.ep}")
    return MeshSizes(cfg.dp_replicate, dp_shard, cfg.ep)


def build_mesh(sizes: MeshSizes, device_type: str = "cpu"):
    """A 3-D ``DeviceMesh`` named ``MESH_DIMS``; the process group must already be initialised."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if dist.get_world_size() != sizes.world_size:
        raise ConfigError(
            f"the mesh {sizes.shape} needs {sizes.world_size} processes, "
            f"but {dist.get_world_size()} are running"
        )
    return init_device_mesh(device_type, sizes.shape, mesh_dim_names=MESH_DIMS)
