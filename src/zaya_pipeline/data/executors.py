"""Where the curate passes run: ``data.executor.type`` = ``local`` | ``slurm`` | ``ray`` (datatrove).

* local: ``LocalExecutor`` (datatrove's ``LocalPipelineExecutor``, its workers dying with the stage),
  ``workers`` processes, one pass after the other in this process.
* ray: ``RayPipelineExecutor``; blocking like local. ``data.executor.ray.address`` joins a running Ray;
  without one a private Ray starts on 127.0.0.1 for the run and is stopped after it (``ray_session``).
* slurm: ``SlurmPipelineExecutor``, one job array per pass, each depending on the one before, and a last job
  (one task) that checks the accounting and writes the report. Submission returns at once; with
  ``data.executor.slurm.wait`` the caller polls ``squeue`` until that last job has marked itself completed.

Every executor keeps datatrove's completion markers (``<logs>/<pass>/completions/<rank>``) and skips the
tasks that have one, which is how a rerun after a crash resumes (``curate.py`` decides when markers are kept).
A blocking pass is done when every task has its marker: datatrove's Ray executor only logs a warning when a
task fails, so ``run_blocking`` checks the markers and stops the run there.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from datatrove.executor import LocalPipelineExecutor

from zaya_pipeline.config import ExecutorConfig, RayExecutorConfig
from zaya_pipeline.data.datatrove_parts import run_explained
from zaya_pipeline.errors import ConfigError, DataError
from zaya_pipeline.progress import Progress
from zaya_pipeline.utils import get_logger

log = get_logger("curate")
TYPES = ("local", "slurm", "ray")


def check_executor(e: ExecutorConfig) -> None:
    """Config errors before anything runs: the type, workers, a Slurm partition, an installed Ray."""
    if e.type not in TYPES:
        raise ConfigError(f"data.executor.type={e.type!r}: one of {', '.join(TYPES)} (data/executor=...)")
    if e.workers == 0 or e.workers < -1:
        raise ConfigError(f"data.executor.workers={e.workers}: a number of tasks >= 1, or -1 for no limit")
    if e.type == "slurm" and not e.slurm.partition:
        raise ConfigError("data.executor.slurm.partition is required with data/executor=slurm")
    if e.type == "ray" and importlib.util.find_spec("ray") is None:
        raise ConfigError(
            "data.executor.type=ray needs the `ray` package: `make setup` installs it (the `ray` extra: "
            "`pip install -e '.[ray]'`; on a cluster, on every node), or use data/executor=local"
        )
    if e.type == "ray" and e.ray.num_cpus < 0:
        raise ConfigError(f"data.executor.ray.num_cpus={e.ray.num_cpus}: a number of CPUs, or 0 for all")
    if e.type == "ray" and e.ray.object_store_gb < 0.1:
        raise ConfigError(f"data.executor.ray.object_store_gb={e.ray.object_store_gb}: at least 0.1 (GiB)")


def die_with_parent() -> None:
    """Linux: have the kernel SIGKILL this process when its parent dies (``PR_SET_PDEATHSIG``); elsewhere a
    no-op. For pool workers, which otherwise outlive a killed stage, blocked on their task queue."""
    import ctypes
    import signal
    import sys

    if sys.platform != "linux":
        return
    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        log.warning("prctl(PR_SET_PDEATHSIG) failed (errno %d): a killed stage may leave workers", errno)
    if os.getppid() == 1:  # the parent died before prctl: nobody is left to signal us
        os._exit(1)


_in_local_run = False  # set while a LocalExecutor runs: processes forked then die with this one


def _after_fork_in_child() -> None:
    if _in_local_run:
        die_with_parent()


os.register_at_fork(after_in_child=_after_fork_in_child)


class LocalExecutor(LocalPipelineExecutor):
    """datatrove's ``LocalPipelineExecutor`` whose helper processes die with the stage. A ``kill -9`` of
    ``zaya curate`` / ``zaya tokenize`` used to leave datatrove's ``multiprocess.Manager`` server (forked
    while the pass runs) and pool workers behind as orphans; now the manager and any other process forked
    during the run get ``PR_SET_PDEATHSIG``, as do the pool workers (children of the forkserver, which
    exits with the stage). A task run in the stage's own process leaves that process alone."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.stage_pid = os.getpid()

    def run(self):
        global _in_local_run
        _in_local_run = True
        try:
            return super().run()
        finally:
            _in_local_run = False

    def _launch_run_for_rank(self, rank: int, ranks_q, completed=None, completed_lock=None):
        if os.getpid() != self.stage_pid:
            die_with_parent()
        return super()._launch_run_for_rank(rank, ranks_q, completed, completed_lock)


def make_executor(e: ExecutorConfig, pipeline: list, tasks: int, logging_dir: Path, name: str, depends=None):
    """The datatrove executor of one pass; ``depends`` chains Slurm passes."""
    common = {"tasks": tasks, "logging_dir": str(logging_dir), "skip_completed": True}
    if e.type == "local":
        return LocalExecutor(pipeline, workers=tasks if e.workers == -1 else min(e.workers, tasks), **common)
    if e.type == "ray":
        from datatrove.executor import RayPipelineExecutor

        r = e.ray
        return RayPipelineExecutor(
            pipeline,
            workers=e.workers,
            cpus_per_task=r.cpus_per_task,
            mem_per_cpu_gb=r.mem_per_cpu_gb,
            **common,
        )
    from datatrove.executor import SlurmPipelineExecutor

    s = e.slurm
    return SlurmPipelineExecutor(
        pipeline,
        time=s.time,
        partition=s.partition,
        cpus_per_task=s.cpus_per_task,
        mem_per_cpu_gb=s.mem_per_cpu_gb,
        workers=e.workers,
        job_name=f"{s.job_name}-{name}",
        qos=s.qos,
        env_command=s.env_command or None,
        sbatch_args=dict(s.sbatch_args),
        max_array_size=s.max_array_size,
        depends=depends,
        **common,
    )


@contextmanager
def ray_session(r: RayExecutorConfig) -> Iterator[None]:
    """Ray for one run: join ``data.executor.ray.address``, or start a private Ray on 127.0.0.1 (``num_cpus``,
    ``object_store_gb``, no dashboard); disconnect (a private one: stop it) afterwards. A Ray this process
    has already joined is used as it is and left running."""
    if not r.address:
        # Given 127.0.0.1, ray.init still binds every server to the machine's routable address, unless Ray's
        # cluster mode is off; Ray reads this switch when it is first imported (workers inherit it).
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    if ray.is_initialized():
        yield
        return
    if r.address:
        ray.init(address=r.address)
        log.info("curate: joined the Ray cluster at %s", r.address)
    else:
        ctx = ray.init(
            address="local",  # never RAY_ADDRESS or a cluster found on this machine
            num_cpus=r.num_cpus or None,
            object_store_memory=int(r.object_store_gb * 2**30),
            include_dashboard=False,
        )
        log.info(
            "curate: started a private Ray on %s (%d CPUs; logs under %s)",
            ctx.address_info["node_ip_address"],
            ray.cluster_resources().get("CPU", 0),
            ctx.address_info["session_dir"],
        )
    try:
        yield
    finally:
        ray.shutdown()


def run_blocking(e: ExecutorConfig, passes: list, logs: Path) -> None:
    """Run the passes one after the other (local, ray), logging each one's time; stop at a pass that left a
    task without its completion marker."""
    with (
        ray_session(e.ray) if e.type == "ray" else nullcontext(),
        Progress(len(passes), "curate", "pass", logger=log, every_s=0) as bar,  # a line per pass
    ):
        for i, p in enumerate(passes, 1):
            t0 = time.monotonic()
            log.info("curate pass %d/%d %s: %d task(s) ...", i, len(passes), p.name, p.tasks)
            executor = make_executor(e, p.pipeline, p.tasks, logs / p.name, p.name)
            run_explained(executor, f"curate pass {p.name}", logs / p.name)
            failed = executor.get_incomplete_ranks(range(p.tasks))
            if failed:
                tasks = ", ".join(map(str, failed))
                raise DataError(
                    f"curate pass {p.name} failed: task(s) {tasks} of {p.tasks} did not complete (task logs: "
                    f"{logs / p.name / 'logs'}); fix it and rerun `zaya curate`: completed tasks are skipped"
                )
            bar.update(1, last=p.name, took=f"{time.monotonic() - t0:.1f}s")


def submit_slurm(e: ExecutorConfig, passes: list, final_step: Any, logs: Path, final_name: str) -> list:
    """Submit every pass and the final step as dependent job arrays; returns the executors (last = final)."""
    executors, before = [], None
    for p in passes:
        before = make_executor(e, p.pipeline, p.tasks, logs / p.name, p.name, depends=before)
        executors.append(before)
    final = make_executor(e, [final_step], 1, logs / final_name, final_name, depends=before)
    executors.append(final)
    final.run()  # launches its dependencies first; a pass whose tasks all completed launches nothing
    return executors


def wait_slurm(executors: list, done: Path, poll_seconds: float) -> None:
    """Block until ``done`` exists; fail when the jobs left the queue without it or can never start."""
    ids = [str(x.job_id) for x in executors if x.job_id not in (None, -1, "-1")]
    log.info("curate: waiting for Slurm jobs %s (final marker %s)", ",".join(ids), done)
    while not done.exists():
        out = subprocess.run(
            ["squeue", "-h", "-j", ",".join(ids), "-o", "%i %T %r"], capture_output=True, text=True
        ).stdout
        if done.exists():
            break
        stuck = [line for line in out.splitlines() if "DependencyNeverSatisfied" in line]
        if stuck or not out.strip():
            what = f"jobs {', '.join(stuck)} can never start" if stuck else "the jobs left the queue"
            raise DataError(
                f"curate on Slurm: {what} and the final step has not run: a pass failed. See the logs under "
                f"{done.parent.parent} (<pass>/logs, <pass>/slurm_logs); fix it and rerun `zaya curate`: "
                "completed tasks are skipped"
            )
        time.sleep(poll_seconds)
