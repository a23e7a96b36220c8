"""``ZayaGenerator``: the registered model as an MLflow pyfunc that turns prompts into continuations.

Artifacts it reads (logged by ``register``): ``model`` (model.pt), ``tokenizer`` (tokenizer.json) and
``tokenizer_meta`` (the tokenizer stage's meta.json, for the EOS id). ``predict`` takes a DataFrame with a
``prompt`` column or a list of strings and returns one continuation string per prompt; params (all optional):
``max_new_tokens`` (32), ``temperature`` (0 = greedy), ``top_p`` (1.0), ``seed`` (0, for sampling).

Each prompt is preceded by EOS, as every training document was (EOS ends the previous one), and decoded on
its own: the model has no padding mask, so prompts of different lengths are not batched.
"""

from __future__ import annotations

import json
from typing import Any

import mlflow.pyfunc
import numpy as np
import pandas as pd

DEFAULT_PARAMS: dict[str, Any] = {"max_new_tokens": 32, "temperature": 0.0, "top_p": 1.0, "seed": 0}
PARAM_TYPES = {"max_new_tokens": "long", "temperature": "double", "top_p": "double", "seed": "long"}
PROMPT_COLUMN = "prompt"


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
        return continue_prompts(
            self.model,
            self.tokenizer,
            self.eos_id,
            list(prompts_of(model_input)),
            max_new,
            float(p["temperature"]),
            float(p["top_p"]),
            int(p["seed"]),
            self.device,
            self.bos_id,
        )
