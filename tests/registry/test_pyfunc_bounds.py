"""The bounds of a served request, in-process: caps from the model_config, the deadline, a server stopping.

tests/registry/test_serve.py checks the same behind a real ``mlflow models serve``.
"""

from __future__ import annotations

import signal
import time

import pytest
import torch
from mlflow.exceptions import MlflowException

from conftest import workspace_generator
from zaya_pipeline.model import generate
from zaya_pipeline.registry import pyfunc
from zaya_pipeline.registry.pyfunc import ZayaGenerator, check_caps, request_guard

SERVED = {"_MLFLOW_IS_IN_SERVING_ENVIRONMENT": "true", "MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT": "60"}


@pytest.fixture(scope="module")
def generator(workspace) -> ZayaGenerator:
    return workspace_generator(workspace, {"serve_max_new_tokens": 8, "serve_max_batch": 2})


def test_caps_apply_behind_the_scoring_server_only(generator, monkeypatch):
    assert len(generator.predict(None, ["a"] * 3, {"max_new_tokens": 9})) == 3  # in-process: no caps
    monkeypatch.setenv("_MLFLOW_IS_IN_SERVING_ENVIRONMENT", "true")  # `mlflow models predict`: no caps
    assert len(generator.predict(None, ["a"] * 3, {"max_new_tokens": 9})) == 3
    for key, value in SERVED.items():
        monkeypatch.setenv(key, value)
    too_long = r"max_new_tokens=9: the served cap is 8 \(registry\.serve_max_new_tokens"
    with pytest.raises(ValueError, match=too_long):
        generator.predict(None, ["a"], {"max_new_tokens": 9})
    too_many = r"3 prompts in one request: the served cap is 2 \(registry\.serve_max_batch"
    with pytest.raises(ValueError, match=too_many):
        generator.predict(None, ["a"] * 3, {"max_new_tokens": 1})
    assert len(generator.predict(None, ["a"] * 2, {"max_new_tokens": 8})) == 2  # the caps are inclusive


def test_a_version_without_caps_gets_the_defaults():
    from zaya_pipeline.config import RegistryConfig

    caps, defaults = pyfunc._caps({}), RegistryConfig()
    assert caps == {"max_new_tokens": defaults.serve_max_new_tokens, "batch": defaults.serve_max_batch}
    check_caps(caps, caps["batch"], caps["max_new_tokens"])
    with pytest.raises(ValueError, match="registry.serve_max_batch"):
        check_caps(caps, caps["batch"] + 1, 1)


def test_the_guard_stops_decoding_at_the_deadline_and_on_a_stop_signal(generator, monkeypatch):
    model, ids = generator.model, torch.zeros(1, 3, dtype=torch.long)
    guard = request_guard(pyfunc.DEADLINE_MARGIN_S + 0.2)
    guard()  # within the deadline
    time.sleep(0.3)
    with pytest.raises(MlflowException, match="MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT") as err:
        generate(model, ids, 10**9, check_stop=guard)
    assert err.value.get_http_status_code() == 504

    guard = request_guard(60)
    server = FakeUvicorn()
    monkeypatch.setattr(signal, "getsignal", lambda sig: server.handle_exit)  # installed by uvicorn
    guard()
    server.handle_exit(signal.SIGTERM, None)
    with pytest.raises(MlflowException, match="server is stopping") as err:
        generate(model, ids, 10**9, check_stop=guard)
    assert err.value.get_http_status_code() == 503


class FakeUvicorn:
    """What uvicorn.Server does on SIGTERM/SIGINT (its ``handle_exit``)."""

    should_exit = False

    def handle_exit(self, sig, frame) -> None:
        self.should_exit = True


def test_only_a_uvicorn_server_is_seen_stopping(monkeypatch):
    assert not pyfunc.server_stopping()  # pytest's process: the default handler
    server = FakeUvicorn()
    monkeypatch.setattr(signal, "getsignal", lambda sig: server.handle_exit)
    assert not pyfunc.server_stopping()
    server.handle_exit(signal.SIGTERM, None)
    assert pyfunc.server_stopping()
    monkeypatch.setattr(signal, "getsignal", lambda sig: lambda signum, frame: None)
    assert not pyfunc.server_stopping()
