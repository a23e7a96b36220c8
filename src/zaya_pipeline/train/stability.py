"""Loss-spike and NaN/Inf guard: decide from a step's all-rank mean loss whether to apply its update.

A step is skipped when its loss or gradient norm is not finite, or when its loss is a spike (more than
``spike_zscore`` rolling standard deviations above the rolling mean of the last ``spike_window`` accepted
losses) and ``spike_skip`` is on. Spikes never enter the window. After ``max_skips_in_row`` skipped steps in
a row training stops with a :class:`TrainingError`. The state is saved in checkpoints, so a resumed run
makes the same decisions.
"""

from __future__ import annotations

import math
from collections import deque

from zaya_pipeline.config import StabilityConfig
from zaya_pipeline.errors import ConfigError, TrainingError

MIN_HISTORY = 10  # losses in the window before spikes are flagged


class SpikeGuard:
    def __init__(self, cfg: StabilityConfig):
        if cfg.spike_zscore < 0 or cfg.spike_window < MIN_HISTORY or cfg.max_skips_in_row < 1:
            raise ConfigError(
                f"train.stability: need spike_zscore >= 0, spike_window >= {MIN_HISTORY} and "
                f"max_skips_in_row >= 1, got {cfg.spike_zscore}, {cfg.spike_window} and "
                f"{cfg.max_skips_in_row}"
            )
        self.cfg = cfg
        self.window: deque[float] = deque(maxlen=cfg.spike_window)
        self.skips_in_row = 0
        self.skipped_total = 0
        self.spikes_total = 0

    def zscore(self, loss: float) -> float:
        if len(self.window) < MIN_HISTORY:
            return 0.0
        mean = sum(self.window) / len(self.window)
        std = math.sqrt(sum((x - mean) ** 2 for x in self.window) / len(self.window))
        return (loss - mean) / std if std > 0 else 0.0

    def decide(self, loss: float, grad_norm: float) -> tuple[bool, bool]:
        """(apply the update?, is it a spike?) for one step; raises after too many skips in a row."""
        finite = math.isfinite(loss) and math.isfinite(grad_norm)
        spike = finite and self.cfg.spike_zscore > 0 and self.zscore(loss) > self.cfg.spike_zscore
        apply = finite and not (spike and self.cfg.spike_skip)
        self.spikes_total += spike
        if finite and not spike:
            self.window.append(loss)
        if apply:
            self.skips_in_row = 0
            return True, spike
        self.skips_in_row += 1
        self.skipped_total += 1
        if self.skips_in_row >= self.cfg.max_skips_in_row:
            why = "not finite" if not finite else "a loss spike"
            raise TrainingError(
                f"{self.skips_in_row} updates in a row skipped (the last: loss {loss:.4g}, grad norm "
                f"{grad_norm:.4g}, {why}); lower train.optim.lr, or raise train.stability.max_skips_in_row"
            )
        return False, spike

    def state_dict(self) -> dict:
        return {
            "window": list(self.window),
            "skips_in_row": self.skips_in_row,
            "skipped_total": self.skipped_total,
            "spikes_total": self.spikes_total,
        }

    def load_state_dict(self, state: dict) -> None:
        self.window = deque(state["window"], maxlen=self.cfg.spike_window)
        self.skips_in_row = state["skips_in_row"]
        self.skipped_total = state["skipped_total"]
        self.spikes_total = state["spikes_total"]
