"""Where MLflow data lives: one embedded SQLite store inside the repo unless the user points elsewhere."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import getproxies, proxy_bypass

from zaya_pipeline.config import RegistryConfig
from zaya_pipeline.errors import DataError, ZayaError
from zaya_pipeline.utils import read_json

DEFAULT_DB = "mlflow.db"  # under the working directory (the repo root under DVC); ignored by git
DEFAULT_ARTIFACTS = "mlartifacts"


# Set by a Hydra sweep (sweep.py) for its jobs: their training runs become children of this MLflow run.
PARENT_ENV = "ZAYA_SWEEP_PARENT_RUN_ID"


def tracking_uri(cfg: RegistryConfig) -> str:
    """``registry.tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///<root>/mlflow.db``.

    ``<root>`` is ``$DVC_ROOT`` when DVC runs the stage (DVC points it at the repo the user works in, also
    for a queued ``dvc exp run``, which runs in a temporary copy), else the working directory: every
    experiment lands in the one store that ``make ui`` opens.
    """
    if cfg.tracking_uri:
        return cfg.tracking_uri
    env = os.environ.get("MLFLOW_TRACKING_URI")
    if env:
        return env
    root = Path(os.environ.get("DVC_ROOT") or Path.cwd())
    return f"sqlite:///{root.resolve() / DEFAULT_DB}"


def default_run_name(model_name: str) -> str:
    """A run's name when ``registry.run_name`` is empty: the DVC experiment's name under ``dvc exp run``, else
    the model preset and the start time (MLflow's own random names repeat: training seeds Python's RNG)."""
    return os.environ.get("DVC_EXP_NAME") or f"train {model_name} {time.strftime('%Y-%m-%d %H:%M:%S')}"


def run_tags(uri: str, experiment_id: str) -> dict[str, str]:
    """Tags for a training run from its environment: the parent run of a Hydra sweep (``sweep.py``), and the
    name and baseline commit of the DVC experiment that runs it (``dvc exp run`` sets both).

    DVC experiments of one baseline commit become children of one parent run (``dvc exp <rev>``, created by
    the first of them in experiment ``experiment_id`` of the store ``uri``), as a Hydra sweep's jobs do.
    """
    env, tags = os.environ, {}
    if env.get(PARENT_ENV):
        tags.update({"mlflow.parentRunId": env[PARENT_ENV], "zaya.sweep": "child"})
    if env.get("DVC_EXP_NAME"):
        tags["dvc.exp_name"] = env["DVC_EXP_NAME"]
    if env.get("DVC_EXP_BASELINE_REV"):
        tags["dvc.baseline_rev"] = env["DVC_EXP_BASELINE_REV"]
        if "mlflow.parentRunId" not in tags:
            parent = dvc_parent_run(uri, experiment_id, env["DVC_EXP_BASELINE_REV"])
            tags.update({"mlflow.parentRunId": parent, "zaya.sweep": "child"})
    return tags


def dvc_parent_run(uri: str, experiment_id: str, baseline_rev: str) -> str:
    """The id of the MLflow run grouping the DVC experiments of ``baseline_rev``; the first one creates it.

    Queued experiments may run in parallel (``dvc exp run --run-all -j 2``): if two create a parent at once,
    the later one deletes its own and both use the oldest.
    """
    from mlflow import MlflowClient

    client = MlflowClient(uri)
    query = f"tags.`zaya.dvc_baseline` = '{baseline_rev}'"

    def oldest():
        order = ["attributes.start_time ASC"]
        found = client.search_runs([experiment_id], query, order_by=order, max_results=1)
        return found[0].info.run_id if found else None

    if (existing := oldest()) is not None:
        return existing
    run = client.create_run(
        experiment_id,
        run_name=f"dvc exp {baseline_rev[:7]}",
        tags={"zaya.sweep": "parent", "zaya.dvc_baseline": baseline_rev, "dvc.baseline_rev": baseline_rev},
    )
    client.set_terminated(run.info.run_id)  # a group, not a job: nothing runs in it
    first = oldest()
    if first != run.info.run_id:
        client.delete_run(run.info.run_id)
    return first


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


class TrackingError(ZayaError):
    """The MLflow store cannot be reached or opened, or does not hold the run it should."""


def read_run_info(train_dir: str | Path) -> dict:
    """``<train>/run.json`` as written by the train stage: ``{run_id, experiment_id, tracking_uri}``."""
    path = Path(train_dir) / "run.json"
    if not path.is_file():
        raise DataError(f"{path} is missing: run the train stage first (zaya train)")
    try:
        info = read_json(path)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON ({exc})") from None
    missing = [k for k in ("run_id", "tracking_uri") if not info.get(k)]
    if missing:
        raise DataError(f"{path}: missing {', '.join(missing)}")
    return info


def check_store(uri: str, timeout_s: float = 5.0) -> None:
    """Fail fast, naming ``uri``, on a store that is certainly not there: a refused or silent HTTP server
    (before MLflow's minutes of retries) or an SQLite file that does not exist (MLflow would create an empty
    one, which cannot hold the run we look for)."""
    parsed = urlparse(uri)
    # Behind a proxy a direct connection says nothing: leave the verdict to MLflow's own request.
    proxied = parsed.scheme in getproxies() and not proxy_bypass(parsed.hostname or "")
    if parsed.scheme in ("http", "https") and not proxied:
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        try:
            socket.create_connection((parsed.hostname, port), timeout=timeout_s).close()
        except OSError as exc:
            raise TrackingError(f"cannot reach the MLflow tracking server {uri}: {exc}") from None
    elif parsed.scheme == "sqlite":
        db = uri.removeprefix("sqlite:///")
        if db.startswith("file:"):  # an SQLite URI filename, e.g. file:/path/mlflow.db?mode=ro&uri=true
            db = db.removeprefix("file:").split("?", 1)[0]
        if db not in ("", ":memory:") and not Path(db).is_file():
            raise TrackingError(f"MLflow tracking store {uri}: database file {db} does not exist")


def get_run(uri: str, run_id: str):
    """A client on ``uri`` and the run ``run_id`` in it; ``TrackingError`` naming the URI if either fails."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    check_store(uri)
    client = MlflowClient(tracking_uri=uri)
    try:
        return client, client.get_run(run_id)
    except MlflowException as exc:
        if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
            raise TrackingError(f"run {run_id} is not in the MLflow store {uri}: re-run zaya train") from None
        raise TrackingError(f"cannot open the MLflow tracking store {uri}: {_first_line(exc)}") from None
    except Exception as exc:  # requests / SQLAlchemy errors surface unwrapped from some stores
        raise TrackingError(f"cannot open the MLflow tracking store {uri}: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@contextlib.contextmanager
def using_tracking_uri(uri: str) -> Iterator[None]:
    """Point MLflow's fluent API (``start_run``, ``log_model``) at ``uri`` for the block only.

    ``mlflow.set_tracking_uri`` also sets ``$MLFLOW_TRACKING_URI`` for child processes; both are put back.
    """
    import mlflow
    from mlflow.tracking._tracking_service import utils as tracking_utils

    saved_uri = tracking_utils._tracking_uri  # None = "not set", which no public getter tells apart
    saved_env = os.environ.get("MLFLOW_TRACKING_URI")
    mlflow.set_tracking_uri(uri)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(saved_uri)
        if saved_env is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = saved_env
