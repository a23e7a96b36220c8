"""Hydra sweeps through the real CLI: MLflow parent/child runs, the summary table, a failed job, Optuna, and
the sweep as the MLflow UI shows it in headless Chromium."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.mlflow_ui import (
    browser_missing,
    chromium,
    expand_run,
    mlflow_server,
    open_runs,
    wait_for_run,
)
from train.token_shards import write_shards

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
ZAYA = str(Path(sys.executable).parent / "zaya")
EXPERIMENT = "zaya_pipeline_debug"  # registry=debug's experiment_name


def sweep(tmp: Path, name: str, *overrides: str, ok: bool = True) -> str:
    """``zaya train -m ...`` on tiny token shards, in its own MLflow store; returns the log."""
    cmd = [ZAYA, "train", "-m", *overrides]
    cmd += [f"paths.tokens={tmp / 'tokens'}", f"registry.tracking_uri=sqlite:///{tmp / 'mlflow.db'}"]
    cmd += [f"paths.checkpoints={tmp / 'ckpt'}", f"hydra.sweep.dir={tmp / name}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_TRACKING", "ZAYA_SWEEP"))}
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    log = out.stdout + out.stderr
    assert (out.returncode == 0) == ok, f"{' '.join(cmd)} -> {out.returncode}\n{log[-5000:]}"
    return log


def runs_of(tmp: Path):
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp / 'mlflow.db'}")
    exp = client.get_experiment_by_name(EXPERIMENT)
    return client, exp, client.search_runs([exp.experiment_id], max_results=1000)


def parent_and_children(runs, sweep_dir: Path):
    parents = [r for r in runs if r.data.tags.get("zaya.sweep_dir") == str(sweep_dir.resolve())]
    assert len(parents) == 1, [r.data.tags for r in runs]
    parent = parents[0]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    return parent, children


@pytest.fixture(scope="module")
def grid(tmp_path_factory) -> tuple[Path, str]:
    """A 2 x 2 sweep (experts x learning rate) of 20-step debug runs."""
    tmp = tmp_path_factory.mktemp("sweep")
    write_shards(tmp / "tokens")
    log = sweep(
        tmp, "grid", "experiment=debug", "train.max_steps=20", "train.val_every=10",
        "model.moe.num_experts=2,4", "train.optim.lr=1e-3,1e-2",
    )  # fmt: skip
    return tmp, log


def test_a_sweep_is_a_parent_run_with_one_child_run_per_job(grid):
    tmp, _ = grid
    client, _, runs = runs_of(tmp)
    parent, children = parent_and_children(runs, tmp / "grid")
    assert parent.info.status == "FINISHED" and parent.data.tags["zaya.sweep"] == "parent"
    assert "model.moe.num_experts=2,4" in parent.data.params["sweep.overrides"]
    assert len(children) == 4 and all(c.info.status == "FINISHED" for c in children)
    combos = {(c.data.params["model.moe.num_experts"], c.data.params["train.optim.lr"]) for c in children}
    assert combos == {("2", "0.001"), ("2", "0.01"), ("4", "0.001"), ("4", "0.01")}
    names = sorted(c.info.run_name for c in children)  # the job number and the swept values only
    assert names[0] == "#0 model.moe.num_experts=2 train.optim.lr=0.001", names
    # the parent carries the best child's metrics and points at it
    best = min(children, key=lambda c: c.data.metrics["final/val_loss"])
    assert parent.data.tags["zaya.best_run_id"] == best.info.run_id
    assert parent.data.metrics["best_val_loss"] == pytest.approx(
        best.data.metrics["final/val_loss"], rel=1e-6
    )
    assert parent.data.metrics["jobs_completed"] == 4 and parent.data.metrics["jobs_failed"] == 0
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"summary.md", "summary.csv"} <= artifacts


def test_the_summary_table_is_printed_and_written(grid):
    tmp, log = grid
    table = (tmp / "grid" / "summary.md").read_text()
    assert table.strip() in log
    lines = table.strip().splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header[:4] == ["job", "model.moe.num_experts", "train.optim.lr", "status"]
    assert "experiment" not in header  # only the swept keys are columns
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert len(rows) == 4 and sum("(best)" in r[3] for r in rows) == 1
    val = [float(r[header.index("val_loss")]) for r in rows]
    assert all(v > 0 for v in val)


def test_a_failed_job_is_reported_and_the_others_still_run(tmp_path):
    write_shards(tmp_path / "tokens")
    log = sweep(
        tmp_path, "bad", "experiment=debug", "train.max_steps=5", "train.val_every=5", "model.moe.top_k=9,1",
        ok=False,
    )  # fmt: skip
    assert "model.moe.top_k must be in [1, model.moe.num_experts], got 9" in log
    _, _, runs = runs_of(tmp_path)
    parent, children = parent_and_children(runs, tmp_path / "bad")
    assert parent.info.status == "FAILED" and parent.data.metrics["jobs_failed"] == 1
    assert [c.data.params["model.moe.top_k"] for c in children] == ["1"]
    table = (tmp_path / "bad" / "summary.md").read_text()
    assert "FAILED: model.moe.top_k must be" in table and "COMPLETED (best)" in table


def test_optuna_sweep_minimises_val_loss(tmp_path):
    write_shards(tmp_path / "tokens")
    log = sweep(
        tmp_path, "optuna", "experiment=[debug,optuna_lr]", "hydra.sweeper.n_trials=2", "train.max_steps=10",
        "train.val_every=10",
    )  # fmt: skip
    assert "Best value:" in log
    _, _, runs = runs_of(tmp_path)
    parent, children = parent_and_children(runs, tmp_path / "optuna")
    assert len(children) == 2
    assert "OptunaSweeper" in parent.data.params["sweep.sweeper"]
    best = float(log.split("Best value:")[1].split()[0])
    assert best == pytest.approx(min(c.data.metrics["final/val_loss"] for c in children), abs=1e-3)


def test_the_mlflow_ui_lists_the_sweep_and_unfolds_its_runs(grid):
    """Headless Chromium on a locally started MLflow UI: the sweep's parent run is listed, and expanding it
    shows the four child runs by name."""
    why = browser_missing()
    if why:
        if os.environ.get("ZAYA_REQUIRE_BROWSER") == "1":  # CI installs the browser: a skip would hide a bug
            pytest.fail(why)
        pytest.skip(why)
    tmp, _ = grid
    _, exp, runs = runs_of(tmp)
    parent, children = parent_and_children(runs, tmp / "grid")
    with mlflow_server(f"sqlite:///{tmp / 'mlflow.db'}", tmp / "mlartifacts") as url, chromium() as driver:
        link = open_runs(driver, url, exp.experiment_id, parent.info.run_name)
        page = driver.find_element("tag name", "body").text
        assert children[0].info.run_name not in page  # folded under the parent
        expand_run(driver, link)
        for child in children:
            wait_for_run(driver, child.info.run_name, timeout_s=30)
        driver.save_screenshot(str(tmp / "ui.png"))
    assert (tmp / "ui.png").stat().st_size > 10_000


def test_a_single_run_leaves_the_sweep_callback_quiet():
    out = subprocess.run([ZAYA, "model-info", "model=debug"], cwd=REPO, capture_output=True, text=True)
    assert out.returncode == 0 and "SweepCallback" not in out.stderr, out.stderr[-2000:]
