"""``zaya register``: log the trained model to its MLflow run as a pyfunc and register a version of it.

The logged model holds model.pt, tokenizer.json, the tokenizer's meta.json, the resolved config
(config.yaml), the eval metrics (metrics.json) and a copy of the ``zaya_pipeline`` package (so a version keeps
loading after the code moves on), with pinned pip requirements (no slow requirement inference). The
version is tagged with the git commit and the eval metrics and described by a model card.

Writes ``<reports>/registry.json``: {model_name, version, model_uri ("models:/<name>/<version>"), run_id,
tracking_uri, registry_uri, logged_model_uri}.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from dataclasses import asdict
from importlib.metadata import version as dist_version
from pathlib import Path

from zaya_pipeline.config import ZayaConfig
from zaya_pipeline.errors import ConfigError, DataError
from zaya_pipeline.registry.tracking import (
    TrackingError,
    get_run,
    read_run_info,
    tracking_uri,
    using_tracking_uri,
)
from zaya_pipeline.utils import get_logger, read_json, remove_outputs, write_json

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

    path.write_text(OmegaConf.to_yaml(OmegaConf.create(asdict(cfg))), encoding="utf-8")
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

    from zaya_pipeline.model.checkpoint import model_config_from_dict

    try:  # mmap: the weights are not read, only the config next to them
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        return model_config_from_dict(ckpt["model_config"], str(path))
    except (KeyError, TypeError, RuntimeError, EOFError) as exc:
        raise DataError(f"{path} is not a zaya model checkpoint: {exc}") from None


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
    model_cfg = _model_config(inputs["model"])
    commit, dirty = git_commit()

    with tempfile.TemporaryDirectory(prefix="zaya-register-") as tmp:
        artifacts = {name: str(path) for name, path in inputs.items()}
        artifacts["config"] = str(_write_config(cfg, Path(tmp) / "config.yaml"))
        info, registry_uri = _log_model(cfg, run_id, uri, artifacts)
    name, version = cfg.registry.model_name, str(info.registered_model_version)
    client = MlflowClient(tracking_uri=uri, registry_uri=registry_uri)

    tags = {f"eval.{k}": str(metrics[k]) for k in METRIC_TAGS if k in metrics}
    if commit:
        tags |= {"git_commit": commit, "git_dirty": str(dirty).lower()}
    for key, value in tags.items():
        client.set_model_version_tag(name, version, key, value)
    client.update_model_version(name, version, description=model_card(model_cfg, metrics, run_id, commit))

    result = {
        "model_name": name,
        "version": version,
        "model_uri": f"models:/{name}/{version}",
        "run_id": run_id,
        "tracking_uri": uri,
        "registry_uri": registry_uri,
        "logged_model_uri": info.model_uri,
    }
    write_json(out, result)
    seconds = round(time.perf_counter() - start, 2)
    log.info("registered %s (run %s) in %.1fs", result["model_uri"], run_id, seconds)
    return {"model_uri": result["model_uri"], "run_id": run_id, "seconds": seconds}
