"""``ZayaGenerator``: the registered model as an MLflow pyfunc that turns prompts into continuations.

Artifacts it reads (logged by ``register``): ``model`` (model.pt), ``tokenizer`` (tokenizer.json) and
``tokenizer_meta`` (the tokenizer stage's meta.json, for the EOS id). ``predict`` takes a DataFrame with a
``prompt`` column or a list of strings and returns one continuation string per prompt; params (all optional):
``max_new_tokens`` (32), ``temperature`` (0 = greedy), ``top_p`` (1.0), ``seed`` (0, for sampling).

Each prompt is preceded by EOS, as every training document was (EOS ends the previous one), and decoded on
its own: the model has no padding mask, so prompts of different lengths are not batched.

Behind MLflow's scoring server (``mlflow models serve``) a request is bounded: more prompts or new tokens than
the caps in the version's model_config (``registry.serve_max_batch``, ``registry.serve_max_new_tokens``,
recorded by ``register``; the defaults for a version without them) is a ValueError (HTTP 400); decoding stops
with HTTP 504 just before the server's request timeout (``MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT``: MLflow
answers 504 then but runs ``predict`` in a thread it cannot stop, so it would decode on), and with HTTP 503
once the server gets SIGTERM or SIGINT (uvicorn waits for the requests in flight before it exits). Other
calls (``zaya generate``, in-process ``predict``, ``mlflow models predict``) have no caps and no deadline.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from typing import Any

import mlflow.pyfunc
import numpy as np
import pandas as pd

DEFAULT_PARAMS: dict[str, Any] = {"max_new_tokens": 32, "temperature": 0.0, "top_p": 1.0, "seed": 0}
PARAM_TYPES = {"max_new_tokens": "long", "temperature": "double", "top_p": "double", "seed": "long"}
PROMPT_COLUMN = "prompt"
CAPS = {"max_new_tokens": "serve_max_new_tokens", "batch": "serve_max_batch"}  # → RegistryConfig field
DEADLINE_MARGIN_S = 0.5  # stop this long before MLflow's timeout: the client gets this module's message


def signature():
    """Input: one string column (a list of prompts fits it, and so does a ``prompt`` DataFrame column);
    output: one string per row; params with their defaults."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema

    params = ParamSchema([ParamSpec(k, PARAM_TYPES[k], v) for k, v in DEFAULT_PARAMS.items()])
    text = Schema([ColSpec("string")])
    return ModelSignature(inputs=text, outputs=text, params=params)


def prompts_of(model_input) -> list[str]:
    """The prompts of a DataFrame (its ``prompt`` column, or its only column), a Series, a dict with a
    ``prompt`` list, a list or a single string. List-valued cells (``{"prompt": [...]}`` as MLflow's schema
    enforcement frames it) are flattened. Over HTTP (``mlflow models serve``) MLflow itself refuses the dict
    form with a 400 (the signature's one column is unnamed): send ``dataframe_split`` or ``inputs`` as a list
    (tests/registry/test_serve.py)."""
    if isinstance(model_input, pd.DataFrame):
        if PROMPT_COLUMN in model_input.columns:
            model_input = model_input[PROMPT_COLUMN]
        elif len(model_input.columns) == 1:
            model_input = model_input.iloc[:, 0]
        else:
            raise ValueError(f"input needs a '{PROMPT_COLUMN}' column, got {list(model_input.columns)}")
    elif isinstance(model_input, dict):
        model_input = model_input.get(PROMPT_COLUMN, [])
    if isinstance(model_input, str):
        model_input = [model_input]
    prompts: list = []
    for value in model_input:
        prompts.extend(value if isinstance(value, list | tuple | np.ndarray) else [value])
    bad = [p for p in prompts if not isinstance(p, str)]
    if bad:
        raise ValueError(f"prompts must be strings, got {bad[:3]}")
    return prompts


def serving_config(registry_cfg) -> dict[str, int]:
    """The model_config ``register`` records: the serving caps of a ``RegistryConfig``."""
    return {key: int(getattr(registry_cfg, key)) for key in CAPS.values()}


def _caps(model_config: dict | None) -> dict[str, int]:
    from zaya_pipeline.config import RegistryConfig

    config = serving_config(RegistryConfig()) | (model_config or {})
    return {name: int(config[key]) for name, key in CAPS.items()}


def check_caps(caps: dict[str, int], n_prompts: int, max_new_tokens: int) -> None:
    """ValueError naming the cap and its config key when a request exceeds one."""
    for name, value in (("batch", n_prompts), ("max_new_tokens", max_new_tokens)):
        if value > caps[name]:
            what = f"{value} prompts in one request" if name == "batch" else f"max_new_tokens={value}"
            cap = f"{caps[name]} (registry.{CAPS[name]}, recorded at registration)"
            raise ValueError(f"{what}: the served cap is {cap}")


def server_stopping() -> bool:
    """Whether the uvicorn server of this process is shutting down. MLflow's scoring server is uvicorn, whose
    SIGTERM/SIGINT handler is its ``Server.handle_exit``: it sets ``should_exit``, then uvicorn waits for the
    requests in flight. A pyfunc has no other way to learn it; False for any other handler."""
    server = getattr(signal.getsignal(signal.SIGTERM), "__self__", None)
    return getattr(server, "should_exit", False) is True


def request_guard(timeout_s: float) -> Callable[[], None]:
    """A ``check_stop`` for one served request: raises an MlflowException, HTTP 504 once the request nears
    ``timeout_s``, HTTP 503 once the server is stopping."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import DEADLINE_EXCEEDED, TEMPORARILY_UNAVAILABLE

    start = time.monotonic()
    deadline = start + timeout_s - DEADLINE_MARGIN_S

    def check() -> None:
        if server_stopping():
            why = "the server is stopping: generation abandoned"
            raise MlflowException(why, error_code=TEMPORARILY_UNAVAILABLE)
        if time.monotonic() > deadline:
            why = (
                f"generation stopped after {time.monotonic() - start:.1f} s, at the request timeout "
                f"(MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT={timeout_s:g} s): ask for fewer tokens or prompts"
            )
            raise MlflowException(why, error_code=DEADLINE_EXCEEDED)

    return check


def _served_timeout() -> float | None:
    """The request timeout of MLflow's scoring server when ``predict`` runs behind one, else None. The server
    sets the serving flag and ``mlflow models serve`` always sets the timeout variable for it; ``mlflow
    models predict`` and input-example checks set only the flag."""
    from mlflow.environment_variables import (
        _MLFLOW_IS_IN_SERVING_ENVIRONMENT,
        MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT,
    )

    if _MLFLOW_IS_IN_SERVING_ENVIRONMENT.get() and MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT.defined:
        return float(MLFLOW_SCORING_SERVER_REQUEST_TIMEOUT.get())
    return None


class ZayaGenerator(mlflow.pyfunc.PythonModel):
    def load_context(self, context) -> None:
        import torch
        from tokenizers import Tokenizer

        from zaya_pipeline.model.saved_model import load_model

        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model, self.model_cfg = load_model(context.artifacts["model"], map_location=self.device)
        self.tokenizer = Tokenizer.from_file(context.artifacts["tokenizer"])
        with open(context.artifacts["tokenizer_meta"]) as f:
            meta = json.load(f)
        self.eos_id, self.bos_id = int(meta["eos_id"]), meta.get("bos_id")
        self.caps = _caps(getattr(context, "model_config", None))

    # Annotated as a DataFrame (what MLflow's schema enforcement hands over) so that MLflow takes the logged
    # signature rather than inferring one from the hint; direct calls may pass a list too.
    def predict(self, context, model_input: pd.DataFrame, params: dict[str, Any] | None = None) -> list[str]:
        from zaya_pipeline.model.generate import continue_prompts

        p = {**DEFAULT_PARAMS, **{k: v for k, v in (params or {}).items() if v is not None}}
        unknown = sorted(set(p) - set(DEFAULT_PARAMS))
        if unknown:
            raise ValueError(f"unknown params {unknown}; known: {sorted(DEFAULT_PARAMS)}")
        max_new = int(p["max_new_tokens"])
        if max_new < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new}")
        prompts, check_stop = list(prompts_of(model_input)), None
        if (timeout_s := _served_timeout()) is not None:
            check_caps(self.caps, len(prompts), max_new)
            check_stop = request_guard(timeout_s)
        return continue_prompts(
            self.model,
            self.tokenizer,
            self.eos_id,
            prompts,
            max_new,
            float(p["temperature"]),
            float(p["top_p"]),
            int(p["seed"]),
            self.device,
            self.bos_id,
            check_stop,
        )
