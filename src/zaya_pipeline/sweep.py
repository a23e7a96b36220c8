"""Hydra sweeps as MLflow parent and child runs, with a summary table at the end.

``zaya train -m model.moe.num_experts=4,8 train.optim.lr=1e-3,3e-3`` (any Hydra sweeper: the basic one, or
Optuna through ``experiment=optuna_lr``) goes through :class:`SweepCallback`, registered in
``conf/config.yaml`` under ``hydra.callbacks``:

* at the start of the sweep it opens a **parent run** in ``registry.experiment_name`` (named after the sweep
  folder, tagged ``zaya.sweep=parent``, the sweep's overrides as params) and exports its id in
  ``$ZAYA_SWEEP_PARENT_RUN_ID``, where the train stage finds it and tags its own run as a child
  (``mlflow.parentRunId``): the MLflow UI nests the jobs under the sweep;
* after every job it records the job's overrides, status and ``reports/train.json`` (under the job's folder);
* at the end (also after a failed job) it prints the summary table, writes it to ``<sweep dir>/summary.md``
  and ``summary.csv``, logs both to the parent run with the best job's metrics, and closes the parent run
  (FAILED if any job failed).

Only MLflow calls are made here; nothing else of the train stage changes under a sweep.
"""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

from zaya_pipeline.tracking import PARENT_ENV
from zaya_pipeline.utils import get_logger, read_json

KEYS_ENV = "ZAYA_SWEEP_KEYS"  # the swept keys, comma-separated: a job's run name shows only their values
METRICS = ("val_loss", "val_ppl", "val_over_unigram", "tokens_per_s", "steps")  # from reports/train.json
OBJECTIVE = "val_loss"  # lower is better; what "best" means in the summary and for Optuna

log = get_logger("sweep")
_active: SweepCallback | None = None  # the sweep in progress in this process (see finish_active)


@dataclass
class JobResult:
    num: int
    overrides: list[str]
    status: str  # COMPLETED | FAILED
    metrics: dict[str, Any] = field(default_factory=dict)
    run_id: str = ""
    error: str = ""


class SweepCallback(Callback):
    """Hydra callback: one MLflow parent run per multirun, one summary table at its end."""

    def __init__(self) -> None:
        self.parent_run_id = ""
        self.tracking_uri = ""
        self.sweep_dir: Path | None = None
        self.jobs: list[JobResult] = []
        self.finished = False

    # --- Hydra hooks -------------------------------------------------------------------------------------

    def on_multirun_start(self, config, **kwargs: Any) -> None:
        global _active
        from mlflow import MlflowClient
        from omegaconf import OmegaConf

        from zaya_pipeline.config import RegistryConfig
        from zaya_pipeline.tracking import process_tags, setup_mlflow, tracking_uri

        registry = RegistryConfig(**OmegaConf.to_container(config.registry, resolve=True))
        self.sweep_dir = Path(str(config.hydra.sweep.dir))
        self.tracking_uri = tracking_uri(registry)
        experiment_id = setup_mlflow(registry)
        task_overrides = [str(o) for o in config.hydra.overrides.task]
        client = MlflowClient(self.tracking_uri)
        run = client.create_run(
            experiment_id,
            run_name=f"sweep {self.sweep_dir.name}",
            tags={"zaya.sweep": "parent", "zaya.sweep_dir": str(self.sweep_dir.resolve()), **process_tags()},
        )
        self.parent_run_id = run.info.run_id
        client.log_param(self.parent_run_id, "sweep.overrides", " ".join(task_overrides)[:6000])
        client.log_param(self.parent_run_id, "sweep.sweeper", str(config.hydra.sweeper.get("_target_", "")))
        os.environ[PARENT_ENV] = self.parent_run_id
        os.environ[KEYS_ENV] = ",".join(swept_keys(task_overrides, config.hydra.sweeper.get("params")))
        _active = self
        log.info(
            "sweep %s: MLflow parent run %s in %s", self.sweep_dir, self.parent_run_id, self.tracking_uri
        )

    def on_job_end(self, config, job_return, **kwargs: Any) -> None:
        if not self.parent_run_id:  # a single run (Hydra calls this hook for those too)
            return
        from hydra.core.utils import JobStatus

        num = int(config.hydra.job.num)
        overrides = [str(o) for o in (job_return.overrides or [])]
        ok = job_return.status == JobStatus.COMPLETED
        result = JobResult(num, overrides, "COMPLETED" if ok else "FAILED")
        if not ok:
            result.error = str(job_return._return_value).splitlines()[0][:300]
        train_dir, reports = job_paths(Path(str(job_return.hydra_cfg.hydra.runtime.output_dir)))
        report = reports / "train.json"
        if ok and report.is_file():
            train = read_json(report)
            result.metrics = {k: train[k] for k in METRICS if k in train}
        run_json = train_dir / "run.json"
        if run_json.is_file():
            result.run_id = read_json(run_json).get("run_id", "")
        self.jobs.append(result)

    def on_multirun_end(self, config, **kwargs: Any) -> None:
        self.finish()

    # --- the end of a sweep --------------------------------------------------------------------------------

    def finish(self) -> str:
        """Print and log the summary, close the parent run; returns the table. Safe to call twice."""
        global _active
        if self.finished or not self.parent_run_id:
            return ""
        self.finished = True
        _active = None
        os.environ.pop(PARENT_ENV, None)
        os.environ.pop(KEYS_ENV, None)
        from mlflow import MlflowClient

        table = summary_table(self.jobs)
        print(f"\nsweep {self.sweep_dir} ({len(self.jobs)} jobs; MLflow parent run {self.parent_run_id}):")
        print(table)
        assert self.sweep_dir is not None
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        (self.sweep_dir / "summary.md").write_text(table + "\n")
        (self.sweep_dir / "summary.csv").write_text(summary_csv(self.jobs))
        client = MlflowClient(self.tracking_uri)
        for name in ("summary.md", "summary.csv"):
            client.log_artifact(self.parent_run_id, str(self.sweep_dir / name))
        failed = sum(j.status != "COMPLETED" for j in self.jobs)
        client.log_metric(self.parent_run_id, "jobs_completed", len(self.jobs) - failed)
        client.log_metric(self.parent_run_id, "jobs_failed", failed)
        best = best_job(self.jobs)
        if best is not None:
            for key, value in best.metrics.items():
                client.log_metric(self.parent_run_id, f"best_{key}", float(value))
            client.set_tag(self.parent_run_id, "zaya.best_run_id", best.run_id)
            client.set_tag(self.parent_run_id, "zaya.best_overrides", " ".join(best.overrides)[:5000])
        client.set_terminated(self.parent_run_id, "FAILED" if failed else "FINISHED")
        return table


def job_paths(job_dir: Path) -> tuple[Path, Path]:
    """Where a sweep job writes its train outputs and reports: ``<job dir>/train``, ``<job dir>/reports``."""
    return job_dir / "train", job_dir / "reports"


def swept_keys(task_overrides: list[str], sweeper_params: Any = None) -> list[str]:
    """Keys a sweep varies: command-line sweeps (``a=1,2``, ``choice(...)``, ``range(...)``, ...) and the
    sweeper's own ``params`` (experiment presets, Optuna search spaces)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(task_overrides))
    keys = [o.key_or_group for o in parsed if o.is_sweep_override()]
    return keys + [str(k) for k in (sweeper_params or {}) if str(k) not in keys]


def job_run_name(overrides: list[str], num: int) -> str:
    """The MLflow run name of sweep job ``num``: its number and the values of the swept keys (all its
    overrides when they are unknown)."""
    keys = [k for k in os.environ.get(KEYS_ENV, "").split(",") if k]
    shown = [o for o in overrides if o.partition("=")[0] in keys] if keys else overrides
    return f"#{num} " + " ".join(shown or overrides)


def finish_active() -> None:
    """Close the sweep of this process if Hydra did not (it skips ``on_multirun_end`` after a failed job)."""
    if _active is not None:
        _active.finish()


def best_job(jobs: list[JobResult]) -> JobResult | None:
    done = [j for j in jobs if j.status == "COMPLETED" and OBJECTIVE in j.metrics]
    return min(done, key=lambda j: j.metrics[OBJECTIVE]) if done else None


def varying_keys(jobs: list[JobResult]) -> list[str]:
    """Override keys whose value differs between jobs (the swept ones), in first-seen order."""
    values: dict[str, set[str]] = {}
    for job in jobs:
        for o in job.overrides:
            key, _, value = o.partition("=")
            values.setdefault(key, set()).add(value)
    keys = [k for k, v in values.items() if len(v) > 1 or len(jobs) == 1]
    return keys or list(values)


def _rows(jobs: list[JobResult]) -> tuple[list[str], list[list[str]]]:
    keys = varying_keys(jobs)
    best = best_job(jobs)
    header = ["job", *keys, "status", *METRICS, "run_id"]
    rows = []
    for job in sorted(jobs, key=lambda j: j.num):
        given = dict(o.partition("=")[::2] for o in job.overrides)
        metrics = [_fmt(job.metrics.get(m)) for m in METRICS]
        status = job.status + (" (best)" if job is best else "") + (f": {job.error}" if job.error else "")
        rows.append([str(job.num), *(given.get(k, "") for k in keys), status, *metrics, job.run_id[:12]])
    return header, rows


def summary_table(jobs: list[JobResult]) -> str:
    """A Markdown table (aligned, so it also reads as plain text) of the jobs, the best marked."""
    header, rows = _rows(jobs)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    line = lambda cells: "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"
    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def summary_csv(jobs: list[JobResult]) -> str:
    header, rows = _rows(jobs)
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue()


def _fmt(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:.0f}"
    return str(value)
