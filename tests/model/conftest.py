from __future__ import annotations

import pytest
from model_cfgs import small_config

from zaya_pipeline.config import ModelConfig


@pytest.fixture
def cfg() -> ModelConfig:
    return small_config()
