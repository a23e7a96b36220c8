"""Tracking helpers: run.json, store checks, and a tracking URI that does not outlive its block."""

from __future__ import annotations

import os

import mlflow
import pytest

from zaya_pipeline.errors import DataError
from zaya_pipeline.registry.tracking import TrackingError, check_store, read_run_info, using_tracking_uri


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
