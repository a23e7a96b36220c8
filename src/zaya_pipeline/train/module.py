"""The LightningModule: next-token cross-entropy plus the routers' auxiliary losses, optimized by hand.

Manual optimization, because one optimizer step may hold a variable number of micro-batches (the batch
ramp) and an update may be skipped (NaN/Inf or a loss spike, see :mod:`zaya_pipeline.train.stability`).
Each step: forward/backward per micro-batch of ``train.micro_batch`` sequences (losses weighted by their
share of the batch), global grad norm (clipped to ``train.optim.grad_clip``), the guard's decision (on the
device), then optimizer (its update dropped on the device if skipped), scheduler and router-bias updates. A
step is a batch: ``global_step`` and ``train.max_steps`` count skipped steps too. A checkpoint also holds the
data position and the guard.
"""

from __future__ import annotations

import contextlib
import math

import lightning as L
import torch
import torch.nn.functional as F

from zaya_pipeline.config import ModelConfig, ParallelConfig, TrainConfig
from zaya_pipeline.model.transformer import LMOutput, ZayaLM, compile_blocks
from zaya_pipeline.train.callbacks.base import is_logging_step
from zaya_pipeline.train.optim import build_optimizer, build_scheduler, full_batch, step_unless
from zaya_pipeline.train.precision import BF16_MASTER, Bf16Weights
from zaya_pipeline.train.stability import SpikeGuard
from zaya_pipeline.utils import get_logger

log = get_logger("train")


def boundary_kwargs(batch: dict, rows: slice = slice(None)) -> dict:
    """The model's ``position_ids_BT`` / ``doc_ids_BT`` for ``rows`` of a batch that carries them
    (``train.data.doc_boundaries``); none for a plain packed batch."""
    names = {"position_ids": "position_ids_BT", "doc_ids": "doc_ids_BT"}
    return {arg: batch[key][rows] for key, arg in names.items() if key in batch}


def lm_loss(logits_BTV: torch.Tensor, labels_BT: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in nats, computed in fp32 whatever the training precision."""
    return F.cross_entropy(logits_BTV.flatten(0, 1).float(), labels_BT.flatten())


class ZayaLitModule(L.LightningModule):
    def __init__(
        self,
        model_cfg: ModelConfig,
        train_cfg: TrainConfig,
        world_size: int = 1,
        parallel_cfg: ParallelConfig | None = None,
        compile_blocks: bool = False,
        init_state: dict | None = None,
    ):
        super().__init__()
        self.parallel_cfg = parallel_cfg  # set with parallel.strategy=fsdp2: configure_model parallelizes
        self.compile_blocks = compile_blocks  # one process (parallel.compile): each block as one graph
        self.automatic_optimization = False
        self.model_cfg = model_cfg
        self.train_cfg = train_cfg
        self.world_size = world_size
        self.model = ZayaLM(model_cfg)
        if init_state is not None:  # train.init_from: continued pretraining
            self.model.load_state_dict(init_state)
        self.guard = SpikeGuard(train_cfg.stability)
        # bf16-master: the forward/backward run on bf16 copies of the fp32 weights (train/precision.py)
        self.bf16_weights = Bf16Weights(self.model) if train_cfg.precision == BF16_MASTER else None
        self.batches_consumed = 0  # the data position: the next training batch to draw
        self.parallelized = False
        self.compiled = False

    def configure_model(self) -> None:
        """Under ``distributed.strategy.ZayaParallelStrategy``: EP, checkpointing, compile, FSDP2."""
        mesh = getattr(self, "_device_mesh", None)
        if self.parallel_cfg is None or mesh is None:
            if self.compile_blocks and not self.compiled:  # one process: compile, nothing to shard
                compile_blocks(self.model, fullgraph=True)
                self.compiled = True
            return
        if self.parallelized:
            return
        from zaya_pipeline.distributed.parallelize import parallelize_zaya

        parallelize_zaya(self.model, mesh, self.parallel_cfg)
        self.parallelized = True

    def full_state_dict(self) -> dict | None:
        """The single-device state dict of a parallelized model (a collective: call it on every rank);
        None when the model was not parallelized (``model.state_dict()`` is already full)."""
        if not self.parallelized:
            return None
        from zaya_pipeline.distributed.state import full_state_dict

        return full_state_dict(self.model, self._device_mesh["ep"].get_group())

    def forward(self, input_ids_BT: torch.Tensor) -> LMOutput:
        return self.model(input_ids_BT)

    def training_step(self, batch: dict, batch_idx: int) -> dict:
        opt, sched = self.optimizers(), self.lr_schedulers()
        B, labels_BT = batch["input_ids"].shape[0], batch["labels"]
        with self.bf16_weights or contextlib.nullcontext():  # bf16-master: bf16 copies, fp32 grads after
            ce, aux, z, dropped, counts_LE = self._forward_backward(batch)
        max_norm = self.train_cfg.optim.grad_clip or math.inf
        if self.parallelized:  # experts and the rest are DTensors on different meshes
            from zaya_pipeline.distributed.grad_norm import clip_grad_norm_

            grad_norm = clip_grad_norm_(self.model.parameters(), max_norm, self.parallel_cfg.dp_replicate)
        else:
            grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        # Every rank must take the same decision: decide on the all-rank mean loss and max grad norm. The
        # guard decides on the device and the optimizer drops a skipped update there: the step never waits
        # for the device (profiling.HostSyncs; tests/train/test_host_syncs.py).
        reduce = self.trainer.strategy.reduce
        mean_ce = reduce(ce.clone(), reduce_op="mean")
        norm = reduce(grad_norm.detach().float(), reduce_op="max")
        apply, spike = self.guard.decide(mean_ce, norm)
        step_unless(opt, ~apply)
        sched.step()  # the schedule follows the steps (batches), applied or not
        # once per optimizer step, after the weights moved, on the loads of all data-parallel ranks
        self.model.update_router_biases(lambda t: reduce(t, reduce_op="sum"), apply)
        opt.zero_grad(set_to_none=True)
        self.batches_consumed = int(batch["batch_index"]) + 1
        # Everything here feeds the telemetry callbacks (train/callbacks/); the tensors stay on the device.
        return {
            "ce": ce,
            "aux": aux,
            "z_loss": z,
            "expert_counts_LE": counts_LE,
            "dropped_slots": dropped,
            "tokens": labels_BT.numel(),
            "grad_norm": norm,
            "applied": apply,
            "spike": spike,
            "phase": batch.get("phase", 0),
            "source_counts": batch.get("source_counts", [B]),
        }

    def on_fit_start(self) -> None:
        self.guard.to(self.device)  # the guard decides where the step runs

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        """Stop a run whose updates keep being skipped: checked where the telemetry reads the device anyway
        (every ``train.log_every`` steps and the last)."""
        if is_logging_step(self.trainer.global_step, self.train_cfg.log_every, self.train_cfg.max_steps):
            self.guard.check()

    def _forward_backward(self, batch: dict):
        """Forward and backward of every micro-batch of ``batch``: (ce, aux, z-loss, dropped slots, expert
        counts), each summed over the micro-batches (losses weighted by their share of the batch)."""
        ids_BT, labels_BT = batch["input_ids"], batch["labels"]
        B, mb = ids_BT.shape[0], self.train_cfg.micro_batch
        ce = aux = z = dropped = torch.zeros((), device=ids_BT.device)
        counts_LE = None
        for start in range(0, B, mb):
            if self.parallelized:  # FSDP2: reduce-scatter the gradients once, after the last micro-batch
                self.model.set_requires_gradient_sync(start + mb >= B)
            rows = slice(start, start + mb)
            out = self.model(ids_BT[rows], **boundary_kwargs(batch, rows))
            chunk_ce = lm_loss(out.logits, labels_BT[start : start + mb])
            share = min(mb, B - start) / B
            self.manual_backward((chunk_ce + out.aux_loss) * share)
            ce, aux = ce + chunk_ce.detach() * share, aux + out.aux_loss.detach() * share
            z, dropped = z + out.z_loss * share, dropped + out.dropped_slots.detach()
            counts_LE = out.expert_counts_LE if counts_LE is None else counts_LE + out.expert_counts_LE
        return ce, aux, z, dropped, counts_LE

    def validation_step(self, batch: dict, batch_idx: int) -> dict:
        with self.bf16_weights or contextlib.nullcontext():
            ce = lm_loss(self.model(batch["input_ids"], **boundary_kwargs(batch)).logits, batch["labels"])
        return {"ce": ce, "tokens": batch["labels"].numel()}

    def configure_optimizers(self) -> dict:
        optimizer = build_optimizer(self.model, self.train_cfg.optim)
        scheduler = build_scheduler(optimizer, self.train_cfg, self.world_size)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["zaya"] = {
            "batches_consumed": self.batches_consumed,
            "guard": self.guard.guard_state(),
            "global_batch": full_batch(self.train_cfg, self.world_size),
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        state = checkpoint.get("zaya", {})
        self.batches_consumed = state.get("batches_consumed", 0)
        if "guard" in state:
            self.guard.load_guard_state(state["guard"])
        saved, now = state.get("global_batch"), full_batch(self.train_cfg, self.world_size)
        if saved is not None and saved != now and self.trainer.is_global_zero:
            log.warning(
                "resuming a run of %d sequences per step with %d (train.global_batch): the data order and "
                "the LR schedule differ from the uninterrupted run from here on",
                *(saved, now),
            )
