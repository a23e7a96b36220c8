"""The ZAYA1 routers' balancing biases after each logged step's controller update (identical on every rank).

Metrics: ``bias/l<i>/e<j>`` (``bias/l<i>/skip`` for a skip expert). Outputs: ``router_bias.csv`` (step, layer,
expert, bias; only a header for a router without a balancing bias) and ``router_bias.png`` (the trajectories,
or a note saying there are none: DVC expects every declared plot file to exist).

Shape legend:
    L  layers    E  router choices (the experts, then the skip expert if any)
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch

from zaya_pipeline.train.callbacks.base import PLOTS, TelemetryCallback, log_figures, write_csv
from zaya_pipeline.train.plots import router_bias_or_note_figure, save


def router_biases_LE(model: torch.nn.Module) -> torch.Tensor | None:
    """The balancing bias of every router that has one (ZAYA1), ``(L, E)``; None for routers without."""
    biases = [b.moe.router.expert_bias_E for b in model.blocks if hasattr(b.moe.router, "expert_bias_E")]
    return torch.stack([b.detach().float().cpu() for b in biases]) if biases else None


class RouterBias(TelemetryCallback):
    """Rows: ``bias_rows`` (step, layer, expert, bias)."""

    outputs = ("router_bias.csv", "router_bias.png")

    def __init__(self, log_every: int, max_steps: int, skip_expert: bool = False):
        super().__init__(log_every, max_steps)
        self.skip_expert = skip_expert
        self.bias_rows: list[tuple[int, int, int, float]] = []

    def emit(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int) -> dict[str, float]:
        biases_LE = router_biases_LE(pl_module.model)
        if biases_LE is None:
            return {}
        num_experts = biases_LE.shape[1] - int(self.skip_expert)
        metrics = {}
        for layer, bias_E in enumerate(biases_LE.tolist()):
            for expert, bias in enumerate(bias_E):
                metrics[f"bias/l{layer}/{'skip' if expert == num_experts else f'e{expert}'}"] = bias
                self.bias_rows.append((step, layer, expert, bias))
        return metrics

    def write_outputs(self, reports: Path, logger) -> list[Path]:
        plots = Path(reports) / PLOTS
        figure = router_bias_or_note_figure(self.bias_rows, self.skip_expert)
        paths = [
            write_csv(plots / "router_bias.csv", ("step", "layer", "expert", "bias"), self.bias_rows),
            save(figure, plots / "router_bias.png"),
        ]
        return log_figures(logger, paths)
