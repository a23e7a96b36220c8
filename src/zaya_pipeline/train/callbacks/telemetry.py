"""The telemetry callbacks of one training run, built together and kept in the order Lightning calls them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from zaya_pipeline.train.callbacks.base import TelemetryCallback
from zaya_pipeline.train.callbacks.data_mixture import DataMixture
from zaya_pipeline.train.callbacks.expert_load import ExpertLoad
from zaya_pipeline.train.callbacks.loss_curve import LossCurve
from zaya_pipeline.train.callbacks.progress_report import ProgressReport
from zaya_pipeline.train.callbacks.router_bias import RouterBias
from zaya_pipeline.train.callbacks.throughput_meter import ThroughputMeter


@dataclass(frozen=True)
class Telemetry:
    """Iterating gives the callbacks in their hook order: the meter first, the progress report last (it
    reads what the others emitted at the step, then restarts the meter's clock)."""

    meter: ThroughputMeter
    loss: LossCurve
    mixture: DataMixture
    load: ExpertLoad
    bias: RouterBias
    progress: ProgressReport

    @classmethod
    def create(
        cls,
        log_every: int,
        max_steps: int,
        *,
        skip_expert: bool = False,
        source_names: tuple[str, ...] = ("main",),
        flops_per_token: int = 0,
        precision: str = "32-true",
        param_dtype: str = "float32",
        unigram_nats: float | None = None,
    ) -> Telemetry:
        """Metrics every ``log_every`` optimizer steps and at ``max_steps``; the rest: see each callback."""
        steps = (log_every, max_steps)
        meter = ThroughputMeter(*steps, flops_per_token, precision, param_dtype)
        loss = LossCurve(*steps, meter, unigram_nats)
        load = ExpertLoad(*steps, skip_expert)
        return cls(
            meter,
            loss,
            DataMixture(*steps, source_names),
            load,
            RouterBias(*steps, skip_expert),
            ProgressReport(*steps, meter, loss, load),
        )

    def __iter__(self) -> Iterator[TelemetryCallback]:
        return iter((self.meter, self.loss, self.mixture, self.load, self.bias, self.progress))

    @property
    def outputs(self) -> list[str]:
        """Every file the callbacks write under ``<reports>/plots``."""
        return [name for callback in self for name in callback.outputs]
