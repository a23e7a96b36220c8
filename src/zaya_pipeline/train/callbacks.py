"""Training telemetry: interval-averaged loss, LR, throughput (tokens/s, MFU), per-expert load and the ZAYA1
routers' balancing biases, sent to the Lightning logger (MLflow), kept as rows for the DVC plots files and
figures (train/plots.py), and printed as one progress line per interval (above a progress bar on a terminal).

Shape legend:
    L  layers    E  experts
"""

from __future__ import annotations

import math
import statistics
import time

import lightning as L
import torch

from zaya_pipeline.progress import Progress, format_duration
from zaya_pipeline.train.throughput import Peak, device_name, mfu, resolve_peak
from zaya_pipeline.utils import get_logger

log = get_logger("train")


def router_biases_LE(model: torch.nn.Module) -> torch.Tensor | None:
    """The balancing bias of every router that has one (ZAYA1), ``(L, E)``; None for routers without."""
    biases = [b.moe.router.expert_bias_E for b in model.blocks if hasattr(b.moe.router, "expert_bias_E")]
    return torch.stack([b.detach().float().cpu() for b in biases]) if biases else None


class TrainTelemetry(L.Callback):
    """Metrics every ``log_every`` optimizer steps (and at the last step), validation loss after each pass.

    Rows: ``train_rows`` (step, loss, lr, tokens_per_s), ``val_rows`` (step, val_loss), ``load_rows``
    (step, layer, expert, fraction) and, for routers with a balancing bias (ZAYA1), ``bias_rows`` (step,
    layer, expert, bias: the bias after that step's update, also logged as ``bias/l<i>/e<j>``). Time spent
    in validation is not counted as training time. With a skip expert, the last router choice is logged as
    ``load/l<i>/skip`` (``bias/l<i>/skip``) and left out of ``max_over_mean``.
    Tokens are counted per batch (the batch ramp changes them); skipped updates still count as tokens seen.

    MFU (``train/mfu``, ``train/tflops_per_device``) is logged when ``flops_per_token`` (training FLOPs per
    token: 3 x ``model.sizing.forward_flops_per_token``) is given and a peak is known: ``peak_flops`` (FLOP/s
    of one device), else what ``train.throughput.resolve_peak`` finds at train start for the device,
    ``precision`` and ``param_dtype`` (FSDP2's compute dtype; "float32" without FSDP2): a datasheet figure,
    ``$ZAYA_PEAK_TFLOPS`` or, on CPU, a measured one.

    Progress: the lines above on INFO; when stderr is a terminal, rank 0 also draws a bar of optimizer steps
    (``zaya_pipeline.progress``), which stays silent elsewhere: the lines already say step/max_steps and ETA.
    """

    def __init__(
        self,
        log_every: int,
        max_steps: int,
        skip_expert: bool = False,
        source_names: tuple[str, ...] = ("main",),
        flops_per_token: int = 0,
        precision: str = "32-true",
        param_dtype: str = "float32",
        peak_flops: float = 0.0,
    ):
        self.flops_per_token = flops_per_token  # 0: no MFU
        self.precision = precision  # Lightning precision and FSDP2's param_dtype pick the peak's dtype
        self.param_dtype = param_dtype
        self.peak = Peak(peak_flops, "given") if peak_flops > 0 else None
        self.mfu_rows: list[tuple[int, float, float]] = []  # step, mfu, tflops_per_device
        self.skip_expert = skip_expert
        self.source_names = source_names
        self.log_every = max(1, log_every)
        self.max_steps = max_steps
        self.train_rows: list[tuple[int, float, float, float]] = []
        self.val_rows: list[tuple[int, float]] = []
        self.load_rows: list[tuple[int, int, int, float]] = []
        self.bias_rows: list[tuple[int, int, int, float]] = []
        self.bar: Progress | None = None
        self.last_val_step = -1
        self.last_emitted_step = -1
        self.train_seconds = 0.0
        self.tokens_seen = 0  # over all ranks, since this process started (a resumed run counts from there)
        self.skipped_steps = 0
        self.spikes = 0
        self._reset_interval()

    def _reset_interval(self) -> None:
        self._sums = {"ce": 0.0, "aux": 0.0, "z_loss": 0.0, "grad_norm": 0.0}
        self._dropped = 0
        self._batches = 0
        self._finite_norms = 0
        self._tokens = 0
        self._skipped = 0
        self._spikes = 0
        self._sources = [0] * len(self.source_names)
        self._phase = 0
        self._counts_LE: torch.Tensor | None = None

    @property
    def tokens_per_s_median(self) -> float:
        return statistics.median(r[3] for r in self.train_rows) if self.train_rows else 0.0

    @property
    def last_train_loss(self) -> float:
        return self.train_rows[-1][1] if self.train_rows else float("nan")

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

    def _mfu_metrics(self, step: int, tokens_per_s_per_device: float) -> dict:
        if self.flops_per_token <= 0 or self.peak is None:
            return {}
        utilisation = mfu(tokens_per_s_per_device, self.flops_per_token, self.peak.flops)
        tflops = tokens_per_s_per_device * self.flops_per_token / 1e12
        self.mfu_rows.append((step, utilisation, tflops))
        return {"train/mfu": utilisation, "train/tflops_per_device": tflops}

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.flops_per_token > 0 and self.peak is None:
            self._resolve_peak(trainer, pl_module)
        self._t_last = time.perf_counter()
        self._step_last = self._start_step = trainer.global_step  # > 0 when resumed
        self._paused = 0.0
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
        for key in ("ce", "aux", "z_loss"):
            self._sums[key] += float(outputs[key])
        if math.isfinite(outputs["grad_norm"]):
            self._sums["grad_norm"] += outputs["grad_norm"]
            self._finite_norms += 1
        self._dropped += int(outputs["dropped_slots"])
        self._tokens += int(outputs["tokens"])
        self._skipped += not outputs["applied"]
        self._spikes += bool(outputs["spike"])
        self._sources = [a + b for a, b in zip(self._sources, outputs["source_counts"], strict=True)]
        self._phase = int(outputs["phase"])
        self._batches += 1
        counts = outputs["expert_counts_LE"]
        self._counts_LE = counts.clone() if self._counts_LE is None else self._counts_LE + counts
        step = trainer.global_step
        if step > self.last_emitted_step and (step % self.log_every == 0 or step >= self.max_steps):
            self._emit(trainer, pl_module, step)
        if self.bar is not None:
            self.bar.advance_to(step)

    def _emit(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int) -> None:
        reduce = trainer.strategy.reduce

        def total(x: float) -> float:
            return float(reduce(torch.tensor(float(x)), reduce_op="sum"))

        def mean(x: float) -> float:
            return float(reduce(torch.tensor(float(x)), reduce_op="mean"))

        now = time.perf_counter()
        elapsed = now - self._t_last - self._paused
        self.train_seconds += elapsed
        tokens = total(self._tokens)
        self.tokens_seen += int(tokens)
        skipped, spikes = int(total(self._skipped) / trainer.world_size), int(total(self._spikes))
        self.skipped_steps += skipped
        self.spikes += spikes // trainer.world_size
        tokens_per_s = tokens / max(elapsed, 1e-9)
        loss = mean(self._sums["ce"] / self._batches)
        counts_LE = reduce(self._counts_LE.float(), reduce_op="sum")
        frac_LE = counts_LE / counts_LE.sum(dim=1, keepdim=True)
        groups = trainer.optimizers[0].param_groups
        lr = groups[0]["lr"]  # the LR this step used (the scheduler steps after)
        metrics = {
            "train/loss": loss,
            "train/aux_loss": mean(self._sums["aux"] / self._batches),
            "train/z_loss": mean(self._sums["z_loss"] / self._batches),
            "train/grad_norm": self._sums["grad_norm"] / max(self._finite_norms, 1),
            "train/lr": lr,
            "train/tokens_per_s": tokens_per_s,
            "train/tokens_per_step": tokens / self._batches,
            "train/tokens_seen": float(self.tokens_seen),
            "train/skipped_steps": float(self.skipped_steps),
            "train/spikes": float(self.spikes),
            "data/phase": float(self._phase),
        }
        for group in groups:
            metrics[f"train/lr/{group.get('name', 'group')}"] = group["lr"]
        sources = [total(c) for c in self._sources]
        for name, count in zip(self.source_names, sources, strict=True):
            metrics[f"data/frac/{name}"] = count / max(sum(sources), 1.0)
        slots = float(counts_LE[0].sum())  # (token, slot) pairs routed per layer in this interval
        metrics["train/dropped_frac"] = total(self._dropped) / max(slots * counts_LE.shape[0], 1.0)
        num_experts = frac_LE.shape[1] - int(self.skip_expert)
        for layer, frac_E in enumerate(frac_LE.tolist()):
            for expert, frac in enumerate(frac_E):
                name = "skip" if expert == num_experts else f"e{expert}"
                metrics[f"load/l{layer}/{name}"] = frac
                self.load_rows.append((step, layer, expert, frac))
            experts_E = frac_E[:num_experts]
            metrics[f"load/l{layer}/max_over_mean"] = (
                max(experts_E) * num_experts / max(sum(experts_E), 1e-12)
            )
        metrics.update(self._bias_metrics(pl_module, step, num_experts))
        metrics.update(self._mfu_metrics(step, tokens_per_s / trainer.world_size))  # tok/s: all ranks
        progress_mfu = f"  MFU {100 * metrics['train/mfu']:.1f}%" if "train/mfu" in metrics else ""
        if trainer.logger is not None:
            trainer.logger.log_metrics(metrics, step=step)
        self.train_rows.append((step, loss, lr, tokens_per_s))
        self.last_emitted_step = step
        eta = (self.max_steps - step) * self.train_seconds / max(step - self._start_step, 1)
        worst = max(metrics[f"load/l{i}/max_over_mean"] for i in range(frac_LE.shape[0]))
        info = log.info if trainer.is_global_zero else log.debug  # one progress line per step, not per rank
        info(
            "step %d/%d  loss %.4f  aux %.4f  lr %.2e  %.0f tok/s%s  max load/mean %.2f  skipped %d  ETA %s",
            *(step, self.max_steps, loss, metrics["train/aux_loss"], lr, tokens_per_s, progress_mfu, worst),
            *(self.skipped_steps, format_duration(eta)),
        )
        if self.bar is not None:
            self.bar.advance_to(step, loss=f"{loss:.4f}", tok_s=f"{tokens_per_s:,.0f}")
        # The next interval starts after this bookkeeping: tokens/s measures the training loop itself.
        self._t_last, self._step_last, self._paused = time.perf_counter(), step, 0.0
        self._reset_interval()

    def _bias_metrics(self, pl_module: L.LightningModule, step: int, num_experts: int) -> dict:
        """Rows and ``bias/l<i>/<e<j>|skip>`` metrics of the balancing biases (identical on every rank)."""
        biases_LE = router_biases_LE(pl_module.model)
        if biases_LE is None:
            return {}
        metrics = {}
        for layer, bias_E in enumerate(biases_LE.tolist()):
            for expert, bias in enumerate(bias_E):
                metrics[f"bias/l{layer}/{'skip' if expert == num_experts else f'e{expert}'}"] = bias
                self.bias_rows.append((step, layer, expert, bias))
        return metrics

    def on_validation_start(self, trainer, pl_module) -> None:
        self._val_t0 = time.perf_counter()
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
        if hasattr(self, "_paused"):
            self._paused += time.perf_counter() - self._val_t0
