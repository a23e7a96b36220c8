"""``zaya register``: log the trained model to its MLflow run as a pyfunc and register a version of it.

The logged model holds model.pt (and the same weights as model.safetensors + model_config.json, for other
frameworks), tokenizer.json, the tokenizer's meta.json, the resolved config (config.yaml), the eval metrics
(metrics.json), MODEL_CARD.md and a copy of the ``zaya_pipeline`` package (so a version keeps loading after
the code moves on), with pinned pip requirements (no slow requirement inference).

Idempotent: weights already registered under the model name (same sha256) create no new version. A new
version gets lineage tags and the aliases of :mod:`zaya_pipeline.registry.lineage` (``candidate``, and
``champion`` when it beats the current one); if tagging fails half-way the version is deleted again.

Writes ``<reports>/registry.json``: {model_name, version, model_uri ("models:/<name>/<version>"), run_id,
tracking_uri, registry_uri, logged_model_uri, reused, champion, promoted, decision}.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from importlib.metadata import version as dist_version
from pathlib import Path

from zaya_pipeline.config import ZayaConfig, as_dict
from zaya_pipeline.errors import ConfigError, DataError
from zaya_pipeline.model.saved_model import save_safetensors
from zaya_pipeline.registry.lineage import (
    WEIGHTS_TAG,
    apply_aliases,
    dvc_lock_hashes,
    existing_version,
    metric_value,
)
from zaya_pipeline.tracking import (
    TrackingError,
    get_run,
    read_run_info,
    tracking_uri,
    using_tracking_uri,
)
from zaya_pipeline.utils import file_sha256, get_logger, read_json, remove_outputs, write_json

log = get_logger("register")

REGISTRY_FILE = "registry.json"
ARTIFACT_NAME = "model"
# What ZayaGenerator imports at load time; pinned to this environment's versions.
REQUIREMENTS = ("torch", "tokenizers", "numpy", "pandas", "mlflow")
METRIC_TAGS = ("val_loss", "perplexity", "bits_per_byte", "tokens")
ENTRY_FILE = Path(__file__).with_name("pyfunc_entry.py")


def pip_requirements() -> list[str]:
    """``name==version`` of each requirement, without local labels (``2.13.0+cpu`` → ``2.13.0``)."""
    return [f"{name}=={dist_version(name).split('+')[0]}" for name in REQUIREMENTS]


def _git(cwd: str | Path, *args: str) -> str:
    cmd = ["git", *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10, check=True).stdout.strip()


def git_commit(cwd: str | Path = ".") -> tuple[str | None, bool]:
    """(HEAD commit, whether tracked files differ from it), or (None, False) outside a git repository."""
    try:
        commit = _git(cwd, "rev-parse", "HEAD")
        dirty = bool(_git(cwd, "status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None, False
    return commit, dirty


def _inputs(cfg: ZayaConfig) -> dict[str, Path]:
    train, tok, reports = Path(cfg.paths.train), Path(cfg.paths.tokenizer), Path(cfg.paths.reports)
    files = {
        "model": (train / "model.pt", "zaya train"),
        "tokenizer": (tok / "tokenizer.json", "zaya tokenizer"),
        "tokenizer_meta": (tok / "meta.json", "zaya tokenizer"),
        "metrics": (reports / "metrics.json", "zaya evaluate"),
    }
    for path, stage in files.values():
        if not path.is_file():
            raise DataError(f"{path} is missing: run `{stage}` first")
    return {name: path for name, (path, _) in files.items()}


def _write_config(cfg: ZayaConfig, path: Path) -> Path:
    from omegaconf import OmegaConf

    path.write_text(OmegaConf.to_yaml(OmegaConf.create(as_dict(cfg))), encoding="utf-8")
    return path


def _log_model(cfg: ZayaConfig, run_id: str, uri: str, artifacts: dict[str, str]):
    import mlflow
    import pandas as pd
    from mlflow.exceptions import MlflowException

    import zaya_pipeline
    from zaya_pipeline.registry.pyfunc import signature

    try:
        with using_tracking_uri(uri), mlflow.start_run(run_id=run_id):
            info = mlflow.pyfunc.log_model(
                name=ARTIFACT_NAME,
                python_model=str(ENTRY_FILE),  # executed at load time, never imported here
                artifacts=artifacts,
                code_paths=[str(Path(zaya_pipeline.__file__).parent)],
                signature=signature(),
                # MLflow runs this example through the saved model (load + predict) before logging it: one new
                # token proves the model loads and generates, at the least cost.
                input_example=(pd.DataFrame({"prompt": ["The database"]}), {"max_new_tokens": 1}),
                pip_requirements=pip_requirements(),
                registered_model_name=cfg.registry.model_name,
            )
            return info, mlflow.get_registry_uri()
    except MlflowException as exc:
        raise TrackingError(f"cannot log the model to run {run_id} in {uri}: {exc.message}") from None


def _model_config(path: Path):
    import torch

    from zaya_pipeline.model.saved_model import model_config_from_dict

    try:  # mmap: the weights are not read, only the config next to them
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return model_config_from_dict(ckpt["model_config"], str(path))
    except (KeyError, TypeError, RuntimeError, EOFError) as exc:
        raise DataError(f"{path} is not a zaya model checkpoint: {exc}") from None


def lineage_tags(cfg, metrics, weights, config_sha, commit, dirty, value) -> dict[str, str]:
    """Version tags: eval metrics, weights / config hashes, DVC-locked data hashes, token counts, git."""
    tags = {f"eval.{k}": str(metrics[k]) for k in METRIC_TAGS if k in metrics}
    for task, m in metrics.get("tasks", {}).items():
        tags[f"eval.{task}.acc"] = str(m["acc"])
    tags |= {
        WEIGHTS_TAG: weights,
        "config_sha256": config_sha,
        f"promote.{cfg.registry.promote_metric}": str(value),
    }
    locked = {"lineage.tokens_md5": cfg.paths.tokens, "lineage.tokenizer_md5": cfg.paths.tokenizer}
    tags |= dvc_lock_hashes(Path("dvc.lock"), locked)
    tags |= {f"data.{split}_tokens": str(n) for split, n in token_counts(cfg).items()}
    if commit:
        tags |= {"git_commit": commit, "git_dirty": str(dirty).lower()}
    return tags


def token_counts(cfg: ZayaConfig) -> dict[str, int]:
    """Tokens per split from the tokenize stage's report (``<reports>/tokenize.json``); {} without it."""
    report = Path(cfg.paths.reports) / "tokenize.json"
    splits = read_json(report).get("splits", {}) if report.is_file() else {}
    return {s: int(v["tokens"]) for s, v in splits.items() if isinstance(v, dict) and "tokens" in v}


def _card_context(cfg: ZayaConfig) -> tuple[dict, dict]:
    """(token counts per split, training summary) for the model card, from the stage reports if present."""
    training = {"optimizer": cfg.train.optim.name, "schedule": cfg.train.schedule.name}
    report = Path(cfg.paths.reports) / "train.json"
    if report.is_file():
        training |= {k: v for k, v in read_json(report).items() if k in ("steps", "tokens_seen")}
    return token_counts(cfg), training


def _call_store(uri: str, fn):
    from mlflow.exceptions import MlflowException

    try:
        return fn()
    except MlflowException as exc:
        raise TrackingError(f"the model registry at {uri} failed: {exc.message}") from None


def _result(name, version, run_id, uri, registry_uri, logged_model_uri) -> dict:
    return {
        "model_name": name,
        "version": str(version),
        "model_uri": f"models:/{name}/{version}",
        "run_id": run_id,
        "tracking_uri": uri,
        "registry_uri": registry_uri,
        "logged_model_uri": logged_model_uri,
    }


def register(cfg: ZayaConfig) -> dict:
    from mlflow import MlflowClient

    from zaya_pipeline.registry.model_card import model_card

    start = time.perf_counter()
    out = Path(cfg.paths.reports) / REGISTRY_FILE
    remove_outputs(out)
    if not cfg.registry.model_name:
        raise ConfigError("registry.model_name must not be empty")
    run_info = read_run_info(cfg.paths.train)
    run_id, uri = run_info["run_id"], run_info["tracking_uri"]
    if (configured := tracking_uri(cfg.registry)) != uri:
        log.warning("the training run lives in %s (run.json), not in %s: registering there", uri, configured)
    inputs = _inputs(cfg)
    get_run(uri, run_id)
    metrics = read_json(inputs["metrics"])
    value = metric_value(metrics, cfg.registry.promote_metric)  # a bad metric name fails before any logging
    model_cfg = _model_config(inputs["model"])
    commit, dirty = git_commit()
    name, weights = cfg.registry.model_name, file_sha256(inputs["model"])

    existing = _call_store(uri, lambda: existing_version(MlflowClient(tracking_uri=uri), name, weights))
    if existing is not None:
        log.info("these weights are already %s v%s: no new version", name, existing.version)
        result = _result(name, existing.version, run_id, uri, uri, existing.source) | {"reused": True}
        write_json(out, result)
        return {"model_uri": result["model_uri"], "run_id": run_id, "reused": True}

    with tempfile.TemporaryDirectory(prefix="zaya-register-") as tmp:
        artifacts = {key: str(path) for key, path in inputs.items()}
        config = _write_config(cfg, Path(tmp) / "config.yaml")
        artifacts["config"] = str(config)
        card = model_card(model_cfg, metrics, run_id, commit, *_card_context(cfg))
        (Path(tmp) / "MODEL_CARD.md").write_text(card, encoding="utf-8")
        artifacts["model_card"] = str(Path(tmp) / "MODEL_CARD.md")
        weights_st, config_json = save_safetensors(inputs["model"], tmp)
        artifacts |= {"safetensors": str(weights_st), "model_config": str(config_json)}
        tags = lineage_tags(cfg, metrics, weights, file_sha256(config), commit, dirty, value)
        info, registry_uri = _log_model(cfg, run_id, uri, artifacts)
    version = str(info.registered_model_version)
    client = MlflowClient(tracking_uri=uri, registry_uri=registry_uri)

    def finish() -> dict:
        for key, tag in tags.items():
            client.set_model_version_tag(name, version, key, tag)
        client.update_model_version(name, version, description=card)
        return apply_aliases(client, cfg.registry, name, version, value)

    try:
        aliases = _call_store(uri, finish)
    except Exception:
        # No half-registered version: one without its tags or aliases would look complete in the UI.
        _call_store(uri, lambda: client.delete_model_version(name, version))
        raise
    result = _result(name, version, run_id, uri, registry_uri, info.model_uri) | {"reused": False, **aliases}
    write_json(out, result)
    seconds = round(time.perf_counter() - start, 2)
    log.info("registered %s (run %s) in %.1fs", result["model_uri"], run_id, seconds)
    return {
        "model_uri": result["model_uri"],
        "run_id": run_id,
        "champion": result["champion"],
        "promoted": result["promoted"],
        "seconds": seconds,
    }
