"""Tracking helpers: run.json, store checks, a tracking URI that does not outlive its block, and the status of
the runs the stages start (ended on every way out; a dead process's run marked KILLED at the next start)."""

from __future__ import annotations

import contextlib
import os

import mlflow
import pytest

from zaya_pipeline.errors import DataError
from zaya_pipeline.tracking import TrackingError, check_store, read_run_info, using_tracking_uri


def test_run_json_must_exist_parse_and_name_the_run(tmp_path):
    with pytest.raises(DataError, match="zaya train"):
        read_run_info(tmp_path)
    (tmp_path / "run.json").write_text("{not json")
    with pytest.raises(DataError, match="not valid JSON"):
        read_run_info(tmp_path)
    (tmp_path / "run.json").write_text('{"run_id": "abc"}')
    with pytest.raises(DataError, match="missing tracking_uri"):
        read_run_info(tmp_path)
    (tmp_path / "run.json").write_text('{"run_id": "abc", "tracking_uri": "sqlite:///x.db"}')
    assert read_run_info(tmp_path)["run_id"] == "abc"


def test_check_store_refuses_a_missing_sqlite_file_and_a_closed_port(tmp_path, monkeypatch):
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(TrackingError, match="does not exist"):
        check_store(f"sqlite:///{tmp_path}/mlflow.db")
    (tmp_path / "mlflow.db").touch()
    check_store(f"sqlite:///{tmp_path}/mlflow.db")
    with pytest.raises(TrackingError, match=r"cannot reach the MLflow tracking server http://127\.0\.0\.1:9"):
        check_store("http://127.0.0.1:9")


def test_using_tracking_uri_puts_the_uri_and_the_environment_back(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/outer.db")
    before = mlflow.get_tracking_uri()
    inner = f"sqlite:///{tmp_path}/inner.db"
    with using_tracking_uri(inner):
        assert mlflow.get_tracking_uri() == inner
    assert mlflow.get_tracking_uri() == before
    assert os.environ["MLFLOW_TRACKING_URI"] == f"sqlite:///{tmp_path}/outer.db"
    with pytest.raises(RuntimeError), using_tracking_uri(inner):
        raise RuntimeError("boom")
    assert mlflow.get_tracking_uri() == before


def test_dvc_experiments_of_one_baseline_share_one_parent_run(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from zaya_pipeline.tracking import PARENT_ENV, run_tags

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("e", artifact_location=(tmp_path / "art").as_uri())
    monkeypatch.delenv(PARENT_ENV, raising=False)
    monkeypatch.delenv("DVC_EXP_BASELINE_REV", raising=False)
    assert "mlflow.parentRunId" not in run_tags(uri, exp)  # a plain run (dvc repro, zaya train) stands alone

    monkeypatch.setenv("DVC_EXP_NAME", "quick-fox")
    monkeypatch.setenv("DVC_EXP_BASELINE_REV", "a" * 40)
    first = run_tags(uri, exp)
    monkeypatch.setenv("DVC_EXP_NAME", "slow-owl")
    second = run_tags(uri, exp)
    assert first["mlflow.parentRunId"] == second["mlflow.parentRunId"]
    assert second["dvc.exp_name"] == "slow-owl" and second["zaya.sweep"] == "child"
    parent = client.get_run(first["mlflow.parentRunId"])
    assert parent.info.run_name == "dvc exp aaaaaaa" and parent.data.tags["zaya.sweep"] == "parent"

    monkeypatch.setenv("DVC_EXP_BASELINE_REV", "b" * 40)  # a new baseline commit: a new group
    assert run_tags(uri, exp)["mlflow.parentRunId"] != first["mlflow.parentRunId"]

    monkeypatch.setenv(PARENT_ENV, "hydra-parent")  # a Hydra sweep inside a DVC experiment: Hydra's wins
    assert run_tags(uri, exp)["mlflow.parentRunId"] == "hydra-parent"


def test_two_experiments_racing_to_create_the_parent_end_up_with_one(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from zaya_pipeline.tracking import dvc_parent_run

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("e", artifact_location=(tmp_path / "art").as_uri())
    rev = "c" * 40
    # The other worker creates its parent between our search (which found none) and our create.
    other = client.create_run(exp, run_name="dvc exp ccccccc", tags={"zaya.dvc_baseline": rev}).info.run_id
    real_search, calls = MlflowClient.search_runs, []

    def first_search_misses_it(self, *args, **kwargs):
        calls.append(1)
        return [] if len(calls) == 1 else real_search(self, *args, **kwargs)

    monkeypatch.setattr(MlflowClient, "search_runs", first_search_misses_it)
    assert dvc_parent_run(uri, exp, rev) == other
    monkeypatch.undo()
    live = client.search_runs([exp], f"tags.`zaya.dvc_baseline` = '{rev}'")
    assert [r.info.run_id for r in live] == [other]  # ours was deleted


# --- run status on every way out, and runs of dead processes (issue 24) ------------------------------------

OPEN_A_RUN = """
import sys, time
from mlflow import MlflowClient
from zaya_pipeline.tracking import process_tags
run = MlflowClient(sys.argv[1]).create_run(sys.argv[2], run_name="doomed", tags=process_tags())
print(run.info.run_id, flush=True)
time.sleep(120)
"""


def killed_run(uri: str, experiment_id: str) -> tuple[str, int]:
    """A run left RUNNING by a process (tagged with its host and pid) that was then killed with SIGKILL."""
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-c", OPEN_A_RUN, uri, experiment_id], stdout=subprocess.PIPE, text=True
    )
    run_id = proc.stdout.readline().strip()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    return run_id, proc.pid


def store(tmp_path):
    from zaya_pipeline.config import RegistryConfig
    from zaya_pipeline.tracking import setup_mlflow

    cfg = RegistryConfig(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", experiment_name="e")
    with using_tracking_uri(cfg.tracking_uri):
        return cfg, setup_mlflow(cfg)


def test_a_run_left_running_by_a_killed_process_is_marked_killed_at_the_next_start(tmp_path, caplog):
    from mlflow import MlflowClient

    from zaya_pipeline.tracking import setup_mlflow

    cfg, exp = store(tmp_path)
    client = MlflowClient(cfg.tracking_uri)
    run_id, pid = killed_run(cfg.tracking_uri, exp)
    assert client.get_run(run_id).info.status == "RUNNING"  # what kill -9 leaves behind
    with using_tracking_uri(cfg.tracking_uri), caplog.at_level("WARNING", logger="zaya.tracking"):
        assert setup_mlflow(cfg) == exp  # the next start
    assert client.get_run(run_id).info.status == "KILLED"
    assert f"left RUNNING by process {pid}, which is gone: marked KILLED" in caplog.text


def test_runs_of_live_processes_and_of_other_hosts_are_left_running(tmp_path):
    import socket

    from mlflow import MlflowClient

    from zaya_pipeline.tracking import HOST_TAG, PID_TAG, end_dead_runs, process_tags

    cfg, exp = store(tmp_path)
    client = MlflowClient(cfg.tracking_uri)
    ours = client.create_run(exp, tags=process_tags()).info.run_id  # this (live) process
    dead_elsewhere, pid = killed_run(cfg.tracking_uri, exp)
    client.set_tag(dead_elsewhere, HOST_TAG, "another-" + socket.gethostname())  # its pid means nothing here
    untagged = client.create_run(exp).info.run_id  # started by someone else's code
    assert client.get_run(ours).data.tags[PID_TAG] == str(os.getpid())
    assert end_dead_runs(cfg.tracking_uri, exp) == []
    for run_id in (ours, dead_elsewhere, untagged):
        assert client.get_run(run_id).info.status == "RUNNING"


def test_ending_run_ends_finished_failed_or_killed(tmp_path):
    import signal
    import time

    from mlflow import MlflowClient

    from zaya_pipeline.errors import Preempted, Terminated
    from zaya_pipeline.tracking import ending_run

    cfg, exp = store(tmp_path)
    client = MlflowClient(cfg.tracking_uri)
    handler = signal.getsignal(signal.SIGTERM)

    def status(raises, block) -> str:
        run_id = client.create_run(exp).info.run_id
        expected = pytest.raises(raises) if raises else contextlib.nullcontext()
        with expected, ending_run(cfg.tracking_uri, run_id):
            block()
        assert signal.getsignal(signal.SIGTERM) == handler  # put back
        return client.get_run(run_id).info.status

    def sigterm():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)  # the handler raises long before

    def fail():
        raise RuntimeError("boom")

    def preempted():
        raise Preempted("SIGTERM: stopped at step 5")

    def ctrl_c():
        raise KeyboardInterrupt

    assert status(None, lambda: None) == "FINISHED"
    assert status(RuntimeError, fail) == "FAILED"
    assert status(Terminated, sigterm) == "KILLED"
    assert status(Preempted, preempted) == "KILLED"
    assert status(KeyboardInterrupt, ctrl_c) == "KILLED"


def test_train_failing_after_its_run_started_ends_it_failed(tmp_path):
    """train writes its reports after fit, which Lightning ends FINISHED: a failure there ends it FAILED."""
    from mlflow import MlflowClient

    from train.token_shards import write_shards
    from zaya_pipeline.config import load_config
    from zaya_pipeline.tracking import HOST_TAG, PID_TAG
    from zaya_pipeline.train.run import train

    write_shards(tmp_path / "tokens")
    (tmp_path / "file").write_text("not a folder")
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = load_config([
        "train=debug", "model=debug", "train.max_steps=2", "train.val_every=2", "train.log_every=1",
        f"paths.tokens={tmp_path / 'tokens'}", f"paths.train={tmp_path / 'train'}",
        f"paths.reports={tmp_path / 'file' / 'reports'}", f"paths.checkpoints={tmp_path / 'ckpt'}",
        f"registry.tracking_uri={uri}",
    ])  # fmt: skip
    with pytest.raises(OSError), using_tracking_uri(uri):
        train(cfg)
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name(cfg.registry.experiment_name).experiment_id])
    assert run.info.status == "FAILED"
    assert run.data.tags[HOST_TAG] and run.data.tags[PID_TAG] == str(os.getpid())
