"""parallelize_zaya: apply parallelism to a single-device ZayaLM from outside, in a fixed order.

1. expert parallel: each MoE layer keeps its rank's experts and dispatches tokens over the ``ep`` mesh dim;
2. activation checkpointing: ``none`` | ``full`` (every block) | ``selective`` (every 2nd block);
3. ``torch.compile`` of each block (optional);
4. FSDP2: ``fully_shard`` the routed experts over (dp_replicate, dp_shard_out_ep), then every block and the
   root over (dp_replicate, dp_shard). A 2-D mesh with dp_replicate > 1 is HSDP. Parameters are computed in
   ``parallel.param_dtype`` and gradients are reduced in fp32.

Gradient scaling: FSDP averages gradients over the ranks it reduces across. Expert weights also collect the
gradients of the tokens of every EP rank; the dispatch divides those by ep, so with FSDP's average over
their own group (dp_replicate * dp_shard / ep ranks) they end up divided by the whole data-parallel size.
Every gradient then equals the gradient of the mean loss over the global batch (equal tokens per rank), as
``expert_parallel`` documents and the tests check (2 and 4 gloo processes).
"""

from __future__ import annotations

import torch
from torch import nn

from zaya_pipeline.config import ParallelConfig
from zaya_pipeline.errors import ConfigError

AC_MODES = ("none", "full", "selective")
PARAM_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _checkpoint_blocks(model: nn.Module, mode: str) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    every = {"full": 1, "selective": 2}[mode]
    for i, block in enumerate(model.blocks):
        if i % every == 0:
            model.blocks[i] = checkpoint_wrapper(block, preserve_rng_state=False)


def parallelize_zaya(model: nn.Module, mesh, cfg: ParallelConfig) -> nn.Module:
    """Apply EP → activation checkpointing → compile → FSDP2 to ``model`` (a ZayaLM) on ``mesh``
    (``distributed.mesh.build_mesh``); returns the same module, changed in place."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from zaya_pipeline.distributed.expert_parallel import apply_expert_parallel
    from zaya_pipeline.model.moe import MoE
    from zaya_pipeline.model.transformer import compile_blocks

    if cfg.activation_checkpointing not in AC_MODES:
        raise ConfigError(
            f"parallel.activation_checkpointing must be one of {list(AC_MODES)}, "
            f"got {cfg.activation_checkpointing!r}"
        )
    if cfg.param_dtype not in PARAM_DTYPES:
        raise ConfigError(
            f"parallel.param_dtype must be one of {list(PARAM_DTYPES)}, got {cfg.param_dtype!r}"
        )
    ep = mesh["ep"].size()
    if ep > 1:
        apply_expert_parallel(model, mesh["ep"].get_group())
    if cfg.activation_checkpointing != "none":
        _checkpoint_blocks(model, cfg.activation_checkpointing)
    if cfg.compile:
        compile_blocks(model, fullgraph=ep == 1)

    mesh["dp_shard_out_ep", "ep"]._flatten("dp_shard")  # non-expert weights shard over both
    dp_mesh = mesh["dp_replicate", "dp_shard"]
    expert_mesh = mesh["dp_replicate", "dp_shard_out_ep"]
    policy = MixedPrecisionPolicy(param_dtype=PARAM_DTYPES[cfg.param_dtype], reduce_dtype=torch.float32)
    for module in model.modules():
        if isinstance(module, MoE):
            fully_shard(module.experts, mesh=expert_mesh, mp_policy=policy)
    for block in model.blocks:
        fully_shard(block, mesh=dp_mesh, mp_policy=policy)
    fully_shard(model, mesh=dp_mesh, mp_policy=policy)
    return model
