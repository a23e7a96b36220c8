"""Training throughput: tokens per second over all ranks, per logging interval, and the model FLOPs
utilisation (MFU) against one device's peak (``train/throughput.py``).

Metrics: ``train/tokens_per_s``, ``train/tokens_per_step``, ``train/tokens_seen`` every interval;
``train/mfu`` and ``train/tflops_per_device`` when a peak is known, ``train/peak_tflops_per_device`` once at
the start. Output: ``throughput.png`` (tokens/s, its median, and MFU on a second axis).

Time spent in validation is not counted as training time. Tokens are counted per batch (the batch ramp
changes them); skipped updates still count as tokens seen. An interval starts when the telemetry's
bookkeeping of the previous one is done (``ProgressReport`` restarts the meter last), so tokens/s measures
the training loop itself.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import lightning as L
import torch

from zaya_pipeline.train.callbacks.base import PLOTS, TelemetryCallback, log_figures, reduce_sum
from zaya_pipeline.train.plots import save, throughput_figure
from zaya_pipeline.train.throughput import Peak, device_name, mfu, resolve_peak
from zaya_pipeline.utils import get_logger

log = get_logger("train")


class ThroughputMeter(TelemetryCallback):
    """Tokens/s per interval and, given ``flops_per_token`` (training FLOPs per token: 3 x
    ``model.sizing.forward_flops_per_token``), MFU against a peak: ``peak_flops`` (FLOP/s of one device),
    else what ``train.throughput.resolve_peak`` finds at train start for the device, ``precision`` and
    ``param_dtype`` (FSDP2's compute dtype; "float32" without FSDP2): a datasheet figure,
    ``$ZAYA_PEAK_TFLOPS`` or, on CPU, a measured one.

    Rows: ``rows`` (step, tokens_per_s), ``mfu_rows`` (step, mfu, tflops_per_device).
    """

    outputs = ("throughput.png",)

    def __init__(
        self,
        log_every: int,
        max_steps: int,
        flops_per_token: int = 0,
        precision: str = "32-true",
        param_dtype: str = "float32",
        peak_flops: float = 0.0,
    ):
        super().__init__(log_every, max_steps)
        self.flops_per_token = flops_per_token  # 0: no MFU
        self.precision = precision  # Lightning precision and FSDP2's param_dtype pick the peak's dtype
        self.param_dtype = param_dtype
        self.peak = Peak(peak_flops, "given") if peak_flops > 0 else None
        self.rows: list[tuple[int, float]] = []  # step, tokens_per_s
        self.mfu_rows: list[tuple[int, float, float]] = []  # step, mfu, tflops_per_device
        self.train_seconds = 0.0
        self.tokens_seen = 0  # over all ranks, since this process started (a resumed run counts from there)
        self.start_step = 0  # > 0 when resumed
        self._t_last: float | None = None  # when the interval started; None before training
        self._paused = 0.0  # seconds of validation inside the interval
        self._tokens = 0
        self._batches = 0

    @property
    def tokens_per_s_median(self) -> float:
        return statistics.median(r[1] for r in self.rows) if self.rows else 0.0

    def throughput_summary(self) -> dict:
        """Medians over the logged intervals for reports/train.json: ``mfu``, ``tflops_per_device`` and the
        ``peak_tflops_per_device`` they are measured against; {} when MFU is not reported."""
        if not self.mfu_rows or self.peak is None:
            return {}
        return {
            "mfu": statistics.median(r[1] for r in self.mfu_rows),
            "tflops_per_device": statistics.median(r[2] for r in self.mfu_rows),
            "peak_tflops_per_device": self.peak.flops / 1e12,
        }

    def eta_s(self, step: int) -> float:
        """Seconds left to ``max_steps`` at the training speed so far."""
        return (self.max_steps - step) * self.train_seconds / max(step - self.start_step, 1)

    def start_interval(self) -> None:
        """Start the clock of the next interval now."""
        self._t_last, self._paused = time.perf_counter(), 0.0

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.flops_per_token > 0 and self.peak is None:
            self._resolve_peak(trainer, pl_module)
        self.start_step = trainer.global_step
        self.start_interval()

    def _resolve_peak(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        device = pl_module.device
        if device.type == "cpu":
            # Every rank measures at once, so each sees its share of the cores, as during training.
            trainer.strategy.barrier()
        name = device_name(device)
        peak = resolve_peak(device.type, name, self.precision, self.param_dtype, trainer.is_global_zero)
        if peak is not None and device.type == "cpu" and trainer.world_size > 1:
            flops = float(trainer.strategy.reduce(torch.tensor(peak.flops), reduce_op="mean"))
            source = f"mean {flops / 1e12:.3g} TFLOP/s of {trainer.world_size} processes measured at once"
            peak = Peak(flops, f"CPU peak {source} (rank 0: {peak.source})")
        self.peak = peak
        if peak is not None:
            if trainer.is_global_zero:
                log.info("MFU against %s per device", peak.source)
            if trainer.logger is not None:
                trainer.logger.log_metrics(
                    {"train/peak_tflops_per_device": peak.flops / 1e12}, step=trainer.global_step
                )

    def add(self, outputs: dict) -> None:
        self._tokens += int(outputs["tokens"])
        self._batches += 1

    def emit(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int) -> dict[str, float]:
        elapsed = time.perf_counter() - self._t_last - self._paused
        self.train_seconds += elapsed
        tokens = reduce_sum(trainer, self._tokens)
        self.tokens_seen += int(tokens)
        tokens_per_s = tokens / max(elapsed, 1e-9)
        self.rows.append((step, tokens_per_s))
        metrics = {
            "train/tokens_per_s": tokens_per_s,
            "train/tokens_per_step": tokens / self._batches,
            "train/tokens_seen": float(self.tokens_seen),
        }
        metrics.update(self._mfu_metrics(step, tokens_per_s / trainer.world_size))  # tok/s: all ranks
        self._tokens = self._batches = 0
        self.start_interval()
        return metrics

    def _mfu_metrics(self, step: int, tokens_per_s_per_device: float) -> dict:
        if self.flops_per_token <= 0 or self.peak is None:
            return {}
        utilisation = mfu(tokens_per_s_per_device, self.flops_per_token, self.peak.flops)
        tflops = tokens_per_s_per_device * self.flops_per_token / 1e12
        self.mfu_rows.append((step, utilisation, tflops))
        return {"train/mfu": utilisation, "train/tflops_per_device": tflops}

    def on_validation_start(self, trainer, pl_module) -> None:
        self._val_t0 = time.perf_counter()

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking and self._t_last is not None:
            self._paused += time.perf_counter() - self._val_t0

    def write_outputs(self, reports: Path, logger) -> list[Path]:
        path = save(throughput_figure(self.rows, self.mfu_rows), Path(reports) / PLOTS / "throughput.png")
        return log_figures(logger, [path])
