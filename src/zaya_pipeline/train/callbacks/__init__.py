"""The train stage's Lightning callbacks. Each telemetry callback measures one thing, logs it to the
Lightning logger (MLflow) every ``train.log_every`` steps, and writes its own DVC plots files and figures at
the end (``write_outputs``, rank 0); the checkpoint saver saves and handles SIGTERM.

    module               callback: what it measures               its files under <paths.reports>/plots
    base.py              TelemetryCallback: the logging interval, ``outputs`` and ``write_outputs``
    throughput_meter.py  ThroughputMeter: tokens/s, MFU            throughput.png
    loss_curve.py        LossCurve: losses, grad norm, LR          train.csv, val.csv, loss.png, lr.png
    data_mixture.py      DataMixture: data phase, source shares    -
    expert_load.py       ExpertLoad: expert load, dropped slots    expert_load.csv, expert_load.png
    router_bias.py       RouterBias: ZAYA1 balancing biases        router_bias.csv, router_bias.png
    progress_report.py   ProgressReport: the INFO line, the bar    -
    telemetry.py         Telemetry: all of the above, in hook order
    checkpoint_saver.py  CheckpointSaver: step<N>/ checkpoints (<paths.checkpoints>), SIGTERM
"""

from zaya_pipeline.train.callbacks.base import TelemetryCallback, write_csv
from zaya_pipeline.train.callbacks.checkpoint_saver import CheckpointSaver
from zaya_pipeline.train.callbacks.data_mixture import DataMixture
from zaya_pipeline.train.callbacks.expert_load import ExpertLoad
from zaya_pipeline.train.callbacks.loss_curve import LossCurve
from zaya_pipeline.train.callbacks.progress_report import ProgressReport
from zaya_pipeline.train.callbacks.router_bias import RouterBias, router_biases_LE
from zaya_pipeline.train.callbacks.telemetry import Telemetry
from zaya_pipeline.train.callbacks.throughput_meter import ThroughputMeter

__all__ = [
    "CheckpointSaver",
    "DataMixture",
    "ExpertLoad",
    "LossCurve",
    "ProgressReport",
    "RouterBias",
    "Telemetry",
    "TelemetryCallback",
    "ThroughputMeter",
    "router_biases_LE",
    "write_csv",
]
