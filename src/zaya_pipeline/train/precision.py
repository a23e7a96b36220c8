"""``train.precision=bf16-master``: bf16 weights for the forward and backward, fp32 master weights for the
optimizer, on one process (FSDP2's ``parallel.param_dtype=bfloat16`` does the same sharded).

Outside the forward/backward the parameters ARE the fp32 masters: the optimizer, gradient clipping, the
checkpoints, the saved model and evaluation see nothing else. ``Bf16Weights`` swaps each parameter's data to
a persistent bf16 copy (one cast per step, refreshed from the master) for the micro-batches, and back
afterwards, turning the bf16 gradients into fp32 ones. Unlike ``bf16-mixed`` (autocast) nothing is cast per
use: activations are bf16 from the embedding on, norms run their fused kernel (input and weight in one
dtype), the expert op gets bf16 weights as they are. The loss is computed in fp32 (``lm_loss``).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from zaya_pipeline.config import ParallelConfig, ZayaConfig

AUTO = "auto"
BF16_MASTER = "bf16-master"
OUR_PRECISIONS = (BF16_MASTER,)


def resolved_precision(precision: str, parallel: ParallelConfig) -> str:
    """``train.precision=auto`` (the default): ``bf16-master`` on GPUs (``parallel.accelerator=gpu``, or
    ``auto`` with one present) that support bf16, except under FSDP2, whose ``parallel.param_dtype`` sets the
    compute dtype; ``32-true`` otherwise (CPUs). Any other value is returned as it is."""
    if precision != AUTO:
        return precision
    gpu = parallel.accelerator == "gpu" or (parallel.accelerator == "auto" and torch.cuda.is_available())
    if torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
        gpu = False  # e.g. V100: no bf16
    return BF16_MASTER if gpu and parallel.strategy != "fsdp2" else "32-true"


def with_resolved_precision(cfg: ZayaConfig) -> ZayaConfig:
    """``cfg`` with ``train.precision=auto`` replaced by what it means here (:func:`resolved_precision`)."""
    precision = resolved_precision(cfg.train.precision, cfg.parallel)
    return dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, precision=precision))


def lightning_precision(precision: str) -> str:
    """What Lightning is told: our own modes run under its plain fp32 precision."""
    return "32-true" if precision in OUR_PRECISIONS else precision


class Bf16Weights:
    """``with weights:`` the floating parameters of ``model`` hold bf16 copies of their fp32 masters; on exit
    they hold the masters again, with fp32 gradients. The bf16 copies persist between steps (2 more bytes per
    parameter; ``memory_plan`` counts them)."""

    def __init__(self, model: nn.Module):
        self.params = [p for p in model.parameters() if p.is_floating_point() and p.dtype == torch.float32]
        self._copies: list[torch.Tensor | None] = [None] * len(self.params)
        self._masters: list[torch.Tensor] = []

    def __enter__(self) -> Bf16Weights:
        self._masters = []
        for i, p in enumerate(self.params):
            master = p.data
            copy = self._copies[i]
            if copy is None or copy.shape != master.shape or copy.device != master.device:
                copy = self._copies[i] = torch.empty_like(master, dtype=torch.bfloat16)
            copy.copy_(master)
            self._masters.append(master)
            p.data = copy
            if (
                p.grad is not None
            ):  # accumulated fp32 grads from an earlier window: keep them in bf16 meanwhile
                p.grad = p.grad.to(torch.bfloat16)
        return self

    def __exit__(self, *exc) -> None:
        for p, master in zip(self.params, self._masters, strict=True):
            p.data = master
            if p.grad is not None:
                p.grad = p.grad.float()
        self._masters = []
