"""Shared test setup: the project's offline environment, and the repo root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from zaya_pipeline.utils import set_project_env

set_project_env()
# CPU machines run the Triton kernels under the interpreter, which must be on before triton is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def repo_root() -> Path:
    return REPO
