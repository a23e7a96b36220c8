"""Training progress: one INFO line per logging interval, and a bar of optimizer steps on a terminal.

The line (step/max_steps, loss, aux loss, LR, tokens/s, MFU, max load/mean, skipped steps, ETA) is what CI
logs and files show; it comes from rank 0 only (DEBUG on the others). When stderr is a terminal, rank 0 also
draws a bar (``zaya_pipeline.progress``), which stays silent elsewhere: the lines already say step/max_steps
and ETA. It writes no files.

It reads the metrics the other telemetry callbacks emitted at the same step, so it runs after them; last of
all it restarts the ``ThroughputMeter``'s clock, so the next interval leaves out the telemetry's bookkeeping.
"""

from __future__ import annotations

import lightning as L

from zaya_pipeline.progress import Progress, format_duration
from zaya_pipeline.train.callbacks.base import TelemetryCallback
from zaya_pipeline.train.callbacks.expert_load import ExpertLoad
from zaya_pipeline.train.callbacks.loss_curve import LossCurve
from zaya_pipeline.train.callbacks.throughput_meter import ThroughputMeter
from zaya_pipeline.utils import get_logger

log = get_logger("train")


class ProgressReport(TelemetryCallback):
    def __init__(
        self, log_every: int, max_steps: int, meter: ThroughputMeter, loss: LossCurve, load: ExpertLoad
    ):
        super().__init__(log_every, max_steps)
        self.meter, self.loss, self.load = meter, loss, load
        self.bar: Progress | None = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            self.bar = Progress(
                self.max_steps,
                "train",
                "step",
                logger=log,
                initial=trainer.global_step,
                plain=False,
                redirect=("zaya", "lightning.pytorch"),  # Lightning's own notes print above the bar too
            )

    def on_train_end(self, trainer, pl_module) -> None:
        self._close_bar()

    def on_exception(self, trainer, pl_module, exception) -> None:
        self._close_bar()

    def _close_bar(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if self.bar is not None:
            self.bar.advance_to(trainer.global_step)

    def emit(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int) -> dict[str, float]:
        losses, speed = self.loss.last_metrics, self.meter.last_metrics
        loss, tokens_per_s = losses["train/loss"], speed["train/tokens_per_s"]
        mfu = f"  MFU {100 * speed['train/mfu']:.1f}%" if "train/mfu" in speed else ""
        info = log.info if trainer.is_global_zero else log.debug  # one progress line per step, not per rank
        info(
            "step %d/%d  loss %.4f  aux %.4f  lr %.2e  %.0f tok/s%s  max load/mean %.2f  skipped %d  ETA %s",
            *(step, self.max_steps, loss, losses["train/aux_loss"], losses["train/lr"], tokens_per_s, mfu),
            *(self.load.worst, self.loss.skipped_steps, format_duration(self.meter.eta_s(step))),
        )
        if self.bar is not None:
            self.bar.advance_to(step, loss=f"{loss:.4f}", tok_s=f"{tokens_per_s:,.0f}")
        self.meter.start_interval()  # the next interval starts after all this bookkeeping
        return {}
