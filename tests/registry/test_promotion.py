"""Registry gating: idempotent registration, candidate/champion aliases decided by a metric, lineage tags,
and no half-registered version when the store fails after the version was created."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from zaya_pipeline.config import RegistryConfig
from zaya_pipeline.errors import ConfigError
from zaya_pipeline.model.saved_model import load_model, save_model
from zaya_pipeline.registry import register as register_module
from zaya_pipeline.registry.lineage import decide_promotion, metric_value
from zaya_pipeline.registry.register import register
from zaya_pipeline.tracking import TrackingError
from zaya_pipeline.utils import file_sha256


def test_promotion_rule_both_ways_and_with_a_margin():
    lower = RegistryConfig(promote_metric="bits_per_byte", promote_mode="min", promote_margin=0.01)
    assert decide_promotion(lower, 1.50, None)[0]
    assert decide_promotion(lower, 1.48, ("3", 1.50))[0]
    promoted, reason = decide_promotion(lower, 1.495, ("3", 1.50))  # better, but not by the margin
    assert not promoted and "does not beat" in reason and "v3" in reason
    higher = RegistryConfig(promote_metric="tasks.arc_easy.acc", promote_mode="max")
    assert (
        decide_promotion(higher, 0.31, ("1", 0.30))[0] and not decide_promotion(higher, 0.30, ("1", 0.30))[0]
    )
    with pytest.raises(ConfigError, match="promote_mode"):
        decide_promotion(RegistryConfig(promote_mode="best"), 1.0, None)
    assert metric_value({"tasks": {"arc_easy": {"acc": 0.3}}}, "tasks.arc_easy.acc") == 0.3
    with pytest.raises(ConfigError, match="registry.promote_metric='nope' is not in metrics.json"):
        metric_value({"bits_per_byte": 1.0}, "nope")


@pytest.fixture
def copy_of(workspace, tmp_path):
    """The workspace's model and metrics in a folder of our own, registered under a fresh model name."""

    def make(name: str, bits_per_byte: float, perturb: float = 0.0):
        root = tmp_path / f"{name}-{bits_per_byte}-{perturb}"
        shutil.copytree(workspace["root"] / "train", root / "train")
        (root / "reports").mkdir(parents=True)
        if perturb:
            model, mcfg = load_model(root / "train" / "model.pt")
            with torch.no_grad():
                model.embed.weight.add_(perturb)
            save_model(root / "train" / "model.pt", model, mcfg)
        metrics = json.loads((workspace["root"] / "reports" / "metrics.json").read_text())
        scored = {"bits_per_byte": bits_per_byte, "model_sha256": file_sha256(root / "train" / "model.pt")}
        (root / "reports" / "metrics.json").write_text(json.dumps(metrics | scored))
        cfg = copy.deepcopy(workspace["cfg"])
        cfg.paths.train, cfg.paths.reports = str(root / "train"), str(root / "reports")
        cfg.registry.model_name = name
        return cfg

    return make


def _versions(uri: str, name: str) -> list[str]:
    return sorted(str(v.version) for v in MlflowClient(uri).search_model_versions(f"name='{name}'"))


def test_candidate_and_champion_follow_the_metric_and_reregistering_is_idempotent(workspace, copy_of):
    uri, name = workspace["uri"], "zaya-promo"
    client = MlflowClient(uri)
    first = copy_of(name, 2.0)
    assert register(first)["promoted"]
    again = register(first)  # the same weights: no new version
    assert again["reused"] and _versions(uri, name) == ["1"]
    assert client.get_model_version_by_alias(name, "champion").version == 1

    worse = register(copy_of(name, 2.5, perturb=0.01))
    assert not worse["promoted"] and worse["champion"] == "1"
    assert client.get_model_version_by_alias(name, "candidate").version == 2
    assert client.get_model_version_by_alias(name, "champion").version == 1
    decision = client.get_model_version(name, "2").tags["promotion"]
    assert decision.startswith("kept as candidate") and "v1" in decision

    better = register(copy_of(name, 1.5, perturb=0.02))
    assert better["promoted"] and client.get_model_version_by_alias(name, "champion").version == 3
    assert client.get_model_version(name, "3").tags["promotion"].startswith("promoted to champion")
    assert _versions(uri, name) == ["1", "2", "3"]

    # The champion loads from the registry in a fresh process and generates.
    zaya = Path(sys.executable).parent / "zaya"
    cmd = [str(zaya), "generate", "--model", f"models:/{name}@champion", "--tracking-uri", uri]
    prompts = ["--max-new-tokens", "4", "the café", "document 3:"]
    out = subprocess.run([*cmd, *prompts], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip(), out.stderr[-2000:]
    bad = subprocess.run([*cmd[:3], "models:/nope@champion", *cmd[4:], "x"], capture_output=True, text=True)
    assert bad.returncode == 2 and "cannot load models:/nope@champion" in bad.stderr


def test_lineage_tags_and_the_model_card_artifact(workspace, copy_of):
    cfg = copy_of("zaya-lineage", 1.9)
    splits = {"train": {"tokens": 1234, "docs": 5}, "val": {"tokens": 56, "docs": 1}}
    (Path(cfg.paths.reports) / "tokenize.json").write_text(json.dumps({"splits": splits}))
    register(cfg)
    result = json.loads((Path(cfg.paths.reports) / "registry.json").read_text())
    version = MlflowClient(workspace["uri"]).get_model_version("zaya-lineage", result["version"])
    assert version.tags["weights_sha256"] == file_sha256(Path(cfg.paths.train) / "model.pt")
    assert len(version.tags["config_sha256"]) == 64 and version.tags["promote.bits_per_byte"] == "1.9"
    assert version.tags["eval.bits_per_byte"] == "1.9" and "git_commit" in version.tags
    assert "# " in version.description and "parameters:" in version.description
    assert "* training: " in version.description and "adamw optimizer" in version.description
    assert "Limits:" in version.description and "1,234 training / 56 validation tokens" in version.description
    assert version.tags["data.train_tokens"] == "1234" and version.tags["data.val_tokens"] == "56"


def test_a_store_failure_after_the_version_exists_leaves_no_version(workspace, copy_of, monkeypatch):
    def broken(*args, **kwargs):
        raise MlflowException("database is locked")

    monkeypatch.setattr(register_module, "complete_registration", broken)
    cfg = copy_of("zaya-broken", 1.8)
    with pytest.raises(TrackingError, match="database is locked"):
        register(cfg)
    assert _versions(workspace["uri"], "zaya-broken") == []
    assert not (Path(cfg.paths.reports) / "registry.json").exists()


def test_a_read_only_store_is_a_clear_error_and_registers_nothing(workspace, copy_of, tmp_path, monkeypatch):
    # A SQLite URI opened read-only (we run as root, so file permissions would not stop writes).
    # MLflow makes the parent folder of the URI's path relative to the working directory ("file:/tmp/..."):
    # work in tmp_path so that stray folder is not left in the checkout.
    monkeypatch.chdir(tmp_path)
    db = tmp_path / "ro.db"
    shutil.copy(Path(workspace["uri"].removeprefix("sqlite:///")), db)
    cfg = copy_of("zaya-readonly", 1.7)
    ro_uri = f"sqlite:///file:{db}?mode=ro&uri=true"
    run = json.loads((Path(cfg.paths.train) / "run.json").read_text())
    (Path(cfg.paths.train) / "run.json").write_text(json.dumps({**run, "tracking_uri": ro_uri}))
    cfg.registry.tracking_uri = ro_uri
    with pytest.raises(TrackingError, match="readonly database"):
        register(cfg)
    assert _versions(f"sqlite:///{db}", "zaya-readonly") == []
    assert not (Path(cfg.paths.reports) / "registry.json").exists()
