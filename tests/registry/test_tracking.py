"""Tracking helpers: run.json, store checks, and a tracking URI that does not outlive its block."""

from __future__ import annotations

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
