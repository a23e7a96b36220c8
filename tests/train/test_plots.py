"""The train stage's figures and plots files: the figure functions on synthetic rows, and one short run with
the ZAYA1 router whose PNGs land in reports/plots and in the run's MLflow artifacts (a real SQLite store)."""

from __future__ import annotations

import csv
import struct
from pathlib import Path

import pytest
from test_train_stage import debug_config, log_steps

from zaya_pipeline.train.plots import (
    TRAIN_PLOTS,
    expert_load_figure,
    loss_figure,
    router_bias_figure,
    throughput_figure,
    write_train_plots,
)
from zaya_pipeline.train.run import train

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) of a PNG, after checking its signature and header chunk."""
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_MAGIC and head[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def rows_for(steps, layers, experts, value):
    return [
        (s, layer, e, value(s, layer, e)) for s in steps for layer in range(layers) for e in range(experts)
    ]


STEPS = [10, 20, 30, 35]  # the last interval is short, as when max_steps is not a multiple of log_every
TRAIN = [(s, 5.0 - s / 20, 1e-3 * s / 35, 1000.0 + s) for s in STEPS]
VAL = [(20, 4.1), (35, 3.4)]


def labels(fig) -> dict:
    """Titles, axis labels and colorbar labels of every axes of a figure."""
    out = {"title": [], "xlabel": [], "ylabel": [], "colorbar": []}
    for ax in fig.axes:
        kind = "colorbar" if ax.get_label() == "<colorbar>" else None
        if kind:
            out["colorbar"].append(ax.get_ylabel())
            continue
        out["title"].append(ax.get_title())
        out["xlabel"].append(ax.get_xlabel())
        out["ylabel"].append(ax.get_ylabel())
    return out


def test_loss_and_throughput_figures_have_titles_units_and_all_series():
    fig = loss_figure(TRAIN, VAL, unigram_nats=4.5)
    (ax,) = fig.axes
    assert ax.get_title() == "Loss" and "nats / token" in ax.get_ylabel() and "step" in ax.get_xlabel()
    assert [line.get_label() for line in ax.get_lines()][:2] == ["train", "validation"]
    assert [list(line.get_xdata()) for line in ax.get_lines()[:2]] == [STEPS, [20, 35]]
    assert any("unigram" in t.get_text() for t in ax.get_legend().get_texts())

    fig = throughput_figure(TRAIN, [(s, 0.05, 1.0) for s in STEPS])
    tps, mfu = fig.axes
    assert "tokens / s" in tps.get_ylabel() and "MFU (%" in mfu.get_ylabel()
    assert list(mfu.get_lines()[0].get_ydata()) == pytest.approx([5.0] * 4)  # percent


def test_expert_load_heatmaps_have_a_colorbar_and_one_panel_per_shown_layer():
    # 6 layers, 4 experts + skip; expert 0 takes half the slots of every layer, the rest share the other half
    load = rows_for(STEPS, 6, 5, lambda s, layer, e: 0.5 if e == 0 else 0.125)
    fig = expert_load_figure(load, skip_expert=True)
    text = labels(fig)
    assert len(text["colorbar"]) == 2 and "max / mean" in text["colorbar"][0]
    assert "share of routed slots" in text["colorbar"][1]
    # the balance panel plus at most four layer panels (first, last and evenly between), one x axis label
    assert len(text["title"]) == 1 + 4 and text["xlabel"][-1] == "optimizer step"
    assert [y.splitlines()[0] for y in text["ylabel"][1:]] == ["layer 0", "layer 2", "layer 3", "layer 5"]
    balance = fig.axes[0].collections[0].get_array()
    # max/mean over the 4 experts (the skip expert left out): 0.5 / (0.875 / 4)
    assert balance.shape == (6, 4) and float(balance.min()) == pytest.approx(0.5 * 4 / 0.875)
    assert [t.get_text() for t in fig.axes[1].get_yticklabels()] == ["e0", "e1", "e2", "e3", "skip"]


def test_router_bias_figure_draws_one_trajectory_per_expert_and_the_skip_bias_apart():
    # 2 layers, 2 experts + skip; the skip bias starts near -1, the experts' near 0
    bias = rows_for(STEPS, 2, 3, lambda s, layer, e: -1.0 + s / 100 if e == 2 else 0.01 * s * (e - 0.5))
    fig = router_bias_figure(bias, skip_expert=True)
    layer0, layer1, skip = fig.axes
    assert skip.get_xlabel() == "optimizer step" and "skip expert" in skip.get_ylabel()
    assert "layer 1" in layer1.get_ylabel() and "bias" in layer1.get_ylabel()
    expert_lines = [line for line in layer0.get_lines() if len(line.get_xdata()) == len(STEPS)]
    ys = [y for line in expert_lines for y in line.get_ydata()]
    assert ys == pytest.approx([-0.05, -0.1, -0.15, -0.175, 0.05, 0.1, 0.15, 0.175])
    skip_lines = [line for line in skip.get_lines() if line.get_label().startswith("layer")]
    assert [line.get_label() for line in skip_lines] == ["layer 0", "layer 1"]
    assert list(skip_lines[1].get_ydata()) == pytest.approx([-0.9, -0.8, -0.7, -0.65])
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["e0", "e1"]


def test_write_train_plots_writes_valid_pngs_and_a_note_for_a_router_without_bias(tmp_path):
    load = rows_for(STEPS, 2, 4, lambda s, layer, e: 0.25)
    paths = write_train_plots(tmp_path, train_rows=TRAIN, val_rows=VAL, load_rows=load)  # no bias rows
    assert [p.name for p in paths] == [f"{name}.png" for name in TRAIN_PLOTS]
    for path in paths:
        width, height = png_size(path)
        assert width >= 600 and height >= 200 and path.stat().st_size > 5_000
    assert (tmp_path / "router_bias.png").stat().st_size < (tmp_path / "loss.png").stat().st_size  # a note


# ---------------------------------------------------------------------------------------------- a real run


@pytest.fixture(scope="module")
def zaya1_run(tmp_path_factory, token_dir):
    root = tmp_path_factory.mktemp("plots")
    cfg = debug_config(
        root,
        token_dir,
        "train.max_steps=8",
        "train.log_every=3",  # logged at 3, 6 and the last step, 8
        "train.val_every=4",
        "train.schedule.warmup_steps=2",
        "model.moe.router.type=zaya1",
        "model.moe.router.dim=16",
        "model.moe.skip_expert=true",
    )
    return root, cfg, train(cfg)


def read_csv(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


def test_router_bias_csv_has_one_row_per_logged_step_layer_and_choice(zaya1_run):
    root, cfg, _ = zaya1_run
    rows = read_csv(root / "reports" / "plots" / "router_bias.csv")
    L, E = cfg.model.n_layers, cfg.model.moe.num_experts + 1  # the skip expert is the last choice
    steps = [3, 6, 8]
    assert steps == [*log_steps(cfg), cfg.train.max_steps]
    keys = [(int(r["step"]), int(r["layer"]), int(r["expert"])) for r in rows]
    assert keys == [(s, layer, e) for s in steps for layer in range(L) for e in range(E)]
    bias = {k: float(r["bias"]) for k, r in zip(keys, rows, strict=True)}
    for layer in range(L):
        first = [bias[(3, layer, e)] for e in range(E)]
        last = [bias[(8, layer, e)] for e in range(E)]
        assert first != last, f"layer {layer}: the bias controller did not move the biases"
        # the skip expert starts at skip_bias_init and moves by p_gain-sized steps
        assert abs(first[-1] - cfg.model.moe.skip_bias_init) < 0.1


def test_figures_are_written_and_logged_to_the_run(zaya1_run):
    from mlflow import MlflowClient

    root, _, summary = zaya1_run
    plots = root / "reports" / "plots"
    for name in TRAIN_PLOTS:
        width, height = png_size(plots / f"{name}.png")
        assert width >= 600 and height >= 300 and (plots / f"{name}.png").stat().st_size > 10_000, name
    client = MlflowClient(f"sqlite:///{root}/mlflow.db")
    logged = {a.path: a.file_size for a in client.list_artifacts(summary["run_id"], "plots")}
    expected = {f"plots/{name}.png" for name in (*TRAIN_PLOTS, "schedule")}
    assert set(logged) == expected and all(size > 10_000 for size in logged.values())
    metrics = client.get_run(summary["run_id"]).data.metrics
    assert "bias/l0/e0" in metrics and "bias/l1/skip" in metrics
