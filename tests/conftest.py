"""Shared test setup: the project's offline environment, and the repo root."""

from __future__ import annotations

from pathlib import Path

import pytest

from zaya_pipeline.utils import set_project_env

set_project_env()

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def repo_root() -> Path:
    return REPO
