"""``mlflow models serve`` on a registered version: a real server on 127.0.0.1, real HTTP requests.

The served text must be what the same registered version generates when loaded in this process with
``mlflow.pyfunc.load_model``; bad requests are HTTP 400 with a message, and the server keeps serving after
them; serving is bounded: requests above the registered caps are HTTP 400, decoding stops when a request
times out (HTTP 504, the server goes back to idle) and SIGTERM stops the server promptly, even mid-request,
ending its whole process group and freeing the port.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import mlflow
import pandas as pd
import psutil
import pytest

from support.mlflow_ui import free_port, serving
from zaya_pipeline.config import RegistryConfig
from zaya_pipeline.registry.register import register
from zaya_pipeline.tracking import using_tracking_uri

MODEL_NAME = "zaya-serve"
READY_DEADLINE_S = 120  # model load takes ~7 s on 2 idle cores; leave room for a busy machine
PROMPTS = ["The database", "the café serves"]  # a non-ASCII prompt: the text must survive the JSON round-trip
REQUEST_TIMEOUT_S = 8  # MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT of the server: the other requests take < 1 s
CAPS = RegistryConfig()  # the registered caps: the defaults
# At the caps: ~65k decoding steps, a minute or more on 2 cores (the test model never emits EOS), far past
# the request timeout.
LONG = {"inputs": [f"prompt {i}" for i in range(CAPS.serve_max_batch)],
        "params": {"max_new_tokens": CAPS.serve_max_new_tokens}}  # fmt: skip
IDLE_CPU = 0.15  # share of one core: the idle server uses ~0
STOP_S = 10  # SIGTERM to every process gone: ~1.5 s on 2 cores


def post(url: str, body, content_type: str = "application/json") -> tuple[int, str]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@pytest.fixture(scope="module")
def served(workspace, tmp_path_factory):
    """The workspace's model registered under its own name (own reports folder, same store), served by
    ``mlflow models serve`` from the registry; ``stop()`` stops the whole process group (also at teardown)."""
    root = tmp_path_factory.mktemp("serve")
    cfg = copy.deepcopy(workspace["cfg"])
    cfg.paths.reports, cfg.registry.model_name = str(root / "reports"), MODEL_NAME
    (root / "reports").mkdir()
    shutil.copy(workspace["root"] / "reports" / "metrics.json", root / "reports")
    model_uri = register(cfg)["model_uri"]

    port = free_port()
    venv_bin = Path(sys.executable).parent  # MLflow execs `uvicorn` by name: the venv's bin must be on PATH
    path = f"{venv_bin}{os.pathsep}{os.environ['PATH']}"
    timeout = {"MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT": str(REQUEST_TIMEOUT_S)}
    env = os.environ | {"MLFLOW_TRACKING_URI": workspace["uri"], "PATH": path} | timeout
    cmd = [str(venv_bin / "mlflow"), "models", "serve", "-m", model_uri, "--env-manager", "local"]
    cmd += ["-h", "127.0.0.1", "-p", str(port)]
    with serving(cmd, port, "/ping", root / "server.log", READY_DEADLINE_S, env=env, cwd=root) as server:
        yield {"url": server.url, "model_uri": model_uri, "uri": workspace["uri"], "proc": server.proc,
               "port": port, "stop": server.stop, "log": server.log}  # fmt: skip


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) used so far by process ``pid`` and its live descendants."""
    total = 0.0
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def cpu_share(pid: int, seconds: float) -> float:
    """Cores used by the process tree of ``pid`` over the next ``seconds``."""
    before = cpu_seconds(pid)
    time.sleep(seconds)
    return (cpu_seconds(pid) - before) / seconds


@pytest.fixture(scope="module")
def in_process(served):
    """The same registered version loaded here (sys.path put back: MLflow prepends the version's code/)."""
    saved_path = list(sys.path)
    try:
        with using_tracking_uri(served["uri"]):
            model = mlflow.pyfunc.load_model(served["model_uri"])
    finally:
        sys.path[:] = saved_path
    return model


def test_the_served_model_generates_what_it_generates_in_process(served, in_process):
    invocations = f"{served['url']}/invocations"
    split = {"dataframe_split": {"columns": ["prompt"], "data": [[p] for p in PROMPTS]}}
    status, body = post(invocations, split | {"params": {"max_new_tokens": 6}})
    assert status == 200, body
    served_text = json.loads(body)["predictions"]
    expected = in_process.predict(pd.DataFrame({"prompt": PROMPTS}), params={"max_new_tokens": 6})
    assert served_text == expected
    assert len(served_text) == len(PROMPTS) and all(isinstance(t, str) and t for t in served_text)

    # The plain list form gives the same text; sampling with a seed is reproduced across the wire too.
    status, body = post(invocations, {"inputs": PROMPTS, "params": {"max_new_tokens": 6}})
    assert status == 200 and json.loads(body)["predictions"] == expected, body
    sampling = {"max_new_tokens": 6, "temperature": 1.5, "top_p": 0.9, "seed": 3}
    status, body = post(invocations, {"inputs": PROMPTS, "params": sampling})
    assert status == 200, body
    assert json.loads(body)["predictions"] == in_process.predict(PROMPTS, params=sampling)


def test_bad_requests_are_400_with_a_message_and_the_server_keeps_serving(served, in_process):
    invocations = f"{served['url']}/invocations"
    bad = [
        (b"not json", "valid JSON"),
        ({"params": {"max_new_tokens": 2}}, "exactly one of the input fields"),  # no inputs at all
        ({"dataframe_split": {"columns": ["prompt"], "data": [["a", "b"]]}}, "not a valid dataframe"),
        ({"inputs": ["a"], "params": {"max_new_tokens": "many"}}, "max_new_tokens"),  # MLflow's param schema
        ({"inputs": ["a"], "params": {"max_new_tokens": -1}}, "max_new_tokens must be >= 0"),  # the model's
    ]
    for payload, message in bad:
        status, body = post(invocations, payload)
        assert status == 400, (payload, status, body)
        error = json.loads(body)
        assert message in error["message"] + error.get("stack_trace", ""), (payload, body)

    status, body = post(invocations, {"inputs": PROMPTS[:1], "params": {"max_new_tokens": 3}})
    assert status == 200, body
    assert json.loads(body)["predictions"] == in_process.predict(PROMPTS[:1], params={"max_new_tokens": 3})


def test_requests_above_the_caps_are_400_naming_the_cap_and_the_server_keeps_serving(served, in_process):
    recorded = {"serve_max_new_tokens": CAPS.serve_max_new_tokens, "serve_max_batch": CAPS.serve_max_batch}
    assert in_process.model_config == recorded
    invocations = f"{served['url']}/invocations"
    too_long = {"inputs": ["a"], "params": {"max_new_tokens": CAPS.serve_max_new_tokens + 1}}
    too_many = {"inputs": ["a"] * (CAPS.serve_max_batch + 1), "params": {"max_new_tokens": 1}}
    over = [(too_long, "serve_max_new_tokens"), (too_many, "serve_max_batch")]
    for payload, key in over:
        status, body = post(invocations, payload)
        assert status == 400, (key, status, body[:500])
        error = json.loads(body)
        assert f"registry.{key}" in error["message"] + error.get("stack_trace", ""), (key, body[:2000])

    at_caps = {"inputs": ["a"] * CAPS.serve_max_batch, "params": {"max_new_tokens": 1}}
    status, body = post(invocations, at_caps)
    assert status == 200 and len(json.loads(body)["predictions"]) == CAPS.serve_max_batch, body[:500]


def test_a_request_past_the_timeout_is_504_and_its_decoding_stops(served):
    start = time.monotonic()
    status, body = post(f"{served['url']}/invocations", LONG)
    took = time.monotonic() - start
    assert status == 504, body[:500]
    assert took < REQUEST_TIMEOUT_S + 5, took
    time.sleep(1)
    busy = cpu_share(served["proc"].pid, 3)
    assert busy < IDLE_CPU, f"the server still uses {busy:.0%} of a core after the request timed out"
    assert "MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT" in body, body[:500]  # the model's message, not MLflow's


def test_sigterm_mid_request_ends_the_process_group_promptly_and_frees_the_port(served):
    response: dict = {}

    def request():
        try:
            response["result"] = post(f"{served['url']}/invocations", LONG)
        except OSError as exc:
            response["result"] = exc

    client = threading.Thread(target=request, daemon=True)
    client.start()
    time.sleep(2)
    assert client.is_alive(), response  # the request is being decoded
    pgid = served["proc"].pid
    start = time.monotonic()
    os.killpg(pgid, signal.SIGTERM)
    while True:  # uvicorn is a child of the mlflow CLI process: the whole group must go
        served["proc"].poll()  # reap the CLI process: a zombie still counts as a member of its group
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            break
        if time.monotonic() - start > STOP_S:
            os.killpg(pgid, signal.SIGKILL)
            pytest.fail(f"the server outlived SIGTERM by {STOP_S} s:\n{served['log'].read_text()[-3000:]}")
        time.sleep(0.1)
    served["stop"]()
    assert served["proc"].returncode is not None
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", served["port"]), timeout=5).close()
    client.join(timeout=10)
    status, body = response["result"]
    assert status == 503 and "stopping" in body, (status, body[:500])
