"""A copy of a reproduced repository writes only into its own MLflow store: train, evaluate and register in
the copy leave the original's mlflow.db and mlartifacts/ byte for byte as they were."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from pathlib import Path
from urllib.parse import urlparse

import pytest
from mlflow import MlflowClient

from zaya_pipeline.config import load_config
from zaya_pipeline.eval.evaluate import evaluate
from zaya_pipeline.registry.register import register
from zaya_pipeline.tracking import (
    DEFAULT_STORE_REF,
    read_run_info,
    run_reference,
    tracking_uri,
    using_tracking_uri,
)
from zaya_pipeline.train.run import train

CONF = Path(__file__).resolve().parents[2] / "conf"
TINY = (
    "train=debug", "model=debug", "train.max_steps=2", "train.val_every=2", "train.log_every=1",
    "train.micro_batch=2", "train.seq_len=16", "train.val_batches=1", "train.schedule.warmup_steps=1",
    "eval.tasks=[]", "eval.max_batches=2", "registry.model_name=zaya-copy",
)  # fmt: skip


def reproduce(*overrides: str) -> dict:
    """train → evaluate → register in the working directory, on the default (embedded) store."""
    cfg = load_config([*TINY, *overrides], conf_dir=CONF)
    with using_tracking_uri(tracking_uri(cfg.registry)):  # put back the URI train sets: a stage is a process
        train(cfg)
    evaluate(cfg)
    return register(cfg)


def fingerprint(root: Path) -> dict[str, str]:
    """sha256 of mlflow.db and of every file under mlartifacts/."""
    files = [root / "mlflow.db", *(p for p in (root / "mlartifacts").rglob("*") if p.is_file())]
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


@pytest.fixture
def repo(workspace, tmp_path, monkeypatch) -> Path:
    """A repository holding the workspace's tokenizer and token shards (its val split doubles as train)."""
    for var in ("MLFLOW_TRACKING_URI", "DVC_ROOT", "MLFLOW_REGISTRY_URI"):
        monkeypatch.delenv(var, raising=False)
    root = tmp_path / "original"
    shutil.copytree(workspace["root"] / "tokenizer", root / "artifacts" / "tokenizer")
    shutil.copytree(workspace["root"] / "tokens", root / "data" / "tokens")
    shutil.copytree(root / "data" / "tokens" / "val", root / "data" / "tokens" / "train")
    meta = json.loads((root / "data" / "tokens" / "meta.json").read_text())
    meta["unigram_val_nats_per_token"] = math.log(meta["vocab_size"])  # the tokenize stage's baseline
    (root / "data" / "tokens" / "meta.json").write_text(json.dumps(meta))
    monkeypatch.chdir(root)
    return root


def test_a_copied_repository_writes_only_into_its_own_store(repo, tmp_path, monkeypatch):
    first = reproduce()
    run_json = json.loads((repo / "artifacts" / "train" / "run.json").read_text())
    assert run_json["tracking_uri"] == DEFAULT_STORE_REF  # relative to the repository
    copy = tmp_path / "copy"
    shutil.copytree(repo, copy)
    before = fingerprint(repo)

    monkeypatch.chdir(copy)
    second = reproduce("train.seed=7")  # other weights: a new run, metrics, logged model and version
    assert fingerprint(repo) == before, "the copy wrote into the original's store"

    client = MlflowClient(f"sqlite:///{copy}/mlflow.db")
    assert tracking_uri(load_config(list(TINY), conf_dir=CONF).registry) == f"sqlite:///{copy}/mlflow.db"
    assert read_run_info(copy / "artifacts" / "train")["tracking_uri"] == f"sqlite:///{copy}/mlflow.db"
    run = client.get_run(second["run_id"])
    assert run.info.run_id != first["run_id"] and "eval/val_loss" in run.data.metrics
    assert Path(urlparse(run.info.artifact_uri).path).is_relative_to(copy / "mlartifacts")
    assert [a.path for a in client.list_artifacts(second["run_id"])] == ["eval", "plots"]
    experiment = client.get_experiment(run.info.experiment_id)
    assert Path(urlparse(experiment.artifact_location).path) == copy / "mlartifacts"
    versions = sorted(int(v.version) for v in client.search_model_versions("name='zaya-copy'"))
    assert versions == [1, 2] and second["model_uri"] == "models:/zaya-copy/2"
    source = client.get_model_version("zaya-copy", "2").source
    logged = client.get_logged_model(source.removeprefix("models:/"))
    assert (Path(urlparse(logged.artifact_location).path) / "MLmodel").is_file()
    assert Path(urlparse(logged.artifact_location).path).is_relative_to(copy / "mlartifacts")
    # The copied runs moved with the store: the original's first run is read from the copy's folder.
    old = client.get_run(first["run_id"])
    assert Path(urlparse(old.info.artifact_uri).path).is_relative_to(copy / "mlartifacts")
    assert "plots" in [a.path for a in client.list_artifacts(first["run_id"])]


def test_a_queued_dvc_experiment_still_lands_in_the_repositorys_store(repo, tmp_path, monkeypatch):
    """``dvc exp run --queue`` runs a stage in a temporary copy with $DVC_ROOT at the repository."""
    client = MlflowClient(f"sqlite:///{repo}/mlflow.db")
    client.create_experiment("zaya", artifact_location=(repo / "mlartifacts").as_uri())
    temp = tmp_path / "queued"
    (temp / "artifacts" / "train").mkdir(parents=True)
    (temp / "artifacts" / "train" / "run.json").write_text(
        json.dumps({"run_id": "r", "tracking_uri": DEFAULT_STORE_REF})
    )
    monkeypatch.chdir(temp)
    monkeypatch.setenv("DVC_ROOT", str(repo))
    before = fingerprint(repo)
    assert run_reference(f"sqlite:///{repo}/mlflow.db") == DEFAULT_STORE_REF  # what train writes in run.json
    assert read_run_info(temp / "artifacts" / "train")["tracking_uri"] == f"sqlite:///{repo}/mlflow.db"
    assert tracking_uri(load_config(list(TINY), conf_dir=CONF).registry) == f"sqlite:///{repo}/mlflow.db"
    assert fingerprint(repo) == before  # the repository's own store is left as it is
    assert not (temp / "mlflow.db").exists()


@pytest.mark.parametrize("where", ["sub", ".."], ids=["into-a-subfolder", "up-a-folder"])
def test_a_moved_store_is_adopted_once_wherever_it_moved(tmp_path, monkeypatch, where):
    """Moved into a subfolder of its old place or up out of it: every location follows, once."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DVC_ROOT", raising=False)
    old = tmp_path / "a" / "b"
    old.mkdir(parents=True)
    client = MlflowClient(f"sqlite:///{old}/mlflow.db")
    exp = client.create_experiment("zaya", artifact_location=(old / "mlartifacts").as_uri())
    run_id = client.create_run(exp).info.run_id
    new = (old / where).resolve()
    new.mkdir(exist_ok=True)
    shutil.move(old / "mlflow.db", new / "mlflow.db")
    monkeypatch.chdir(new)
    for _ in range(2):  # the second call finds nothing left to rewrite
        assert tracking_uri(load_config(list(TINY), conf_dir=CONF).registry) == f"sqlite:///{new}/mlflow.db"
    client = MlflowClient(f"sqlite:///{new}/mlflow.db")
    assert client.get_experiment(exp).artifact_location == (new / "mlartifacts").as_uri()
    assert client.get_run(run_id).info.artifact_uri == f"{(new / 'mlartifacts').as_uri()}/{run_id}/artifacts"
