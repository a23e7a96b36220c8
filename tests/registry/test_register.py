"""``zaya register`` against a real SQLite MLflow store; the registered version loads in a fresh process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import mlflow
import pytest
import torch
from mlflow import MlflowClient

from zaya_pipeline.errors import DataError
from zaya_pipeline.registry.pyfunc import ZayaGenerator
from zaya_pipeline.registry.register import git_commit, pip_requirements, register
from zaya_pipeline.tracking import TrackingError

LOAD_AND_GENERATE = """
import json, sys
import mlflow, pandas as pd
model = mlflow.pyfunc.load_model(sys.argv[1])
import zaya_pipeline
out = {
    "list": model.predict(["the café", "document 3:"], params={"max_new_tokens": 6}),
    "frame": model.predict(pd.DataFrame({"prompt": ["the café"]}), params={"max_new_tokens": 6}),
    "package": zaya_pipeline.__file__,
}
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def registered(workspace) -> dict:
    env_before, uri_before = os.environ.get("MLFLOW_TRACKING_URI"), mlflow.get_tracking_uri()
    start = time.perf_counter()
    summary = register(workspace["cfg"])
    seconds = time.perf_counter() - start
    assert os.environ.get("MLFLOW_TRACKING_URI") == env_before, "register leaked its tracking URI"
    assert mlflow.get_tracking_uri() == uri_before and mlflow.active_run() is None
    info = json.loads((workspace["root"] / "reports" / "registry.json").read_text())
    return {**workspace, "summary": summary, "info": info, "seconds": seconds}


def test_register_creates_a_tagged_model_version(registered):
    info, uri = registered["info"], registered["uri"]
    assert info["model_name"] == "zaya-test" and info["run_id"] == registered["run_id"]
    assert info["model_uri"] == f"models:/zaya-test/{info['version']}"
    assert info["tracking_uri"] == uri and registered["summary"]["model_uri"] == info["model_uri"]
    client = MlflowClient(uri)
    version = client.get_model_version("zaya-test", info["version"])
    assert version.run_id == registered["run_id"]
    metrics = json.loads((registered["root"] / "reports" / "metrics.json").read_text())
    assert version.tags["eval.val_loss"] == str(metrics["val_loss"])
    assert version.tags["eval.bits_per_byte"] == str(metrics["bits_per_byte"])
    commit, _ = git_commit()
    assert version.tags.get("git_commit") == commit  # the tests run inside the project's git checkout
    assert "parameters:" in version.description and registered["run_id"] in version.description
    assert registered["seconds"] < 30


def test_logged_model_holds_the_artifacts_and_pinned_requirements(registered):
    client = MlflowClient(registered["uri"])
    logged = client.get_logged_model(registered["info"]["logged_model_uri"].removeprefix("models:/"))
    assert logged.source_run_id == registered["run_id"]
    local = Path(urlparse(logged.artifact_location).path)
    names = {p.name for p in (local / "artifacts").iterdir()}
    assert {"model.pt", "tokenizer.json", "meta.json", "config.yaml", "metrics.json"} <= names
    assert {"model.safetensors", "model_config.json", "MODEL_CARD.md"} <= names
    # The safetensors copy holds the same weights and loads without pickle.
    from zaya_pipeline.model.saved_model import load_model, load_safetensors

    st_model, st_cfg = load_safetensors(
        local / "artifacts" / "model.safetensors", local / "artifacts" / "model_config.json"
    )
    pt_model, pt_cfg = load_model(registered["root"] / "train" / "model.pt")
    assert st_cfg == pt_cfg
    for key, value in pt_model.state_dict().items():
        assert torch.equal(st_model.state_dict()[key], value), key
    config = (local / "artifacts" / "config.yaml").read_text()
    assert "moe:" in config and "model_name: zaya-test" in config  # the resolved config, every group
    assert (local / "code" / "zaya_pipeline" / "model" / "transformer.py").is_file()
    reqs = (local / "requirements.txt").read_text().split()
    assert set(pip_requirements()) <= set(reqs)
    assert all("==" in r for r in reqs if not r.startswith("-"))
    assert any(r.startswith("torch==") and "+" not in r for r in reqs)


def test_registered_version_generates_in_a_fresh_process(registered):
    env = {**os.environ, "MLFLOW_TRACKING_URI": registered["uri"]}
    proc = subprocess.run(
        [sys.executable, "-c", LOAD_AND_GENERATE, registered["info"]["model_uri"]],
        env=env, capture_output=True, text=True, timeout=120, cwd=registered["root"],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.split("RESULT ", 1)[1])
    assert len(out["list"]) == 2 and len(out["frame"]) == 1
    assert all(isinstance(s, str) for s in out["list"])
    assert out["frame"][0] == out["list"][0], "greedy decoding must not depend on the input form"
    # The version carries its own copy of the package: it loads that, not the checkout it was made from.
    assert "/src/zaya_pipeline/" not in out["package"] and "code/zaya_pipeline" in out["package"]

    # ... and it generates what the same model and tokenizer generate here.
    root = registered["root"]
    here = ZayaGenerator()
    artifacts = {"model": root / "train" / "model.pt", "tokenizer": root / "tokenizer" / "tokenizer.json"}
    artifacts["tokenizer_meta"] = root / "tokenizer" / "meta.json"
    here.load_context(type("Ctx", (), {"artifacts": {k: str(v) for k, v in artifacts.items()}})())
    assert here.predict(None, ["the café", "document 3:"], {"max_new_tokens": 6}) == out["list"]


def test_an_unreachable_tracking_server_fails_fast_naming_it(workspace, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    cfg = _with_run_json(workspace, tmp_path, "http://127.0.0.1:9")
    start = time.perf_counter()
    with pytest.raises(TrackingError, match=r"http://127\.0\.0\.1:9"):
        register(cfg)
    assert time.perf_counter() - start < 10


def test_a_server_that_never_answers_times_out_with_a_clear_error(workspace, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")
    with socket.socket() as server:  # accepts connections, never replies
        server.bind(("127.0.0.1", 0))
        server.listen()
        threading.Thread(target=lambda: server.accept(), daemon=True).start()
        uri = f"http://127.0.0.1:{server.getsockname()[1]}"
        with pytest.raises(TrackingError, match="cannot open the MLflow tracking store " + uri):
            register(_with_run_json(workspace, tmp_path, uri))


def test_a_missing_sqlite_store_or_metrics_file_is_a_clear_error(workspace, tmp_path):
    uri = f"sqlite:///{tmp_path}/nowhere/mlflow.db"
    with pytest.raises(TrackingError, match="does not exist"):
        register(_with_run_json(workspace, tmp_path, uri))
    cfg = _with_run_json(workspace, tmp_path, workspace["uri"])
    cfg.paths.reports = str(tmp_path / "no-reports")
    with pytest.raises(DataError, match="zaya evaluate"):
        register(cfg)


def _with_run_json(workspace: dict, tmp_path: Path, uri: str):
    """The workspace's config, but with a run.json naming ``uri`` (the rest of the inputs stay)."""
    import copy
    import shutil

    cfg = copy.deepcopy(workspace["cfg"])
    train = tmp_path / "train"
    train.mkdir(exist_ok=True)
    shutil.copy(workspace["root"] / "train" / "model.pt", train / "model.pt")
    (train / "run.json").write_text(json.dumps({"run_id": workspace["run_id"], "tracking_uri": uri}))
    cfg.paths.train = str(train)
    cfg.paths.reports = str(tmp_path / "reports")
    (tmp_path / "reports").mkdir(exist_ok=True)
    shutil.copy(workspace["root"] / "reports" / "metrics.json", tmp_path / "reports" / "metrics.json")
    return cfg
