"""The train stage's entry module stays a short plan -> build -> fit -> write sequence of small functions."""

from __future__ import annotations

import ast
from pathlib import Path

import zaya_pipeline.train.run as run

MAX_LINES = 60


def test_every_function_of_train_run_is_shorter_than_60_lines():
    tree = ast.parse(Path(run.__file__).read_text())
    functions = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]
    lengths = {f.name: f.end_lineno - f.lineno + 1 for f in functions}
    assert "train" in lengths and "plan" in lengths
    too_long = {name: n for name, n in lengths.items() if n >= MAX_LINES}
    assert not too_long, f"functions of {run.__file__} with {MAX_LINES} lines or more: {too_long}"
