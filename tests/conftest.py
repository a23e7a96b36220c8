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


# `make test` runs two pytest workers, each taking whole files (pytest-xdist, --dist loadfile) in collection
# order (--no-loadscope-reorder). The files that take longest go first, so that no two-minute file starts
# last while the other worker idles. Measured on 2 cores (docs/benchmarks.md, "Test suite"): seconds alone.
LONGEST_FIRST = (
    "test_e2e.py",  # ~330 s
    "test_reliability.py",  # ~310 s, its pipeline included
    "test_e2e_docs.py",  # ~125 s
    "data/test_profiles.py",  # ~125 s
    "train/test_resume_cli.py",  # ~105 s
    "test_continued_pretraining.py",  # ~80 s
    "kernels/test_static_report.py",  # ~55 s
    "test_sweeps.py",  # ~50 s
    "distributed/test_checkpoint.py",  # ~40 s
    "train/test_torchrun.py",  # ~37 s
    "train/test_train_parallel.py",  # ~36 s
    "data/test_ray_executor.py",  # ~31 s
    "data/test_executors.py",  # ~31 s
)


def pytest_collection_modifyitems(config, items) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def key(item) -> int:
        rel = Path(str(item.fspath)).relative_to(REPO / "tests").as_posix()
        return rank.get(rel, len(rank))

    items.sort(key=key)  # stable: the order within a file, and of the other files, is kept
