"""End to end on another real documentation set than the embedded default: Debian's python3.11-doc (Sphinx,
530 HTML pages) through the ``docs`` curation profile, with the debug-size tokenizer, model and training,
by `dvc repro` in a temporary copy of the repo. The run a new user makes with their own documentation:
before the profiles and the Resiliparse extractor, curation kept 15 of the 530 pages and tokenize failed.
"""

from __future__ import annotations

import json
import shutil

import pytest

from support.project import BIN, copy_project, run
from zaya_pipeline.data import debian

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None,
        reason="needs apt-get and dpkg-deb (Debian/Ubuntu)",
    ),
]

PACKAGE = "python3.11-doc"
OVERRIDES = (
    "experiment=debug",
    "data/curate=docs",
    f"data.corpus.debian_packages=[{PACKAGE}]",
    "data.corpus.max_docs_per_source=0",  # every page (the debug data config takes 200)
)


def test_python_docs_run_end_to_end_on_the_docs_profile(tmp_path):
    workspace = copy_project(tmp_path / "repo", *OVERRIDES)
    run([str(BIN / "dvc"), "repro"], workspace, timeout=1200)
    reports = workspace / "reports"
    (deb,) = debian.fetch_debs([PACKAGE], "")
    with debian.unpacked_pages(deb) as pages:
        n_pages = len(pages)
    curated = json.loads((reports / "curate.json").read_text())
    assert curated["output_docs"] >= 0.6 * n_pages, (curated["output_docs"], n_pages, curated["steps"])
    metrics = json.loads((reports / "metrics.json").read_text())
    assert metrics["val_loss"] < 0.9 * metrics["unigram_val_nats_per_token"], "the model did not beat unigram"
    assert json.loads((reports / "registry.json").read_text())["model_uri"].startswith("models:/")
