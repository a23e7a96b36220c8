"""The base of the telemetry callbacks: one logging interval of ``train.log_every`` optimizer steps, the
metrics it logs, and the files a callback writes at the end.

Every training batch's outputs (``ZayaLitModule.training_step``) are added to the interval (``add``). At
every ``log_every``-th optimizer step and at the last one, ``emit`` reduces the interval over the ranks
(every rank calls it, in the callbacks' order, so the collectives match), keeps its rows and returns the
metrics, which are logged at that step and kept as ``last_metrics``. After training, rank 0 calls
``write_outputs``: the callback writes the files named in ``outputs`` under ``<reports>/plots`` (DVC plots
CSVs and PNGs) and logs its figures to the MLflow run under ``plots/``.
"""

from __future__ import annotations

import csv
import os
import tempfile
from pathlib import Path

import lightning as L
import torch

PLOTS = "plots"  # the folder under paths.reports, and the artifact folder of the run


def is_logging_step(step: int, log_every: int, max_steps: int) -> bool:
    """Whether optimizer step ``step`` closes a logging interval: every ``log_every``-th and the last."""
    return step % max(1, log_every) == 0 or step >= max_steps


class TelemetryCallback(L.Callback):
    outputs: tuple[str, ...] = ()  # the files write_outputs writes under <reports>/plots

    def __init__(self, log_every: int, max_steps: int):
        self.log_every = max(1, log_every)
        self.max_steps = max_steps
        self.last_emitted_step = -1
        self.last_metrics: dict[str, float] = {}  # what emit returned at last_emitted_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.add(outputs)
        step = trainer.global_step
        if step > self.last_emitted_step and is_logging_step(step, self.log_every, self.max_steps):
            self.last_metrics = self.emit(trainer, pl_module, step)
            self.last_emitted_step = step
            if self.last_metrics and trainer.logger is not None:
                trainer.logger.log_metrics(self.last_metrics, step=step)

    def add(self, outputs: dict) -> None:
        """Add one training batch's outputs to the interval."""

    def emit(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int) -> dict[str, float]:
        """Close the interval at optimizer step ``step``: reduce it over the ranks, keep rows, start the next
        one; returns the metrics to log at ``step``."""
        return {}

    def write_outputs(self, reports: Path, logger) -> list[Path]:
        """Rank 0, after training: write ``outputs`` under ``<reports>/plots``, log the figures to the run;
        returns the paths written."""
        return []


def reduce_sum(trainer: L.Trainer, x: float) -> float:
    """``x`` summed over all ranks (a collective)."""
    return float(trainer.strategy.reduce(torch.tensor(float(x)), reduce_op="sum"))


def reduce_mean(trainer: L.Trainer, x: float) -> float:
    """``x`` averaged over all ranks (a collective)."""
    return float(trainer.strategy.reduce(torch.tensor(float(x)), reduce_op="mean"))


def write_csv(path: Path, header: tuple[str, ...], rows: list[tuple]) -> Path:
    """A CSV with ``header`` and ``rows``, written atomically (temp file + rename); returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    os.replace(tmp, path)
    return path


def log_figures(logger, paths: list[Path]) -> list[Path]:
    """Log the ``.png`` files of ``paths`` to the logger's MLflow run under ``plots/``; returns ``paths``."""
    for path in paths:
        if path.suffix == ".png":
            logger.experiment.log_artifact(logger.run_id, str(path), PLOTS)
    return paths
