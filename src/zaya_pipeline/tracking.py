"""Where MLflow data lives: one embedded SQLite store inside the repo unless the user points elsewhere.

The embedded store follows the repository: ``run.json`` names it relative to the repository root, and a copied
(or moved) store is re-pointed at its own artifact folder the first time a stage opens it
(:func:`adopt_store`), so a copy of the repository never writes into the original's store or artifacts.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlparse
from urllib.request import getproxies, proxy_bypass

from zaya_pipeline.config import RegistryConfig
from zaya_pipeline.errors import DataError, Preempted, Terminated, ZayaError, first_line
from zaya_pipeline.utils import get_logger, process_alive, read_json

DEFAULT_DB = "mlflow.db"  # under the working directory (the repo root under DVC); ignored by git
DEFAULT_ARTIFACTS = "mlartifacts"

log = get_logger("tracking")


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
    return default_tracking_uri()


def repo_root() -> Path:
    """``$DVC_ROOT`` under DVC (also in a queued experiment's temporary copy), else the working directory."""
    return Path(os.environ.get("DVC_ROOT") or Path.cwd()).resolve()


def default_tracking_uri() -> str:
    """The embedded store ``sqlite:///<repo root>/mlflow.db``, adopted first if it was copied elsewhere."""
    root = repo_root()
    adopt_store(root)
    return f"sqlite:///{root / DEFAULT_DB}"


# How run.json names the default store: relative to the repository root, which is re-derived when it is read.
DEFAULT_STORE_REF = f"sqlite:///{DEFAULT_DB}"


def run_reference(uri: str) -> str:
    """How ``run.json`` names the store ``uri``: the default store as ``DEFAULT_STORE_REF``, others as given.

    An absolute path would send evaluate and register in a copy of the repository to the original's store;
    the relative one resolves, at read time, to the store of the repository they run in (``$DVC_ROOT`` for a
    queued ``dvc exp run``, so its runs keep landing in the repository's store). A store the user named
    (``registry.tracking_uri``, ``$MLFLOW_TRACKING_URI``) is kept as given.
    """
    return DEFAULT_STORE_REF if uri == f"sqlite:///{repo_root() / DEFAULT_DB}" else uri


# Columns of MLflow's SQL schema that hold artifact locations (absolute: see adopt_store).
LOCATION_COLUMNS = (
    ("experiments", "artifact_location"),
    ("runs", "artifact_uri"),
    ("logged_models", "artifact_location"),
    ("model_versions", "storage_location"),
    ("model_versions", "source"),
)


def adopt_store(root: Path) -> None:
    """Re-point the embedded store ``<root>/mlflow.db``, if it was copied or moved from another folder, at the
    artifact folder beside it: every stored location under the old folder is rewritten to the new one.

    ``setup_mlflow`` gives an experiment the artifact folder ``<folder of mlflow.db>/mlartifacts``, so an
    experiment whose folder is ``<P>/mlartifacts`` with ``<P>`` not ``root`` means the database came from
    ``<P>``. MLflow keeps every location absolute (measured with 3.17: a relative ``artifact_location`` is
    resolved against the working directory when the experiment is created; runs, logged models and versions
    copy their experiment's location at creation) and has no API to change one; relative locations stored
    by hand would resolve against each process's working directory, which differs for a queued DVC
    experiment (a temporary copy) and for ``mlflow ui`` started elsewhere. Hence the rewrite, in one
    transaction (concurrent stages: the second finds nothing left to rewrite).
    """
    db = root / DEFAULT_DB
    if not db.is_file():
        return
    try:
        with contextlib.closing(sqlite3.connect(db, timeout=30)) as con:
            if not con.execute("SELECT 1 FROM sqlite_master WHERE name = 'experiments'").fetchone():
                return  # MLflow has not created its tables yet
            locations = [row[0] for row in con.execute("SELECT artifact_location FROM experiments")]
            moved = {p.parent for p in map(_local_path, locations) if p and p.name == DEFAULT_ARTIFACTS}
            moved.discard(root)
            if not moved:
                return
            with con:  # one transaction
                for old in moved:
                    for prefix, new in ((old.as_uri(), root.as_uri()), (str(old), str(root))):
                        _replace_prefix(con, prefix + "/", new + "/")
    except sqlite3.Error as exc:
        raise TrackingError(f"cannot read the MLflow store {db}: {first_line(exc)}") from None


def _local_path(location: str | None) -> Path | None:
    """The folder of a local artifact location (a path or a ``file:`` URI), else None."""
    parsed = urlparse(location or "")
    return Path(unquote(parsed.path)) if parsed.scheme in ("", "file") and parsed.path else None


def _replace_prefix(con: sqlite3.Connection, old: str, new: str) -> None:
    """``old`` → ``new`` at the start of every location column; a store moved into a subfolder of its old
    folder keeps what is already under the new one."""
    for table, column in LOCATION_COLUMNS:
        sql, args = (
            f"UPDATE {table} SET {column} = ? || substr({column}, ?) WHERE substr({column}, 1, ?) = ?",
            [new, len(old) + 1, len(old), old],
        )
        if new.startswith(old):
            sql, args = f"{sql} AND substr({column}, 1, ?) != ?", [*args, len(new), new]
        con.execute(sql, args)


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
    if _sqlite_file(uri) is not None:  # read-only or corrupt: one line, not MLflow's logged traceback
        check_store_writable(uri)
    mlflow.set_tracking_uri(uri)
    exp = mlflow.get_experiment_by_name(cfg.experiment_name)
    if exp is not None:
        mlflow.set_experiment(experiment_id=exp.experiment_id)
        end_dead_runs(uri, exp.experiment_id)
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
    """``<train>/run.json`` as written by the train stage: ``{run_id, experiment_id, tracking_uri}``, with the
    default store's relative reference (:func:`run_reference`) resolved in the repository this runs in."""
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
    if info["tracking_uri"] == DEFAULT_STORE_REF:
        info["tracking_uri"] = default_tracking_uri()
    return info


def check_server(uri: str, timeout_s: float = 5.0) -> None:
    """Fail fast, naming ``uri``, when ``uri`` is an HTTP(S) tracking server that refuses or does not answer
    a connection (MLflow itself would retry for minutes). Other stores pass."""
    parsed = urlparse(uri)
    # Behind a proxy a direct connection says nothing: leave the verdict to MLflow's own request.
    proxied = parsed.scheme in getproxies() and not proxy_bypass(parsed.hostname or "")
    if parsed.scheme in ("http", "https") and not proxied:
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        try:
            socket.create_connection((parsed.hostname, port), timeout=timeout_s).close()
        except OSError as exc:
            raise TrackingError(f"cannot reach the MLflow tracking server {uri}: {exc}") from None


def check_store(uri: str, timeout_s: float = 5.0) -> None:
    """Fail fast, naming ``uri``, on a store that is certainly not there: a refused or silent HTTP server
    (:func:`check_server`) or an SQLite file that does not exist (MLflow would create an empty one, which
    cannot hold the run we look for)."""
    check_server(uri, timeout_s)
    if urlparse(uri).scheme == "sqlite" and _sqlite_file(uri) is None:
        db = uri.removeprefix("sqlite:///").removeprefix("file:").split("?", 1)[0]
        if db not in ("", ":memory:"):
            raise TrackingError(f"MLflow tracking store {uri}: database file {db} does not exist")


def _sqlite_file(uri: str) -> Path | None:
    """The existing database file of an SQLite store URI, else None (another store, or not created yet)."""
    if urlparse(uri).scheme != "sqlite":
        return None
    db = uri.removeprefix("sqlite:///")
    if db.startswith("file:"):  # an SQLite URI filename, e.g. file:/path/mlflow.db?mode=ro&uri=true
        db = db.removeprefix("file:").split("?", 1)[0]
    return Path(db) if db not in ("", ":memory:") and Path(db).is_file() else None


def check_store_writable(uri: str) -> None:
    """Fail, naming the database, when the SQLite store ``uri`` cannot be written (a read-only file, folder or
    ``mode=ro`` URI): a table created and rolled back proves it, before anything is created and without the
    traceback MLflow logs on a failed write. Other stores answer for themselves."""
    if urlparse(uri).scheme != "sqlite":
        return
    db = uri.removeprefix("sqlite:///")
    if db in ("", ":memory:"):
        return
    try:  # "file:..." is an SQLite URI filename (file:/path/mlflow.db?mode=ro&uri=true)
        with contextlib.closing(sqlite3.connect(db, uri=db.startswith("file:"), isolation_level=None)) as con:
            con.execute("BEGIN IMMEDIATE")
            try:
                con.execute("CREATE TABLE zaya_write_check (x INTEGER)")
            finally:
                con.execute("ROLLBACK")
    except sqlite3.Error as exc:
        raise TrackingError(f"cannot write the MLflow store {db}: {exc}") from None


def check_artifact_location(location: str) -> None:
    """Fail, naming the folder, when nothing can be created in the local artifact folder ``location`` (or in
    its nearest existing parent): before a logged model or version is created. A probe folder is made and
    removed, since permission bits do not tell (root, read-only mounts, immutable folders). Remote locations
    (a server, an object store) answer for themselves."""
    folder = _local_path(location)
    if folder is None:
        return
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        Path(tempfile.mkdtemp(prefix=".zaya-write-check-", dir=folder)).rmdir()
    except OSError as exc:
        raise TrackingError(f"cannot write MLflow artifacts to {folder}: {exc.strerror or exc}") from None


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
        raise TrackingError(f"cannot open the MLflow tracking store {uri}: {first_line(exc)}") from None
    except Exception as exc:  # requests / SQLAlchemy errors surface unwrapped from some stores
        raise TrackingError(f"cannot open the MLflow tracking store {uri}: {first_line(exc)}") from None


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


# --- the status of the runs we start ------------------------------------------------------------------------

HOST_TAG, PID_TAG = "zaya.host", "zaya.pid"  # the process that runs an MLflow run (process_tags)


def process_tags() -> dict[str, str]:
    """Tags naming this process: a run it leaves RUNNING when it dies (kill -9, power loss) is found by
    :func:`end_dead_runs` at the next start on this host."""
    return {HOST_TAG: socket.gethostname(), PID_TAG: str(os.getpid())}


def end_dead_runs(uri: str, experiment_id: str) -> list[str]:
    """Mark KILLED the RUNNING runs of ``experiment_id`` that a process of this host started (tagged by
    :func:`process_tags`) and that is gone; returns their ids. Runs of other hosts, and of live processes
    (or of a pid taken again since), are left alone."""
    from mlflow import MlflowClient

    client, host = MlflowClient(uri), socket.gethostname()
    query = f"attributes.status = 'RUNNING' and tags.`{HOST_TAG}` = '{host}'"
    ended = []
    for run in client.search_runs([experiment_id], query, max_results=1000):
        pid = int(run.data.tags.get(PID_TAG) or 0)
        if pid > 0 and not process_alive(pid):
            client.set_terminated(run.info.run_id, "KILLED")
            log.warning(
                "MLflow run %s (%s) was left RUNNING by process %d, which is gone: marked KILLED",
                *(run.info.run_id, run.info.run_name, pid),
            )
            ended.append(run.info.run_id)
    return ended


def _end_run(uri: str, run_id: str, status: str) -> None:
    import mlflow

    active = mlflow.active_run()
    if active is not None and active.info.run_id == run_id:
        mlflow.end_run(status)  # also takes it off the fluent API's stack, so `with start_run` keeps it
    else:
        mlflow.MlflowClient(uri).set_terminated(run_id, status)


@contextlib.contextmanager
def ending_run(uri: str, run_id: str) -> Iterator[None]:
    """End the MLflow run ``run_id`` of store ``uri`` however the block ends: FINISHED, KILLED on Ctrl-C,
    SIGTERM or Preempted, FAILED on any other exception. For the block SIGTERM raises Terminated, so the stage
    unwinds (a handler installed inside, e.g. the checkpoint saver's, takes over while it is in place).
    An empty ``run_id`` (ranks other than 0) does nothing."""
    if not run_id:
        yield
        return
    signals: list[int] = []

    def on_signal(signum, frame):
        signals.append(signum)
        raise KeyboardInterrupt if signum == signal.SIGINT else Terminated("terminated by SIGTERM")

    main = threading.current_thread() is threading.main_thread()  # only it may set signal handlers
    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        yield
    except BaseException as exc:
        # Lightning turns Ctrl-C during fit into SystemExit(1): the signal, not the exception, tells it
        killed = signals or isinstance(exc, KeyboardInterrupt | Terminated | Preempted)
        try:
            _end_run(uri, run_id, "KILLED" if killed else "FAILED")
        except Exception as end_exc:  # the stage's own error is the one to report
            log.warning("could not end MLflow run %s: %s", run_id, first_line(end_exc))
        raise
    else:
        _end_run(uri, run_id, "FINISHED")
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
