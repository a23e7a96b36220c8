"""Per-expert load: the share of routed (token, slot) pairs each router choice got in every logging interval,
over all ranks, and the slots dropped at capacity.

Metrics: ``load/l<i>/e<j>`` (``load/l<i>/skip`` for a skip expert, the last router choice),
``load/l<i>/max_over_mean`` (the skip expert left out; 1 = balanced) and ``train/dropped_frac``.
Outputs: ``expert_load.csv`` (step, layer, expert, fraction) and ``expert_load.png`` (heatmaps over steps).

Shape legend:
    L  layers    E  router choices (the experts, then the skip expert if any)
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch

from zaya_pipeline.train.callbacks.base import PLOTS, TelemetryCallback, log_figures, reduce_sum, write_csv
from zaya_pipeline.train.plots import expert_load_figure, save


class ExpertLoad(TelemetryCallback):
    """Rows: ``load_rows`` (step, layer, expert, fraction); ``worst`` is the largest max/mean load over the
    layers at the last logged step."""

    outputs = ("expert_load.csv", "expert_load.png")

    def __init__(self, log_every: int, max_steps: int, skip_expert: bool = False):
        super().__init__(log_every, max_steps)
        self.skip_expert = skip_expert
        self.load_rows: list[tuple[int, int, int, float]] = []
        self.worst = float("nan")
        self._counts_LE: torch.Tensor | None = None  # routed slots per choice in the interval, this rank
        self._dropped = 0

    def add(self, outputs: dict) -> None:
        counts_LE = outputs["expert_counts_LE"]
        self._counts_LE = counts_LE.clone() if self._counts_LE is None else self._counts_LE + counts_LE
        self._dropped = self._dropped + outputs["dropped_slots"].detach()  # on the device until emit

    def emit(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int) -> dict[str, float]:
        counts_LE = trainer.strategy.reduce(self._counts_LE.float(), reduce_op="sum")
        frac_LE = counts_LE / counts_LE.sum(dim=1, keepdim=True)
        slots = float(counts_LE[0].sum())  # (token, slot) pairs routed per layer in this interval
        dropped = reduce_sum(trainer, float(self._dropped))
        metrics = {"train/dropped_frac": dropped / max(slots * counts_LE.shape[0], 1.0)}
        num_experts = frac_LE.shape[1] - int(self.skip_expert)
        for layer, frac_E in enumerate(frac_LE.tolist()):
            for expert, frac in enumerate(frac_E):
                name = "skip" if expert == num_experts else f"e{expert}"
                metrics[f"load/l{layer}/{name}"] = frac
                self.load_rows.append((step, layer, expert, frac))
            experts_E = frac_E[:num_experts]
            balance = max(experts_E) * num_experts / max(sum(experts_E), 1e-12)
            metrics[f"load/l{layer}/max_over_mean"] = balance
        self.worst = max(metrics[f"load/l{i}/max_over_mean"] for i in range(frac_LE.shape[0]))
        self._counts_LE, self._dropped = None, 0
        return metrics

    def write_outputs(self, reports: Path, logger) -> list[Path]:
        plots = Path(reports) / PLOTS
        paths = [
            write_csv(plots / "expert_load.csv", ("step", "layer", "expert", "fraction"), self.load_rows),
            save(expert_load_figure(self.load_rows, self.skip_expert), plots / "expert_load.png"),
        ]
        return log_figures(logger, paths)
