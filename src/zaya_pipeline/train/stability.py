"""Loss-spike and NaN/Inf guard: decide on the device, from a step's all-rank mean loss and grad norm, whether
its update applies.

A step's update is skipped when its loss or gradient norm is not finite, or when its loss is a spike (more
than ``spike_zscore`` rolling standard deviations above the rolling mean of the last ``spike_window``
accepted losses) and ``spike_skip`` is on. Spikes never enter the window.

Everything lives in device tensors and :meth:`SpikeGuard.decide` returns device booleans, so the training
step never waits for the device (ADR 0009): the optimizer applies or drops the update on the device
(:func:`zaya_pipeline.train.optim.step_unless`). The host reads the guard only where it reads anyway: a
checkpoint saves it, and on logging steps and at the last step :meth:`SpikeGuard.check` stops training with a
:class:`TrainingError` once ``max_skips_in_row`` skipped steps in a row have happened (so a run that goes bad
stops at the next logging step, not at the streak's last step). The state is saved in
checkpoints, so a resumed run makes the same decisions.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from zaya_pipeline.config import StabilityConfig
from zaya_pipeline.errors import ConfigError, TrainingError

MIN_HISTORY = 10  # losses in the window before spikes are flagged


class SpikeGuard:
    """The guard's state as device tensors (:meth:`to` moves them; not module buffers, which a precision
    plugin could cast). The checkpoint holds :meth:`guard_state`'s plain lists and numbers."""

    COUNTERS = ("accepted", "steps", "skips_in_row", "skipped_total", "spikes_total", "tripped_at")

    def __init__(self, cfg: StabilityConfig):
        if cfg.spike_zscore < 0 or cfg.spike_window < MIN_HISTORY or cfg.max_skips_in_row < 1:
            raise ConfigError(
                f"train.stability: need spike_zscore >= 0, spike_window >= {MIN_HISTORY} and "
                f"max_skips_in_row >= 1, got {cfg.spike_zscore}, {cfg.spike_window} and "
                f"{cfg.max_skips_in_row}"
            )
        self.cfg = cfg
        # float64: the z-score of a loss near 3 with a std of 1e-3 needs more than fp32's 7 digits
        self.window = torch.zeros(cfg.spike_window, dtype=torch.float64)
        for name in self.COUNTERS:
            setattr(self, name, torch.zeros((), dtype=torch.int64))
        # the loss and grad norm where a streak reached max_skips_in_row, at step tripped_at (0: not yet)
        self.tripped = torch.zeros(2, dtype=torch.float64)

    def to(self, device: torch.device | str) -> SpikeGuard:
        """Move the state to ``device`` (the training step's); returns the guard."""
        for name in ("window", "tripped", *self.COUNTERS):
            setattr(self, name, getattr(self, name).to(device))
        return self

    def _filled(self) -> Tensor:
        return self.accepted.clamp(max=self.cfg.spike_window)

    def zscore(self, loss: Tensor) -> Tensor:
        """How many window standard deviations ``loss`` lies above the window mean; 0 before
        ``MIN_HISTORY`` accepted losses or when the window has no spread."""
        n = self._filled()
        used = torch.arange(self.cfg.spike_window, device=n.device) < n
        count = n.clamp(min=1).to(torch.float64)
        mean = torch.where(used, self.window, 0).sum() / count
        std = (torch.where(used, self.window - mean, 0).square().sum() / count).sqrt()
        z = (loss.to(torch.float64) - mean) / torch.where(std > 0, std, 1)
        return torch.where((n >= MIN_HISTORY) & (std > 0), z, 0)

    @torch.no_grad()
    def decide(self, loss: Tensor, grad_norm: Tensor) -> tuple[Tensor, Tensor]:
        """(apply the update?, is it a spike?) for one step, as device booleans; updates the state on the
        device (no host read)."""
        loss = loss.detach().to(self.window.device, torch.float64)
        grad_norm = grad_norm.detach().to(self.window.device, torch.float64)
        finite = torch.isfinite(loss) & torch.isfinite(grad_norm)
        if self.cfg.spike_zscore > 0:
            spike = finite & (self.zscore(loss) > self.cfg.spike_zscore)
        else:
            spike = torch.zeros_like(finite)
        apply = finite & ~spike if self.cfg.spike_skip else finite
        accept = finite & ~spike
        size = self.cfg.spike_window
        slot = torch.arange(size, device=loss.device) == self.accepted % size
        self.window.copy_(torch.where(accept & slot, loss, self.window))
        self.accepted += accept.long()
        self.steps += 1
        self.skips_in_row.copy_(torch.where(apply, 0, self.skips_in_row + 1))
        self.skipped_total += (~apply).long()
        self.spikes_total += spike.long()
        trips = (self.tripped_at == 0) & (self.skips_in_row >= self.cfg.max_skips_in_row)
        self.tripped_at.copy_(torch.where(trips, self.steps, self.tripped_at))
        self.tripped.copy_(torch.where(trips, torch.stack([loss, grad_norm]), self.tripped))
        return apply, spike

    def check(self) -> None:
        """Raise :class:`TrainingError` if a streak of ``max_skips_in_row`` skipped steps happened (reads the
        device: call it where the host reads anyway)."""
        at = int(self.tripped_at)
        if not at:
            return
        loss, norm = self.tripped.tolist()
        why = "a loss spike" if math.isfinite(loss) and math.isfinite(norm) else "not finite"
        raise TrainingError(
            f"{self.cfg.max_skips_in_row} updates in a row skipped by step {at} (the last: loss {loss:.4g}, "
            f"grad norm {norm:.4g}, {why}); lower train.optim.lr, or raise train.stability.max_skips_in_row"
        )

    def totals(self) -> tuple[int, int]:
        """(skipped steps, loss spikes) so far (reads the device)."""
        skipped, spikes = torch.stack([self.skipped_total, self.spikes_total]).tolist()
        return skipped, spikes

    def recent_losses(self) -> list[float]:
        """The accepted losses in the window, oldest first (reads the device)."""
        n, size = int(self._filled()), self.cfg.spike_window
        order = torch.arange(int(self.accepted) - n, int(self.accepted)) % size
        return self.window.cpu()[order].tolist()

    def guard_state(self) -> dict:
        """The checkpoint's record of the guard: plain lists and numbers (reads the device)."""
        skipped, spikes = self.totals()
        return {
            "window": self.recent_losses(),
            "skips_in_row": int(self.skips_in_row),
            "skipped_total": skipped,
            "spikes_total": spikes,
            "steps": int(self.steps),
        }

    def load_guard_state(self, state: dict) -> None:
        """Restore :meth:`guard_state` (a checkpoint's ``zaya.guard``; older ones have no ``steps``)."""
        losses = list(state["window"])[-self.cfg.spike_window :]
        self.window.zero_()
        self.window[: len(losses)] = torch.tensor(losses, dtype=torch.float64)
        self.accepted.fill_(len(losses))
        self.skips_in_row.fill_(state["skips_in_row"])
        self.skipped_total.fill_(state["skipped_total"])
        self.spikes_total.fill_(state["spikes_total"])
        self.steps.fill_(state.get("steps", 0))
        self.tripped_at.zero_()
