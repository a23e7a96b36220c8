"""data/executor=ray on a real Ray: curate starts a private Ray on 127.0.0.1 (2 CPUs), runs every pass as Ray
tasks and stops it; the outputs are byte-identical to a local run's. A failed Ray task stops the run."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import re
from pathlib import Path

import pytest
from test_curate import make_cfg, make_corpus

from zaya_pipeline.data.curate import curate
from zaya_pipeline.data.executors import check_executor
from zaya_pipeline.errors import ConfigError, DataError

# `make setup` installs the `ray` extra, so CI runs these; the guard is for a venv made without it. Not
# pytest.importorskip: importing ray here would fix its network mode before curate asks for 127.0.0.1.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="the `ray` extra is missing")

# The default chain (every step a default run has) on 2 shards, so each pass but the dedup merges has 2 tasks.
CHAIN = [
    "data.curate.tasks=2",
    "data.curate.steps.url.use_integrated_lists=false",  # 4.5M domains to load per task: test_filters
    "data.curate.steps.minhash_dedup.num_buckets=2",
]
RAY = ["data/executor=ray", "data.executor.ray.num_cpus=2"]


def digests(tmp: Path) -> dict[str, str]:
    """sha256 of every output a run writes that must not depend on where it ran.

    Left out, because they legitimately differ between two runs: ``reports/curate.json``'s ``seconds`` (wall
    time; the rest of that file is compared), and under ``paths.logs`` datatrove's ``executor.json`` (the
    executor's class and settings), the task logs (timestamps, process ids) and the ``time_stats`` of the
    per-task stats (their counts are compared), and ``run.json`` (start time)."""
    out = {}
    for folder in ("curated", "removed", "reports"):
        for path in sorted((tmp / folder).rglob("*")):
            if path.is_file() and path.name != "curate.json":
                out[path.relative_to(tmp).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    report = json.loads((tmp / "reports" / "curate.json").read_text())
    del report["seconds"]
    out["reports/curate.json without seconds"] = sha_of_json(report)
    for path in sorted((tmp / "logs" / "curate").glob("*/stats/*.json")):
        counts = [{"name": s["name"], "stats": s["stats"]} for s in json.loads(path.read_text())]
        out[f"{path.relative_to(tmp).as_posix()} counts"] = sha_of_json(counts)
    return out


def sha_of_json(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


@pytest.fixture
def zaya_log(caplog):
    """The curate logger's records (the CLI's logging setup stops them from reaching the root logger)."""
    logger = logging.getLogger("zaya.curate")
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO, logger="zaya.curate")
    yield caplog
    logger.removeHandler(caplog.handler)


@pytest.mark.slow
def test_a_ray_run_writes_the_bytes_a_local_run_writes(tmp_path, zaya_log):
    local, on_ray = tmp_path / "local", tmp_path / "ray"
    make_corpus(local / "raw")
    make_corpus(on_ray / "raw")
    # one local worker: the tasks run in this process (a process pool costs seconds per pass on 2 cores)
    curate(make_cfg(local, *CHAIN, "data.executor.workers=1"))
    summary = curate(make_cfg(on_ray, *CHAIN, *RAY))

    expected = digests(local)
    assert "curated/00001.jsonl.gz" in expected and "removed/minhash_dedup/00001.jsonl.gz" in expected
    assert len([k for k in expected if k.endswith(" counts")]) == 10, "2 + 1 + 2 + 2 + 1 + 2 tasks' stats"
    assert digests(on_ray) == expected
    report = json.loads((local / "reports" / "curate.json").read_text())
    assert summary["output_docs"] == report["output_docs"] > 0

    # a set: the record comes twice where the logger also propagates to caplog's root handler
    started = {r.getMessage() for r in zaya_log.records if "started a private Ray" in r.getMessage()}
    assert len(started) == 1 and started.pop().startswith("curate: started a private Ray on 127.0.0.1 (2 CPU")
    # every pass ran on datatrove's Ray executor (settings only it has); no Ray left running in this process
    for saved in (on_ray / "logs" / "curate").glob("*/executor.json"):
        assert {"nodes_per_task", "tasks_per_job"} <= json.loads(saved.read_text()).keys(), saved
    import ray

    assert not ray.is_initialized()


@pytest.mark.slow
def test_a_failed_ray_task_stops_the_run_and_names_the_pass(tmp_path):
    """datatrove's Ray executor only warns when a task fails; curate must stop at that pass, as locally."""
    make_corpus(tmp_path / "raw")
    (tmp_path / "raw" / "b.jsonl.gz").write_bytes(b"not a gzip file")  # the shard of task 1 of 2
    with pytest.raises(DataError, match=r"curate pass 00_pass_0 failed: task\(s\) 1 of 2 did not complete"):
        curate(make_cfg(tmp_path, *CHAIN, *RAY))
    logs = tmp_path / "logs" / "curate"
    assert [p.name for p in (logs / "00_pass_0" / "completions").iterdir()] == ["00000"]
    assert "BadGzipFile" in (logs / "00_pass_0" / "logs" / "task_00001.log").read_text()
    assert sorted(p.name for p in logs.iterdir()) == ["00_pass_0", "run.json"], "no later pass ran"
    assert not (tmp_path / "curated").exists()
    import ray

    assert not ray.is_initialized()


@pytest.mark.parametrize(
    ("override", "message"),
    [("num_cpus=-1", "a number of CPUs, or 0 for all"), ("object_store_gb=0.05", r"at least 0\.1 \(GiB\)")],
)
def test_private_ray_settings_are_checked_before_anything_runs(tmp_path, override, message):
    with pytest.raises(ConfigError, match=rf"^data\.executor\.ray\.{re.escape(override)}: {message}$"):
        check_executor(make_cfg(tmp_path, *RAY, f"data.executor.ray.{override}").data.executor)
