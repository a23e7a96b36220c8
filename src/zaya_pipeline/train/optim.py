"""AdamW with decoupled weight decay on matrices only, and a linear-warmup + cosine LR schedule."""

from __future__ import annotations

import math

import torch
from torch import nn

from zaya_pipeline.config import OptimConfig
from zaya_pipeline.errors import ConfigError


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay only >= 2-D weights that are not embeddings or norms (decaying gains or token vectors hurts)."""
    no_decay = set()
    for module in model.modules():
        if isinstance(module, nn.Embedding | nn.RMSNorm | nn.LayerNorm):
            no_decay.update(id(p) for p in module.parameters(recurse=False))
    decay, keep = [], []
    for p in model.parameters():  # parameters() yields a tied weight once
        if not p.requires_grad:
            continue
        (decay if p.ndim >= 2 and id(p) not in no_decay else keep).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": keep, "weight_decay": 0.0}]


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    if cfg.name != "adamw":
        raise ConfigError(f"train.optim.name: unknown optimizer {cfg.name!r}; choose 'adamw'")
    if cfg.lr <= 0:
        raise ConfigError(f"train.optim.lr must be > 0, got {cfg.lr}")
    return torch.optim.AdamW(
        param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps
    )


def warmup_cosine(step: int, warmup_steps: int, max_steps: int, min_lr_ratio: float) -> float:
    """LR multiplier for optimizer step ``step`` (0-based): linear ramp to 1 over ``warmup_steps``, then a
    cosine from 1 down to ``min_lr_ratio`` at ``max_steps`` (held there afterwards)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: OptimConfig, max_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    if cfg.warmup_steps < 0 or not 0.0 <= cfg.min_lr_ratio <= 1.0:
        raise ConfigError(
            f"train.optim.warmup_steps must be >= 0 and train.optim.min_lr_ratio in [0, 1], "
            f"got {cfg.warmup_steps} and {cfg.min_lr_ratio}"
        )
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_cosine(step, cfg.warmup_steps, max_steps, cfg.min_lr_ratio)
    )
