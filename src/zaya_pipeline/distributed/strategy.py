"""The Lightning strategy of ``parallel.strategy=fsdp2``: Lightning's ModelParallelStrategy with our mesh.

Lightning launches the processes (``parallel.devices=N``, or torchrun / SLURM environments) and sets up the
process group (gloo on CPU, NCCL/RCCL on GPUs). This subclass then builds the mesh from ``parallel.*``
(``distributed.mesh``), and ``ZayaLitModule.configure_model`` applies ``parallelize_zaya`` on it.
"""

from __future__ import annotations

from lightning.pytorch.strategies import ModelParallelStrategy, ParallelStrategy

from zaya_pipeline.config import ParallelConfig
from zaya_pipeline.distributed.mesh import build_mesh, mesh_sizes


class ZayaParallelStrategy(ModelParallelStrategy):
    def __init__(self, parallel_cfg: ParallelConfig, num_experts: int):
        super().__init__(save_distributed_checkpoint=True)
        self.parallel_cfg = parallel_cfg
        self.num_experts = num_experts

    def setup_environment(self) -> None:
        ParallelStrategy.setup_environment(self)  # not ModelParallelStrategy's: it builds a (dp, tp) mesh
        self._setup_distributed()
        sizes = mesh_sizes(self.parallel_cfg, self.world_size, self.num_experts)
        self._device_mesh = build_mesh(sizes, self.root_device.type)
        self.lightning_module._device_mesh = self._device_mesh

    @property
    def distributed_sampler_kwargs(self) -> dict:
        return {"num_replicas": self.world_size, "rank": self.global_rank}
