"""Registration interrupted or refused, against real SQLite stores: Ctrl-C and kill -9 right after the version
is created, and an artifact folder that cannot be written. The version is complete or absent, never half
there, and the training run it comes from is never changed."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from zaya_pipeline.config import load_config
from zaya_pipeline.registry.register import register
from zaya_pipeline.tracking import TrackingError

CONF = Path(__file__).resolve().parents[2] / "conf"
NAME = "zaya-reliable"

# Runs `register` on the config overrides in argv and dies by SIGKILL (or Ctrl-C: KeyboardInterrupt) the
# moment the transaction that inserted a row into the table argv[2] (model_versions, logged_models) commits:
# the database library's own hooks, no stand-in for MLflow.
INTERRUPT = """
import os, signal, sys
from pathlib import Path
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

created = []

@event.listens_for(Engine, "after_cursor_execute")
def _seen(conn, cursor, statement, *args):
    if statement.lstrip().upper().startswith("INSERT INTO " + sys.argv[2].upper()):
        created.append(statement)

@event.listens_for(Session, "after_commit")
def _interrupt(session):
    if created:
        created.clear()
        if sys.argv[1] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise KeyboardInterrupt

from zaya_pipeline.config import load_config
from zaya_pipeline.registry.register import register

try:
    register(load_config(sys.argv[4:], conf_dir=Path(sys.argv[3])))
except KeyboardInterrupt:  # as `zaya` does (cli.main): exit status 130
    sys.exit(130)
"""


@pytest.fixture
def store(workspace, tmp_path) -> dict:
    """The workspace's model, tokenizer and metrics, and a store of our own with one FINISHED training run."""
    shutil.copytree(workspace["root"] / "train", tmp_path / "train")
    shutil.copytree(workspace["root"] / "reports", tmp_path / "reports")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    artifacts = tmp_path / "mlartifacts"
    artifacts.mkdir()
    exp = client.create_experiment("reliability", artifact_location=artifacts.as_uri())
    run = client.create_run(exp)
    client.set_terminated(run.info.run_id)
    info = {"run_id": run.info.run_id, "experiment_id": exp, "tracking_uri": uri}
    (tmp_path / "train" / "run.json").write_text(json.dumps(info))
    overrides = [
        f"paths.train={tmp_path}/train",
        f"paths.reports={tmp_path}/reports",
        f"paths.tokenizer={workspace['root']}/tokenizer",
        f"paths.tokens={workspace['root']}/tokens",
        f"registry.tracking_uri={uri}",
        f"registry.model_name={NAME}",
    ]
    cfg = load_config(overrides, conf_dir=CONF)
    return {"cfg": cfg, "overrides": overrides, "uri": uri, "client": client, "run": run, "exp": exp}


def interrupted(store: dict, how: str, table: str = "model_versions") -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", INTERRUPT, how, table, str(CONF), *store["overrides"]]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=os.environ.copy())


def check_one_complete_version(store: dict) -> None:
    """One version, complete (its lineage tags, aliases, ``registration=complete``), from one logged model;
    and the training run as it was."""
    client = store["client"]
    versions = client.search_model_versions(f"name='{NAME}'")
    assert [v.version for v in versions] == [versions[0].version], "an orphaned version was left behind"
    version = versions[0]
    assert version.tags["registration"] == "complete" and "weights_sha256" in version.tags
    assert set(client.get_model_version(NAME, version.version).aliases) == {"candidate", "champion"}
    models = client.search_logged_models([store["exp"]])
    assert [(f"models:/{m.model_id}", str(m.status)) for m in models] == [(version.source, "READY")]
    run = client.get_run(store["run"].info.run_id)
    assert run.info.status == "FINISHED" and run.info.end_time == store["run_end_time"]


@pytest.mark.parametrize("how", ["kill", "ctrl-c"])
def test_an_interrupt_right_after_the_version_is_created_leaves_no_half_registered_version(store, how):
    store["run_end_time"] = store["client"].get_run(store["run"].info.run_id).info.end_time
    proc = interrupted(store, how)
    assert proc.returncode == (-signal.SIGKILL if how == "kill" else 130), proc.stderr[-3000:]
    versions = store["client"].search_model_versions(f"name='{NAME}'")
    if how == "kill":  # created with its lineage, marked pending until the aliases are set
        assert len(versions) == 1 and versions[0].tags["registration"] == "pending"
        assert "weights_sha256" in versions[0].tags and "eval.val_loss" in versions[0].tags
    else:  # Ctrl-C: undone at once
        assert versions == []
    assert store["client"].get_run(store["run"].info.run_id).info.status == "FINISHED"

    again = register(store["cfg"])  # the next run completes the pending version, or registers afresh
    assert again["promoted"] and not again.get("reused")
    check_one_complete_version(store)
    assert register(store["cfg"])["reused"]  # and then it is the version of these weights


def test_a_kill_while_the_model_uploads_leaves_nothing_behind_after_the_next_run(store):
    store["run_end_time"] = store["client"].get_run(store["run"].info.run_id).info.end_time
    proc = interrupted(store, "kill", table="logged_models")
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    models = store["client"].search_logged_models([store["exp"]])
    assert [str(m.status) for m in models] == ["PENDING"]
    register(store["cfg"])  # removes the unfinished logged model, then registers
    check_one_complete_version(store)


@contextlib.contextmanager
def read_only(folder: Path):
    """``folder`` where nothing can be created: chmod, and for root (whom chmod does not stop) chattr +i."""
    folder.chmod(0o555)
    immutable = False
    try:
        try:
            (folder / "probe").mkdir()
        except PermissionError:
            pass
        else:
            (folder / "probe").rmdir()
            immutable = subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0
            if not immutable:
                pytest.skip("cannot make a folder read-only here (root without chattr)")
        yield folder
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(folder)], check=True)
        folder.chmod(0o755)


@pytest.mark.parametrize("folder", ["mlartifacts", "."], ids=["artifact-folder", "store-folder"])
def test_an_unwritable_store_is_a_one_line_error_that_changes_nothing(store, tmp_path, folder):
    """A read-only artifact folder, or a read-only folder around mlflow.db (no room for its journal)."""
    client, run_id = store["client"], store["run"].info.run_id
    before = client.get_run(run_id).info
    previous = Path(store["cfg"].paths.reports) / "registry.json"  # the workspace's own registration
    previous_bytes = previous.read_bytes() if previous.exists() else None
    with read_only((tmp_path / folder).resolve()) as folder, pytest.raises(TrackingError) as err:
        register(store["cfg"])
    message = str(err.value)
    assert str(folder) in message and "\n" not in message, message
    after = client.get_run(run_id).info
    assert (after.status, after.end_time) == (before.status, before.end_time) == ("FINISHED", before.end_time)
    assert client.search_logged_models([store["exp"]]) == []
    assert client.search_model_versions(f"name='{NAME}'") == []
    assert (previous.read_bytes() if previous.exists() else None) == previous_bytes  # left as it was
    # Once the folder is writable again, the same command registers.
    store["run_end_time"] = before.end_time
    register(store["cfg"])
    check_one_complete_version(store)
