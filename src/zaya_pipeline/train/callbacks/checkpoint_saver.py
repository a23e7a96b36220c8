"""Saving training checkpoints (``distributed/checkpoint.py``): every ``train.checkpoint_every`` optimizer
steps, and on SIGTERM (preemption).

SIGTERM: the handler only sets a flag (and, on the launching process, forwards the signal to the processes
Lightning started). After every training batch all ranks agree on the flag with one all-reduce, so they
save the same step together and stop; ``zaya train`` then exits with :class:`~zaya_pipeline.errors.Preempted`
(code 143) and ``train.resume=auto`` continues from that checkpoint. This replaces Lightning's own SIGTERM
handler, which broadcasts from inside the signal handler, at a point that differs between ranks.
"""

from __future__ import annotations

import signal
from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist

from zaya_pipeline.distributed.checkpoint import checkpoint_name, list_checkpoints
from zaya_pipeline.utils import get_logger

log = get_logger("train")


class CheckpointSaver(L.Callback):
    """Saves ``<directory>/step<N>/`` every ``every`` optimizer steps (0 = only on SIGTERM) and on SIGTERM,
    keeping the newest ``keep``; ``preempted_at`` is the step saved on SIGTERM (None otherwise)."""

    def __init__(self, directory: str | Path, every: int, keep: int = 0):
        self.directory = Path(directory)
        self.every = every
        self.keep = keep  # the newest `keep` checkpoints survive a save; 0 = all
        self.last_saved = -1
        self.preempted_at: int | None = None  # the step saved on SIGTERM
        self._sigterm = False
        self._previous_handler = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._trainer = trainer
        self.last_saved = trainer.global_step  # a resumed run does not re-save its starting point
        self._previous_handler = signal.signal(signal.SIGTERM, self._on_sigterm)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._previous_handler is not None:
            signal.signal(signal.SIGTERM, self._previous_handler)
            self._previous_handler = None

    def _on_sigterm(self, signum, frame) -> None:
        if not self._sigterm:
            launcher = self._trainer.strategy.launcher
            if launcher is not None and getattr(launcher, "procs", None):
                launcher.kill(signum)  # the other local ranks, when Lightning started them
        self._sigterm = True

    def _any_rank_terminated(self, trainer: L.Trainer) -> bool:
        if trainer.world_size == 1 or not dist.is_initialized():
            return self._sigterm  # one process: the flag itself, no device round trip
        flag = torch.tensor(float(self._sigterm), device=trainer.strategy.root_device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)  # every rank must stop at the same step
        return bool(flag.item())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        terminated = self._any_rank_terminated(trainer)
        step = trainer.global_step
        due = self.every > 0 and step % self.every == 0 and step > self.last_saved
        if due or (terminated and step > self.last_saved):
            self.save(trainer, step)
        if terminated:
            self.preempted_at = step
            trainer.should_stop = True

    def save(self, trainer: L.Trainer, step: int) -> None:
        path = self.directory / checkpoint_name(step)
        trainer.save_checkpoint(path)
        self.last_saved = step
        if trainer.is_global_zero:
            log.info("step %d: saved checkpoint %s", step, path)
            if self.keep > 0:
                for old in list_checkpoints(self.directory)[: -self.keep]:
                    trainer.strategy.remove_checkpoint(old)
