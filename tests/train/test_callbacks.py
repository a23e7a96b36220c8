"""Each telemetry callback writes the files it names in ``outputs`` (and only those) and logs its figures to
the run; the rows here are synthetic, as if a run had logged steps 10, 20 and 25."""

from __future__ import annotations

import csv
from pathlib import Path

from zaya_pipeline.train.callbacks import Telemetry
from zaya_pipeline.train.plots import TRAIN_PLOTS

STEPS = [10, 20, 25]


class Artifacts:
    """A stand-in for Lightning's MLFlowLogger: records what is logged as an artifact."""

    run_id = "run"

    def __init__(self):
        self.experiment = self
        self.logged: list[tuple[str, str]] = []

    def log_artifact(self, run_id: str, path: str, folder: str) -> None:
        self.logged.append((Path(path).name, folder))


def filled_telemetry() -> Telemetry:
    telemetry = Telemetry.create(10, 25, skip_expert=True, unigram_nats=4.5)
    telemetry.meter.rows = [(s, 1000.0 + s) for s in STEPS]
    telemetry.meter.mfu_rows = [(s, 0.05, 1.0) for s in STEPS]
    telemetry.loss.rows = [(s, 5.0 - s / 10, 1e-3) for s in STEPS]
    telemetry.loss.val_rows = [(20, 3.5), (25, 3.2)]
    telemetry.load.load_rows = [(s, layer, e, 1 / 3) for s in STEPS for layer in range(2) for e in range(3)]
    return telemetry  # no router bias rows: a router without a balancing bias


def test_each_callback_writes_exactly_its_outputs_and_logs_its_figures(tmp_path):
    telemetry = filled_telemetry()
    plots = tmp_path / "plots"
    for callback in telemetry:
        logger = Artifacts()
        before = set(plots.iterdir()) if plots.exists() else set()
        written = callback.write_outputs(tmp_path, logger)
        new = {p.name for p in set(plots.iterdir()) - before} if plots.exists() else set()
        name = type(callback).__name__
        assert sorted(p.name for p in written) == sorted(new) == sorted(callback.outputs), name
        assert logger.logged == [(p.name, "plots") for p in written if p.suffix == ".png"], name
    pngs = {p.stem for p in plots.glob("*.png")}
    assert pngs == set(TRAIN_PLOTS)
    assert sorted(p.name for p in plots.iterdir()) == sorted(telemetry.outputs)


def test_train_csv_takes_tokens_per_s_from_the_meter_and_router_bias_csv_is_a_header(tmp_path):
    telemetry = filled_telemetry()
    telemetry.loss.write_outputs(tmp_path, Artifacts())
    telemetry.bias.write_outputs(tmp_path, Artifacts())
    with open(tmp_path / "plots" / "train.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["step", "loss", "lr", "tokens_per_s"]
    assert [(int(r[0]), float(r[3])) for r in rows[1:]] == [(s, 1000.0 + s) for s in STEPS]
    assert (tmp_path / "plots" / "router_bias.csv").read_text().strip() == "step,layer,expert,bias"
