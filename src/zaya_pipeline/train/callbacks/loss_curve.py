"""The loss curve: interval-averaged training loss, the routers' auxiliary losses, gradient norm and LR, the
skipped updates and loss spikes, and the validation loss after each pass.

Metrics: ``train/loss``, ``train/aux_loss``, ``train/z_loss``, ``train/grad_norm``, ``train/lr`` (the first
parameter group) and ``train/lr/<group>``, ``train/skipped_steps``, ``train/spikes``; ``val/loss``.
Outputs: ``train.csv`` (step, loss, lr, tokens_per_s: the tokens/s column is the ``ThroughputMeter``'s),
``val.csv`` (step, val_loss), ``loss.png`` (beside the unigram baseline) and ``lr.png``.
"""

from __future__ import annotations

from pathlib import Path

import lightning as L
import torch

from zaya_pipeline.train.callbacks.base import (
    PLOTS,
    TelemetryCallback,
    log_figures,
    reduce_mean,
    write_csv,
)
from zaya_pipeline.train.callbacks.throughput_meter import ThroughputMeter
from zaya_pipeline.train.plots import loss_figure, lr_figure, save
from zaya_pipeline.utils import get_logger

log = get_logger("train")


class LossCurve(TelemetryCallback):
    """Rows: ``rows`` (step, loss, lr) per logged step, ``val_rows`` (step, val_loss) per validation pass;
    ``train_rows`` joins the meter's tokens/s to ``rows``. ``unigram_nats`` (nats/token) is drawn as the
    baseline of ``loss.png``."""

    outputs = ("train.csv", "val.csv", "loss.png", "lr.png")

    def __init__(
        self, log_every: int, max_steps: int, meter: ThroughputMeter, unigram_nats: float | None = None
    ):
        super().__init__(log_every, max_steps)
        self.meter = meter
        self.unigram_nats = unigram_nats
        self.rows: list[tuple[int, float, float]] = []
        self.val_rows: list[tuple[int, float]] = []
        self.last_val_step = -1
        self.skipped_steps = 0
        self.spikes = 0
        self._reset_interval()

    def _reset_interval(self) -> None:
        # on the device until emit: losses, finite grad norms and their count, skipped steps, spikes
        keys = ("ce", "aux", "z_loss", "grad_norm", "finite_norms", "skipped", "spikes")
        self._sums = dict.fromkeys(keys, 0.0)
        self._batches = 0

    @property
    def last_train_loss(self) -> float:
        return self.rows[-1][1] if self.rows else float("nan")

    @property
    def train_rows(self) -> list[tuple[int, float, float, float]]:
        """(step, loss, lr, tokens_per_s): the rows of train.csv."""
        tokens_per_s = dict(self.meter.rows)
        return [(step, loss, lr, tokens_per_s[step]) for step, loss, lr in self.rows]

    def add(self, outputs: dict) -> None:
        for key in ("ce", "aux", "z_loss"):  # summed on the device, read once per log interval (emit)
            self._sums[key] = self._sums[key] + outputs[key].detach().float()
        norm = outputs["grad_norm"].detach().float()
        finite = torch.isfinite(norm)
        self._sums["grad_norm"] = self._sums["grad_norm"] + torch.where(finite, norm, 0)
        self._sums["finite_norms"] = self._sums["finite_norms"] + finite.float()
        self._sums["skipped"] = self._sums["skipped"] + (~outputs["applied"]).float()
        self._sums["spikes"] = self._sums["spikes"] + outputs["spike"].float()
        self._batches += 1

    def emit(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int) -> dict[str, float]:
        values = torch.stack([torch.as_tensor(v) for v in self._sums.values()]).tolist()  # the one read
        sums = dict(zip(self._sums, values, strict=True))
        # every rank took the same decisions (the guard decides on all-rank values)
        self.skipped_steps += round(sums["skipped"])
        self.spikes += round(sums["spikes"])
        loss = reduce_mean(trainer, sums["ce"] / self._batches)
        groups = trainer.optimizers[0].param_groups
        lr = groups[0]["lr"]  # the LR this step used (the scheduler steps after)
        metrics = {
            "train/loss": loss,
            "train/aux_loss": reduce_mean(trainer, sums["aux"] / self._batches),
            "train/z_loss": reduce_mean(trainer, sums["z_loss"] / self._batches),
            "train/grad_norm": sums["grad_norm"] / max(sums["finite_norms"], 1),
            "train/lr": lr,
            "train/skipped_steps": float(self.skipped_steps),
            "train/spikes": float(self.spikes),
        }
        for group in groups:
            metrics[f"train/lr/{group.get('name', 'group')}"] = group["lr"]
        self.rows.append((step, loss, lr))
        self._reset_interval()
        return metrics

    def on_validation_start(self, trainer, pl_module) -> None:
        self._val_sum = 0.0
        self._val_tokens = 0

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self._val_sum += float(outputs["ce"]) * outputs["tokens"]
        self._val_tokens += outputs["tokens"]

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking or self._val_tokens == 0:
            return
        reduce = trainer.strategy.reduce
        total = float(reduce(torch.tensor(self._val_sum), reduce_op="sum"))
        tokens = float(reduce(torch.tensor(float(self._val_tokens)), reduce_op="sum"))
        val_loss = total / tokens
        step = trainer.global_step
        if trainer.logger is not None:
            trainer.logger.log_metrics({"val/loss": val_loss}, step=step)
        self.val_rows.append((step, val_loss))
        self.last_val_step = step
        if trainer.is_global_zero:
            log.info("step %d/%d  val_loss %.4f  (%d tokens)", step, self.max_steps, val_loss, int(tokens))

    def write_outputs(self, reports: Path, logger) -> list[Path]:
        plots = Path(reports) / PLOTS
        rows = self.train_rows
        paths = [
            write_csv(plots / "train.csv", ("step", "loss", "lr", "tokens_per_s"), rows),
            write_csv(plots / "val.csv", ("step", "val_loss"), self.val_rows),
            save(loss_figure(rows, self.val_rows, self.unigram_nats), plots / "loss.png"),
            save(lr_figure(rows), plots / "lr.png"),
        ]
        return log_figures(logger, paths)
