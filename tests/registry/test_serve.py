"""``mlflow models serve`` on a registered version: a real server on 127.0.0.1, real HTTP requests.

The served text must be what the same registered version generates when loaded in this process with
``mlflow.pyfunc.load_model``; bad requests are HTTP 400 with a message, and the server keeps serving after
them; stopping it ends its whole process group and frees the port.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import socket
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import mlflow
import pandas as pd
import pytest

from support.mlflow_ui import free_port, serving
from zaya_pipeline.registry.register import register
from zaya_pipeline.tracking import using_tracking_uri

MODEL_NAME = "zaya-serve"
READY_DEADLINE_S = 120  # model load takes ~7 s on 2 idle cores; leave room for a busy machine
PROMPTS = ["The database", "the café serves"]  # a non-ASCII prompt: the text must survive the JSON round-trip


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
    env = os.environ | {"MLFLOW_TRACKING_URI": workspace["uri"], "PATH": path}
    cmd = [str(venv_bin / "mlflow"), "models", "serve", "-m", model_uri, "--env-manager", "local"]
    cmd += ["-h", "127.0.0.1", "-p", str(port)]
    with serving(cmd, port, "/ping", root / "server.log", READY_DEADLINE_S, env=env, cwd=root) as server:
        yield {"url": server.url, "model_uri": model_uri, "uri": workspace["uri"], "proc": server.proc,
               "port": port, "stop": server.stop, "log": server.log}  # fmt: skip


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


def test_stopping_the_server_ends_its_process_group_and_frees_the_port(served):
    served["stop"]()
    assert served["proc"].returncode is not None
    deadline = time.monotonic() + 30
    while True:  # uvicorn is a child of the mlflow CLI process: the whole group must go
        try:
            os.killpg(served["proc"].pid, 0)
        except ProcessLookupError:
            break
        if time.monotonic() > deadline:
            pytest.fail(f"the server outlived SIGTERM:\n{served['log'].read_text()[-3000:]}")
        time.sleep(0.2)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", served["port"]), timeout=5).close()
