"""data/executor=local|slurm|ray: the executors datatrove gets, Slurm submission through a stand-in
``sbatch``, and a whole Slurm run on a stand-in cluster (scripts that run each task here)."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
from test_curate import SHORT, make_cfg, make_corpus, outputs

from zaya_pipeline.data.chain import build_passes, parse_steps
from zaya_pipeline.data.curate import curate
from zaya_pipeline.data.executors import check_executor, make_executor
from zaya_pipeline.errors import ConfigError, DataError

# sbatch: records the script and its arguments, prints a job id; with FAKE_SLURM_RUN=1 it runs every array
# task of the script at once (in order, so dependencies hold), as Slurm would once they are satisfied.
SBATCH = r"""#!/usr/bin/env python3
import os, re, subprocess, sys
log = os.environ["FAKE_SLURM_DIR"]
n = len([f for f in os.listdir(log) if f.endswith(".sh")]) + 1
script = open(sys.argv[-1]).read()
open(f"{log}/{n:03d}.sh", "w").write(script)
open(f"{log}/{n:03d}.args", "w").write(" ".join(sys.argv[1:-1]))
if os.environ.get("FAKE_SLURM_RUN") == "1":
    last = int(re.search(r"#SBATCH --array=0-(\d+)", script).group(1)) if "--array" in script else 0
    for i in range(last + 1):
        env = {**os.environ, "SLURM_ARRAY_TASK_ID": str(i), "SLURM_JOB_ID": str(1000 + n),
               "SLURM_NODELIST": "localhost", "RUN_OFFSET": "0"}
        subprocess.run(["bash", sys.argv[-1]], env=env, check=True, stdout=subprocess.DEVNULL)
print(f"Submitted batch job {1000 + n}")
"""
SRUN = """#!/usr/bin/env bash
while [[ "$1" == -* ]]; do [[ "$1" == -n ]] && shift; shift; done
exec "$@"
"""
SCONTROL = """#!/usr/bin/env bash
[[ "$1 $2" == "show hostnames" ]] && echo "$3"
"""
SQUEUE = """#!/usr/bin/env bash
cat "$FAKE_SLURM_DIR/squeue.out" 2>/dev/null
"""


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch) -> Path:
    bin_dir, log = tmp_path / "fake_bin", tmp_path / "slurm"
    bin_dir.mkdir()
    log.mkdir()
    for name, text in {"sbatch": SBATCH, "srun": SRUN, "scontrol": SCONTROL, "squeue": SQUEUE}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod((bin_dir / name).stat().st_mode | stat.S_IEXEC)
    # the venv's bin too: the job scripts call datatrove's launch_pickled_pipeline and merge_stats
    monkeypatch.setenv(
        "PATH", f"{bin_dir}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    )
    monkeypatch.setenv("FAKE_SLURM_DIR", str(log))
    return log


def slurm_cfg(tmp_path: Path, *overrides: str):
    return make_cfg(
        tmp_path,
        "data/executor=slurm",
        "data.executor.slurm.partition=cpu",
        "data.executor.slurm.time=01:30:00",
        "data.executor.slurm.mem_per_cpu_gb=4",
        "data.executor.slurm.qos=low",
        "+data.executor.slurm.sbatch_args.account=proj42",
        "data.curate.tasks=2",
        *SHORT[1:],  # the short chain; workers are Slurm's here
        *overrides,
    )


def submitted(log: Path) -> list[tuple[str, str]]:
    return [(p.read_text(), p.with_suffix(".args").read_text()) for p in sorted(log.glob("*.sh"))]


def test_slurm_submits_one_array_per_pass_chained_by_dependencies(tmp_path, fake_slurm):
    make_corpus(tmp_path / "raw")
    result = curate(slurm_cfg(tmp_path, "data.executor.workers=3", "data.executor.slurm.wait=false"))
    jobs = submitted(fake_slurm)
    runs = [(s, a) for s, a in jobs if "launch_pickled_pipeline" in s]
    passes = ["00_pass_0", "01_exact_dedup_find", "02_pass_1", "03_minhash_dedup_buckets"]
    passes += ["04_minhash_dedup_cluster", "05_pass_2", "99_finish"]
    assert [s.split("--job-name=zaya-curate-")[1].split("\n")[0] for s, _ in runs] == passes
    tasks = [2, 1, 2, 2, 1, 2, 1]
    for (script, _), name, n in zip(runs, passes, tasks, strict=True):
        for line in ("partition=cpu", "time=01:30:00", "mem-per-cpu=4G", "cpus-per-task=1", "qos=low"):
            assert f"#SBATCH --{line}\n" in script, (name, line)
        assert "#SBATCH --account=proj42\n" in script
        assert f"#SBATCH --array=0-{n - 1}%3\n" in script, "at most data.executor.workers tasks at once"
        assert f"launch_pickled_pipeline {tmp_path}/logs/curate/{name}/executor.pik" in script
    job_id = {
        name: str(1000 + i + 1)
        for i, (s, _) in enumerate(jobs)
        for name in passes
        if f"-{name}\n" in s and "launch_pickled_pipeline" in s
    }
    for before, after in zip(passes, passes[1:], strict=False):
        args = next(a for s, a in runs if f"-{after}\n" in s)
        assert f"--dependency=afterok:{job_id[before]}" in args, (after, args)
    assert len(jobs) == 2 * len(passes), "and one merge_stats job per pass"
    assert result["slurm_jobs"][-1] == job_id["99_finish"]
    assert not (tmp_path / "curated").exists() and json.loads((tmp_path / "logs/curate/run.json").read_text())


def test_slurm_wait_fails_when_the_jobs_end_without_the_final_step(tmp_path, fake_slurm):
    make_corpus(tmp_path / "raw")
    (fake_slurm / "squeue.out").write_text("")  # nothing queued, and no completion marker
    with pytest.raises(DataError, match="left the queue and the final step has not run"):
        curate(slurm_cfg(tmp_path, "data.executor.slurm.poll_seconds=0"))
    (fake_slurm / "squeue.out").write_text("1013 PENDING DependencyNeverSatisfied\n")
    with pytest.raises(DataError, match="1013 PENDING DependencyNeverSatisfied can never start"):
        curate(slurm_cfg(tmp_path, "data.executor.slurm.poll_seconds=0"))


@pytest.mark.slow
def test_a_slurm_run_on_a_stand_in_cluster_writes_what_a_local_run_writes(tmp_path, fake_slurm, monkeypatch):
    """Every task in its own process from the pickled executor, as on a cluster; ~20 processes."""
    local = tmp_path / "local"
    make_corpus(local / "raw")
    curate(make_cfg(local, "data.curate.tasks=2", *SHORT))
    cluster = tmp_path / "cluster"
    make_corpus(cluster / "raw")
    monkeypatch.setenv("FAKE_SLURM_RUN", "1")
    summary = curate(slurm_cfg(cluster))
    assert outputs(cluster) == outputs(local)
    report = json.loads((cluster / "reports" / "curate.json").read_text())
    assert report == json.loads((local / "reports" / "curate.json").read_text()) | {
        "seconds": report["seconds"]
    }
    assert (
        summary["output_docs"] == report["output_docs"]
        and (cluster / "reports" / "data_report.html").is_file()
    )


def test_executor_objects_are_built_from_config(tmp_path):
    from datatrove.executor import LocalPipelineExecutor, RayPipelineExecutor, SlurmPipelineExecutor

    cfg = slurm_cfg(tmp_path, "data.executor.workers=8")
    chain = parse_steps(cfg.data.curate.steps)
    p = build_passes(chain, 4, tmp_path / "raw", tmp_path / "w", tmp_path / "c", tmp_path / "r")[0]
    first = make_executor(cfg.data.executor, p.pipeline, 4, tmp_path / "logs" / "a", "a")
    second = make_executor(cfg.data.executor, p.pipeline, 4, tmp_path / "logs" / "b", "b", depends=first)
    assert isinstance(second, SlurmPipelineExecutor) and second.depends is first
    assert (second.partition, second.time, second.mem_per_cpu_gb, second.qos) == ("cpu", "01:30:00", 4, "low")
    assert (second.tasks, second.workers, second.job_name) == (4, 8, "zaya-curate-b")
    assert second.skip_completed and second._sbatch_args == {"account": "proj42"}

    ray = make_cfg(tmp_path, "data/executor=ray", "data.executor.ray.cpus_per_task=2").data.executor
    r = make_executor(ray, p.pipeline, 4, tmp_path / "logs" / "r", "r")
    assert isinstance(r, RayPipelineExecutor)
    assert (r.tasks, r.workers, r.cpus_per_task, r.mem_per_cpu_gb, r.skip_completed) == (4, 4, 2, 2.0, True)

    local = make_cfg(tmp_path, "data.executor.workers=2").data.executor
    loc = make_executor(local, p.pipeline, 4, tmp_path / "logs" / "l", "l")
    assert isinstance(loc, LocalPipelineExecutor) and (loc.tasks, loc.workers, loc.skip_completed) == (
        4,
        2,
        True,
    )
    assert make_executor(local, p.pipeline, 1, tmp_path / "logs" / "l1", "l1").workers == 1


def test_ray_without_ray_installed_and_slurm_without_partition_are_config_errors(tmp_path, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else find_spec(name, *a)
    )
    ray = make_cfg(tmp_path, "data/executor=ray").data.executor
    with pytest.raises(ConfigError, match=r"data\.executor\.type=ray needs the `ray` package.*pip install"):
        check_executor(ray)
    with pytest.raises(ConfigError, match=r"data\.executor\.slurm\.partition is required"):
        check_executor(make_cfg(tmp_path, "data/executor=slurm").data.executor)
    with pytest.raises(ConfigError, match=r"data\.executor\.type='spark'"):
        check_executor(make_cfg(tmp_path, "data.executor.type=spark").data.executor)
