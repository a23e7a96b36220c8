"""Optimizers, parameter groups, LR schedules and the batch-size ramp of the train stage.

* Parameter groups come from ``train.optim.param_groups``: an ordered list of rules, first match wins, and a
  parameter that no rule matches is an error, so every parameter lands in exactly one group.
* ``train.optim.name=adamw``: one ``torch.optim.AdamW`` (fused kernel where the device has one).
  ``muon``: ``MuonAdamW`` with Muon for the ``optimizer: muon`` rules and AdamW for the rest.
* Schedules are pure functions of the optimizer step (and train.max_steps), so a resumed run, or a WSD decay
  started from a stable-phase checkpoint, sees the same LR an uninterrupted run would.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.optim.optimizer import _get_fused_kernels_supported_devices

from zaya_pipeline.config import BatchRampConfig, OptimConfig, ScheduleConfig, TrainConfig
from zaya_pipeline.errors import ConfigError

OPTIMIZERS = ("adamw", "muon")
SCHEDULES = ("cosine", "wsd", "constant")


@dataclass
class ParamGroup:
    name: str
    optimizer: str  # the optimizer that actually steps it: "adamw" or "muon"
    weight_decay: float
    lr_scale: float
    names: list[str]
    params: list[nn.Parameter]


def _matches(rule, name: str, p: nn.Parameter) -> bool:
    return p.ndim >= rule.min_ndim and any(fnmatch.fnmatchcase(name, glob) for glob in rule.match)


def assign_param_groups(model: nn.Module, cfg: OptimConfig) -> list[ParamGroup]:
    """Every trainable parameter in exactly one group: the first rule of ``cfg.param_groups`` it matches
    (fnmatch on the dotted name, and ``ndim >= min_ndim``). Rules that match nothing are left out."""
    if cfg.name not in OPTIMIZERS:
        raise ConfigError(f"train.optim.name: unknown optimizer {cfg.name!r}; choose one of {OPTIMIZERS}")
    groups: dict[int, ParamGroup] = {}
    for i, rule in enumerate(cfg.param_groups):
        if rule.optimizer not in OPTIMIZERS:
            raise ConfigError(
                f"train.optim.param_groups[{i}] ({rule.name!r}).optimizer: {rule.optimizer!r} is not one "
                f"of {OPTIMIZERS}"
            )
    for pname, p in model.named_parameters():  # named_parameters yields a tied weight once
        if not p.requires_grad:
            continue
        i = next((i for i, r in enumerate(cfg.param_groups) if _matches(r, pname, p)), None)
        if i is None:
            raise ConfigError(
                f"parameter {pname!r} (shape {tuple(p.shape)}) matches no rule of train.optim.param_groups; "
                f"end the list with a catch-all rule (match: ['*'])"
            )
        rule = cfg.param_groups[i]
        if i not in groups:
            wd = cfg.weight_decay if rule.weight_decay is None else rule.weight_decay
            kind = "muon" if rule.optimizer == "muon" and cfg.name == "muon" else "adamw"
            groups[i] = ParamGroup(rule.name or f"group{i}", kind, wd, rule.lr_scale, [], [])
        groups[i].names.append(pname)
        groups[i].params.append(p)
    if cfg.name == "muon" and not any(g.optimizer == "muon" for g in groups.values()):
        raise ConfigError("train.optim.name=muon but no parameter matches a rule with optimizer: muon")
    return [groups[i] for i in sorted(groups)]


def check_optim(cfg: OptimConfig) -> None:
    """The optimizer's own settings (the parameter groups are checked by :func:`assign_param_groups`)."""
    for key in ("lr", "eps"):
        if getattr(cfg, key) <= 0:
            raise ConfigError(f"train.optim.{key} must be > 0, got {getattr(cfg, key)}")
    if cfg.name == "muon" and cfg.muon.lr <= 0:
        raise ConfigError(f"train.optim.muon.lr must be > 0, got {cfg.muon.lr}")


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    """AdamW (or Muon + AdamW) over :func:`assign_param_groups`; each torch param group keeps its rule's
    ``name`` so telemetry can log per-group LRs."""
    check_optim(cfg)
    groups = assign_param_groups(model, cfg)
    betas = (cfg.beta1, cfg.beta2)
    torch_groups = []
    for g in groups:
        base = {"params": g.params, "name": g.name, "weight_decay": g.weight_decay}
        if g.optimizer == "muon":
            m = cfg.muon
            base.update(lr=m.lr * g.lr_scale, momentum=m.momentum, nesterov=m.nesterov, ns_steps=m.ns_steps)
        else:
            base.update(lr=cfg.lr * g.lr_scale, betas=betas, eps=cfg.eps)
        torch_groups.append({**base, "optimizer": g.optimizer})
    if cfg.name == "muon":
        from zaya_pipeline.train.muon import MuonAdamW

        return MuonAdamW(torch_groups)
    for g in torch_groups:
        del g["optimizer"]
    devices = {p.device.type for g in groups for p in g.params}
    fused = devices <= set(_get_fused_kernels_supported_devices())
    return torch.optim.AdamW(torch_groups, lr=cfg.lr, betas=betas, eps=cfg.eps, fused=fused)


def skips_on_device(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` can drop an update on the device (torch's ``found_inf`` protocol, as
    ``GradScaler`` uses it): fused AdamW and :class:`~zaya_pipeline.train.muon.MuonAdamW`."""
    from zaya_pipeline.train.muon import MuonAdamW

    return isinstance(optimizer, MuonAdamW) or bool(optimizer.defaults.get("fused"))


def step_unless(optimizer, skip: torch.Tensor) -> None:
    """``optimizer.step()``, whose update is dropped where ``skip`` (a 0-dim bool on the parameters' device,
    e.g. the spike guard's decision) is true — decided on the device, so the step never waits for it.

    The step is always taken (``optimizer`` may be Lightning's wrapper: its step count, the trainer's
    ``global_step``, counts batches whether or not their update applied). An optimizer without a fused kernel
    reads ``skip`` on the host instead and, to skip, steps with no gradients (which changes nothing)."""
    inner = getattr(optimizer, "optimizer", optimizer)  # a LightningOptimizer wraps the torch optimizer
    if skips_on_device(inner):
        inner.found_inf = skip.float()
        try:
            optimizer.step()
        finally:
            del inner.found_inf
        return
    if bool(skip):
        for group in inner.param_groups:
            for p in group["params"]:
                p.grad = None
    optimizer.step()


# --- LR schedules ------------------------------------------------------------------------------------------


def warmup_cosine(step: int, warmup_steps: int, max_steps: int, min_lr_ratio: float) -> float:
    """LR multiplier for optimizer step ``step`` (0-based): linear ramp to 1 over ``warmup_steps``, then a
    cosine from 1 down to ``min_lr_ratio`` at ``max_steps`` (held there afterwards)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def wsd_decay_steps(cfg: ScheduleConfig, max_steps: int) -> int:
    return cfg.decay_steps if cfg.decay_steps > 0 else round(cfg.decay_fraction * max_steps)


def warmup_stable_decay(step: int, cfg: ScheduleConfig, max_steps: int) -> float:
    """WSD (Hu et al. 2024, MiniCPM): warmup, 1.0 until ``max_steps - decay``, then down to ``min_lr_ratio``
    at ``max_steps`` — linearly or as 1 - sqrt(progress) (Hägele et al. 2024)."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    decay = wsd_decay_steps(cfg, max_steps)
    start = max_steps - decay
    if step < start:
        return 1.0
    progress = min(1.0, (step - start) / max(1, decay))
    shape = progress if cfg.decay_shape == "linear" else math.sqrt(progress)
    return 1.0 - (1.0 - cfg.min_lr_ratio) * shape


def check_schedule(cfg: ScheduleConfig, max_steps: int) -> None:
    if cfg.name not in SCHEDULES:
        raise ConfigError(f"train.schedule.name: unknown schedule {cfg.name!r}; choose one of {SCHEDULES}")
    if cfg.warmup_steps < 0 or not 0.0 <= cfg.min_lr_ratio <= 1.0:
        raise ConfigError(
            f"train.schedule.warmup_steps must be >= 0 and train.schedule.min_lr_ratio in [0, 1], "
            f"got {cfg.warmup_steps} and {cfg.min_lr_ratio}"
        )
    if cfg.name == "wsd":
        if cfg.decay_shape not in ("linear", "sqrt"):
            raise ConfigError(
                f"train.schedule.decay_shape must be 'linear' or 'sqrt', got {cfg.decay_shape!r}"
            )
        decay = wsd_decay_steps(cfg, max_steps)
        if not 0 < decay <= max_steps - cfg.warmup_steps:
            raise ConfigError(
                f"train.schedule: a WSD decay of {decay} steps (decay_steps={cfg.decay_steps}, "
                f"decay_fraction={cfg.decay_fraction}) must be > 0 and fit after {cfg.warmup_steps} "
                f"warmup steps in train.max_steps={max_steps}"
            )


def lr_multiplier(step: int, cfg: ScheduleConfig, max_steps: int) -> float:
    if cfg.name == "cosine":
        return warmup_cosine(step, cfg.warmup_steps, max_steps, cfg.min_lr_ratio)
    if cfg.name == "wsd":
        return warmup_stable_decay(step, cfg, max_steps)
    return (step + 1) / cfg.warmup_steps if step < cfg.warmup_steps else 1.0


# --- batch-size ramp ---------------------------------------------------------------------------------------


def full_batch(train: TrainConfig, world_size: int) -> int:
    """Sequences per optimizer step over all ranks once any ramp is over."""
    return train.global_batch or train.micro_batch * world_size


def check_batch(train: TrainConfig, world_size: int) -> None:
    full, ramp = full_batch(train, world_size), train.batch_ramp
    if full % world_size:
        raise ConfigError(
            f"train.global_batch={full} is not divisible by the {world_size} data-parallel ranks"
        )
    if ramp.lr_scaling not in ("sqrt", "linear", "none"):
        raise ConfigError(
            f"train.batch_ramp.lr_scaling must be sqrt, linear or none, got {ramp.lr_scaling!r}"
        )
    if ramp.start == 0:
        return
    if ramp.start < 0 or ramp.increment <= 0 or ramp.steps <= 0 or ramp.start >= full:
        raise ConfigError(
            f"train.batch_ramp: need 0 < start < full batch ({full}), increment > 0 and steps > 0, got "
            f"start={ramp.start}, increment={ramp.increment}, steps={ramp.steps}"
        )
    if (full - ramp.start) % ramp.increment or ramp.start % world_size or ramp.increment % world_size:
        raise ConfigError(
            f"train.batch_ramp: start={ramp.start} plus whole increments of {ramp.increment} must reach the "
            f"full batch {full}, and both must be divisible by the {world_size} data-parallel ranks"
        )
    stages = (full - ramp.start) // ramp.increment
    if ramp.steps < stages:
        raise ConfigError(f"train.batch_ramp.steps={ramp.steps} is shorter than its {stages} stages")


def batch_at(step: int, ramp: BatchRampConfig, full: int) -> int:
    """Global sequences at optimizer step ``step``: ``start`` plus one ``increment`` per stage, the stages
    evenly spread over ``steps``; the full batch from ``steps`` on."""
    if ramp.start == 0 or step >= ramp.steps:
        return full
    stages = (full - ramp.start) // ramp.increment
    return ramp.start + ramp.increment * (step * stages // ramp.steps)


def ramp_lr_factor(step: int, ramp: BatchRampConfig, full: int) -> float:
    power = {"sqrt": 0.5, "linear": 1.0, "none": 0.0}[ramp.lr_scaling]
    return (batch_at(step, ramp, full) / full) ** power


def build_scheduler(
    optimizer: torch.optim.Optimizer, train: TrainConfig, world_size: int = 1
) -> torch.optim.lr_scheduler.LambdaLR:
    """Schedule x batch-ramp LR factor, one multiplier for every param group's peak LR."""
    check_schedule(train.schedule, train.max_steps)
    full = full_batch(train, world_size)

    def multiplier(step: int) -> float:
        lr = lr_multiplier(step, train.schedule, train.max_steps)
        return lr * ramp_lr_factor(step, train.batch_ramp, full)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, multiplier)


def planned_schedule(train: TrainConfig, world_size: int = 1) -> list[tuple[int, float, int]]:
    """(step, LR multiplier, tokens per step) for every step of the run, for the schedule plot."""
    full = full_batch(train, world_size)
    rows = []
    for step in range(train.max_steps):
        lr = lr_multiplier(step, train.schedule, train.max_steps) * ramp_lr_factor(
            step, train.batch_ramp, full
        )
        rows.append((step, lr, batch_at(step, train.batch_ramp, full) * train.seq_len))
    return rows
