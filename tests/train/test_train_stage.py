"""The train stage end to end on tiny synthetic shards, with a real (temporary) MLflow SQLite store."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from zaya_pipeline.config import load_config
from zaya_pipeline.errors import ConfigError, DataError
from zaya_pipeline.model import load_model
from zaya_pipeline.train.run import train

CONF = Path(__file__).resolve().parents[2] / "conf"


def debug_config(root: Path, tokens: Path, *overrides: str):
    return load_config(
        [
            "train=debug",
            "model=debug",
            f"paths.tokens={tokens}",
            f"paths.train={root}/train",
            f"paths.reports={root}/reports",
            f"registry.tracking_uri=sqlite:///{root}/mlflow.db",
            *overrides,
        ],
        conf_dir=CONF,
    )


def logged_losses(root: Path, tokens: Path, *overrides: str) -> list[float]:
    """Train the debug model with ``overrides`` and return the train losses it logged (plots/train.csv)."""
    train(debug_config(root, tokens, *overrides))
    with open(root / "reports" / "plots" / "train.csv") as f:
        return [float(row["loss"]) for row in csv.DictReader(f)]


def log_steps(cfg) -> list[int]:
    return list(range(cfg.train.log_every, cfg.train.max_steps + 1, cfg.train.log_every))


def val_steps(cfg) -> list[int]:
    return list(range(cfg.train.val_every, cfg.train.max_steps + 1, cfg.train.val_every))


def read_csv(path: Path) -> list[dict]:
    with open(path) as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def trained(tmp_path_factory, token_dir):
    root = tmp_path_factory.mktemp("run")
    cfg = debug_config(root, token_dir, "registry.run_name=unit-test")
    return root, cfg, train(cfg)


def test_writes_a_loadable_model_and_run_json(trained):
    root, cfg, summary = trained
    model, model_cfg = load_model(root / "train" / "model.pt")
    assert model_cfg.vocab_size == 96  # taken from meta.json (model.vocab_size=0)
    assert model_cfg.d_model == cfg.model.d_model
    assert model(torch.zeros(1, 8, dtype=torch.long)).logits.shape == (1, 8, 96)
    run = json.loads((root / "train" / "run.json").read_text())
    assert set(run) == {"run_id", "experiment_id", "tracking_uri"} and run["run_id"] == summary["run_id"]
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # no half-built temp folder left


def test_loss_falls_far_below_the_unigram_baseline(trained):
    root, cfg, _ = trained
    metrics = json.loads((root / "reports" / "train.json").read_text())
    assert metrics["steps"] == cfg.train.max_steps
    assert metrics["tokens_seen"] == cfg.train.max_steps * cfg.train.micro_batch * cfg.train.seq_len
    assert metrics["val_loss"] < 0.75 * metrics["unigram_val_nats_per_token"]
    assert metrics["val_over_unigram"] == pytest.approx(
        metrics["val_loss"] / metrics["unigram_val_nats_per_token"]
    )
    assert metrics["tokens_per_s"] > 0 and metrics["wall_s"] > metrics["train_s"] > 0
    assert metrics["params_active"] < metrics["params_total"]
    rows = read_csv(root / "reports" / "plots" / "train.csv")
    assert [int(r["step"]) for r in rows] == log_steps(cfg)
    assert float(rows[-1]["loss"]) < 0.6 * float(rows[0]["loss"])


def test_plots_files(trained):
    root, cfg, _ = trained
    plots = root / "reports" / "plots"
    val = read_csv(plots / "val.csv")
    assert [int(r["step"]) for r in val] == val_steps(cfg)
    load = read_csv(plots / "expert_load.csv")
    L, E = cfg.model.n_layers, cfg.model.moe.num_experts + cfg.model.moe.skip_expert  # the skip expert too
    assert len(load) == len(log_steps(cfg)) * L * E
    for step in (cfg.train.log_every, cfg.train.max_steps):
        for layer in range(L):
            fracs = [
                float(r["fraction"]) for r in load if int(r["step"]) == step and int(r["layer"]) == layer
            ]
            assert len(fracs) == E and sum(fracs) == pytest.approx(1.0)


def test_logs_a_real_mlflow_run(trained):
    from mlflow import MlflowClient

    root, cfg, summary = trained
    client = MlflowClient(f"sqlite:///{root}/mlflow.db")
    run = client.get_run(summary["run_id"])
    assert run.info.run_name == "unit-test"
    assert client.get_experiment(run.info.experiment_id).name == cfg.registry.experiment_name
    assert run.data.params["train.max_steps"] == str(cfg.train.max_steps)
    assert run.data.params["model.vocab_size"] == "96"
    losses = client.get_metric_history(run.info.run_id, "train/loss")
    assert [m.step for m in losses] == log_steps(cfg)
    assert losses[-1].value < losses[0].value
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val/loss")] == val_steps(cfg)
    for key in ("train/lr", "train/tokens_per_s", "train/aux_loss", "load/l1/e3", "load/l0/max_over_mean"):
        assert key in run.data.metrics
    assert run.data.metrics["final/val_loss"] == pytest.approx(summary["val_loss"], abs=1e-4)


def test_same_seed_same_run(tmp_path, token_dir):
    short = ("train.max_steps=4", "train.val_every=2", "train.log_every=2", "train.schedule.warmup_steps=2")
    a = train(debug_config(tmp_path / "a", token_dir, *short))
    b = train(debug_config(tmp_path / "b", token_dir, *short))
    assert a["val_loss"] == b["val_loss"]
    rows = [read_csv(tmp_path / x / "reports" / "plots" / "train.csv") for x in "ab"]
    assert [r["loss"] for r in rows[0]] == [r["loss"] for r in rows[1]]


def test_vocab_mismatch_is_a_config_error_that_leaves_earlier_outputs_alone(tmp_path, token_dir):
    earlier = tmp_path / "reports" / "train.json"
    earlier.parent.mkdir(parents=True)
    earlier.write_text("{}")
    with pytest.raises(ConfigError, match="model.vocab_size"):
        train(debug_config(tmp_path, token_dir, "model.vocab_size=100"))
    assert earlier.read_text() == "{}"  # the plan refused the run before any output was removed


def test_bad_lengths_and_missing_tokens(tmp_path, token_dir):
    with pytest.raises(ConfigError, match="train.seq_len"):
        train(debug_config(tmp_path, token_dir, "train.seq_len=256"))
    with pytest.raises(DataError, match="tokenize"):
        train(debug_config(tmp_path, tmp_path / "nowhere"))


def test_zaya1_router_biases_move_once_per_optimizer_step_and_are_saved(tmp_path, token_dir, monkeypatch):
    from zaya_pipeline.model import ZayaLM

    calls = []
    update = ZayaLM.update_router_biases
    monkeypatch.setattr(ZayaLM, "update_router_biases", lambda self, *a: (calls.append(1), update(self, *a)))
    steps = 6
    cfg = debug_config(
        tmp_path,
        token_dir,
        f"train.max_steps={steps}",
        "train.val_every=3",
        "train.log_every=3",
        "train.schedule.warmup_steps=2",
        "model.moe.router.type=zaya1",
        "model.moe.router.dim=16",
        "model.moe.router.aux_loss_coef=0.0",
        "model.moe.router.bias_i_gain=0.01",
    )
    train(cfg)
    model, _ = load_model(tmp_path / "train" / "model.pt")
    router = model.blocks[0].moe.router
    assert len(calls) == steps
    assert router.expert_bias_E.abs().sum() > 0 and router.load_error_integral_E.abs().sum() > 0


@pytest.mark.parametrize(
    "bad, message",
    [
        ("train.max_steps=-5", "train.max_steps must be >= 1"),
        ("model.moe.top_k=99", "model.moe.top_k must be in"),  # a model check: the model is never built
        ("train.resume=/nowhere/step0000010", "train.resume"),
        ("train.optim.lr=0", "train.optim.lr must be > 0"),  # an optimizer check: it is never built
        ("train.precision=fp99", "train.precision: unknown value 'fp99'"),  # checked at load (config.py)
    ],
)
def test_a_refused_config_leaves_the_previous_outputs_untouched(trained, token_dir, bad, message):
    from mlflow import MlflowClient

    root, cfg, _ = trained
    kept = [root / "train" / "model.pt", root / "train" / "run.json", root / "reports" / "train.json"]
    kept += sorted((root / "reports" / "plots").iterdir())
    before = {path: path.read_bytes() for path in kept}
    client = MlflowClient(f"sqlite:///{root}/mlflow.db")
    experiment = client.get_experiment_by_name(cfg.registry.experiment_name).experiment_id
    runs = len(client.search_runs([experiment]))
    with pytest.raises(ConfigError, match=message):
        train(debug_config(root, token_dir, "registry.run_name=unit-test", bad))
    assert {path: path.read_bytes() for path in kept} == before
    assert sorted(p.name for p in (root / "train").iterdir()) == ["model.pt", "run.json", "schedule.png"]
    assert len(client.search_runs([experiment])) == runs  # refused before MLflow: no run started
