from __future__ import annotations

from pathlib import Path

import pytest
from token_shards import write_shards


@pytest.fixture(scope="session")
def token_dir(tmp_path_factory) -> Path:
    return write_shards(tmp_path_factory.mktemp("tokens"))
