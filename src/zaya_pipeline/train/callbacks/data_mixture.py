"""The data mixture as trained: the phase of ``train.data.phases`` and each source's share of the sequences
in every logging interval (``data/phase``, ``data/frac/<source>``). It writes no files."""

from __future__ import annotations

import lightning as L

from zaya_pipeline.train.callbacks.base import TelemetryCallback, reduce_sum


class DataMixture(TelemetryCallback):
    """``source_names``: the sources in the order of the batches' ``source_counts``."""

    def __init__(self, log_every: int, max_steps: int, source_names: tuple[str, ...] = ("main",)):
        super().__init__(log_every, max_steps)
        self.source_names = source_names
        self._counts = [0] * len(source_names)  # sequences per source in the interval, this rank
        self._phase = 0

    def add(self, outputs: dict) -> None:
        self._counts = [a + b for a, b in zip(self._counts, outputs["source_counts"], strict=True)]
        self._phase = int(outputs["phase"])

    def emit(self, trainer: L.Trainer, pl_module: L.LightningModule, step: int) -> dict[str, float]:
        counts = [reduce_sum(trainer, c) for c in self._counts]
        metrics = {"data/phase": float(self._phase)}
        for name, count in zip(self.source_names, counts, strict=True):
            metrics[f"data/frac/{name}"] = count / max(sum(counts), 1.0)
        self._counts = [0] * len(self.source_names)
        return metrics
