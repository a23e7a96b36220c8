"""Where MLflow data lives: one embedded SQLite store inside the repo unless the user points elsewhere."""

from __future__ import annotations

import os
from pathlib import Path

from zaya_pipeline.config import RegistryConfig

DEFAULT_DB = "mlflow.db"  # under the working directory (the repo root under DVC); ignored by git
DEFAULT_ARTIFACTS = "mlartifacts"


def tracking_uri(cfg: RegistryConfig) -> str:
    """``registry.tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///<cwd>/mlflow.db``."""
    if cfg.tracking_uri:
        return cfg.tracking_uri
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    return f"sqlite:///{Path.cwd().resolve() / DEFAULT_DB}"


def setup_mlflow(cfg: RegistryConfig) -> str:
    """Point MLflow at the store and make sure the experiment exists; returns the experiment id.

    A new experiment on the embedded store keeps its artifacts in ``./mlartifacts`` beside ``mlflow.db``.
    """
    import mlflow

    uri = tracking_uri(cfg)
    mlflow.set_tracking_uri(uri)
    exp = mlflow.get_experiment_by_name(cfg.experiment_name)
    if exp is not None:
        mlflow.set_experiment(experiment_id=exp.experiment_id)
        return exp.experiment_id
    location = None
    if uri.startswith("sqlite:///"):
        location = (Path(uri.removeprefix("sqlite:///")).parent / DEFAULT_ARTIFACTS).resolve().as_uri()
    exp_id = mlflow.create_experiment(cfg.experiment_name, artifact_location=location)
    mlflow.set_experiment(experiment_id=exp_id)
    return exp_id
