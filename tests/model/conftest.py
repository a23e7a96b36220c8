from __future__ import annotations

import pytest
from model_cfgs import cca_config, small_config

from zaya_pipeline.config import ModelConfig


@pytest.fixture(params=["gqa", "cca"])
def cfg(request) -> ModelConfig:
    """The small test model, once with each attention type."""
    return small_config() if request.param == "gqa" else cca_config()
