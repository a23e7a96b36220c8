"""``zaya curate``: the curation chain from ``paths.raw`` to ``paths.curated``, on the configured executor.

The chain is ``data.curate.steps`` (``chain.py`` parses it and builds the datatrove passes); the passes run
on ``data.executor`` (``executors.py``: local processes, Slurm job arrays or Ray). Intermediate shards and
the outputs being built live in ``data.executor.work_dir`` (default ``<paths.curated>.work``); the last step
(``finish``) checks the accounting, refuses a kept corpus too little to train on (``trainable.py``: too few
documents, an empty train/val split, less than one training batch; the old outputs stay), moves the outputs
into ``paths.curated`` / ``paths.removed`` and writes ``reports/curate.json`` and the data report
(``report.py``; also logged to MLflow).

Accounting: every input document is either written to ``paths.curated`` or to
``paths.removed/<step id>/`` with ``curate_step`` and ``filter_reason`` in its metadata. ``finish`` checks
``input = kept + Σ dropped`` twice: on datatrove's stats (per step) and on the files themselves.

Resume: datatrove marks each completed task under ``paths.logs/curate/<pass>/completions``. A run records
a fingerprint of ``data.curate``, the paths and the input files in ``paths.logs/curate/run.json``; a rerun
with the same fingerprint after a run that did not finish keeps the markers and the work folder, so every
completed task is skipped. Anything else (other params, other inputs, a finished run) starts afresh.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from datatrove.pipeline.base import PipelineStep

from zaya_pipeline.config import ZayaConfig
from zaya_pipeline.data.chain import READ, STEP_TYPES, WRITE, build_passes, parse_steps
from zaya_pipeline.errors import ConfigError, DataError
from zaya_pipeline.utils import get_logger, read_json, remove_outputs, set_project_env, write_json

log = get_logger("curate")
FINISH = "99_finish"  # the logging folder of the final step


@dataclass(frozen=True)
class Layout:
    """Every folder a curate run touches."""

    raw: Path
    curated: Path
    removed: Path
    logs: Path  # datatrove logs, stats and completion markers, one folder per pass; run.json
    work: Path  # intermediate shards, dedup signatures, and the outputs being built (curated/, removed/)
    reports: Path

    @classmethod
    def of(cls, cfg: ZayaConfig) -> Layout:
        p = cfg.paths
        work = cfg.data.executor.work_dir or f"{p.curated}.work"
        return cls(
            Path(p.raw),
            Path(p.curated),
            Path(p.removed),
            Path(p.logs) / "curate",
            Path(work),
            Path(p.reports),
        )

    @property
    def state(self) -> Path:
        return self.logs / "run.json"


@dataclass(frozen=True)
class PassInfo:
    """What ``finish`` needs to know of a pass (not its pipeline objects)."""

    name: str
    tasks: int
    accounted: dict[int, tuple[str, str]]


def merged_stats(pass_logs: Path) -> list[dict]:
    """datatrove's per-task stats of one pass, summed (``stats.json`` lacks tasks a resumed run skipped)."""
    from datatrove.utils.stats import PipelineStats

    total = PipelineStats()
    for path in sorted((pass_logs / "stats").glob("*.json")):
        with open(path) as f:
            total += PipelineStats.from_json(json.load(f))
    return json.loads(total.to_json())


def _count(stats: dict, key: str) -> int:
    value = stats.get(key, 0)
    return int(value["total"] if isinstance(value, dict) else value)


def summarize(passes: list[PassInfo], stats: dict[str, list[dict]]) -> dict:
    """Per-step counts and drop reasons from datatrove's stats, and the accounting check."""
    steps, input_docs, output_docs = [], None, 0
    for p in passes:
        for index, (step_id, type_) in p.accounted.items():
            s = stats[p.name][index]["stats"]
            if step_id == READ:
                input_docs = _count(s, "documents") if input_docs is None else input_docs
            elif step_id == WRITE:
                output_docs = _count(s, "total")
            else:
                reasons = {
                    k.removeprefix("dropped_"): _count(s, k) for k in sorted(s) if k.startswith("dropped_")
                }
                dropped = _count(s, "dropped")
                if dropped and not reasons:
                    reasons = {STEP_TYPES[type_].reason or "unnamed": dropped}
                steps.append(
                    {
                        "name": step_id,
                        "type": type_,
                        "docs_in": _count(s, "total"),
                        "kept": _count(s, "forwarded"),
                        "dropped": dropped,
                        "edited": _count(s, "edited"),
                        "chars_removed": _count(s, "chars_removed"),
                        "reasons": reasons,
                    }
                )
    dropped = sum(s["dropped"] for s in steps)
    if input_docs != output_docs + dropped:
        raise RuntimeError(
            f"curate accounting broken: {input_docs} in != {output_docs} out + {dropped} dropped"
        )
    return {
        "input_docs": input_docs,
        "output_docs": output_docs,
        "dropped_docs": dropped,
        "steps": steps,
        "dropped_by_step": {s["name"]: s["dropped"] for s in steps},
    }


@dataclass
class Totals:
    """What a folder of ``*.jsonl.gz`` records holds: counted from the files, independently of datatrove."""

    docs: int = 0
    words: int = 0  # whitespace-separated
    chars: int = 0
    by_source: Counter = field(default_factory=Counter)  # metadata.source → documents
    by_step: Counter = field(default_factory=Counter)  # (metadata.source, metadata.curate_step) → documents


def scan(folder: Path) -> Totals:
    """Count the records of every ``*.jsonl.gz`` under ``folder``."""
    t = Totals()
    for path in sorted(folder.rglob("*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                rec = json.loads(line)
                meta = rec.get("metadata") or {}
                source = str(meta.get("source", ""))
                t.docs += 1
                t.words += len(rec["text"].split())
                t.chars += len(rec["text"])
                t.by_source[source] += 1
                if "curate_step" in meta:
                    t.by_step[source, meta["curate_step"]] += 1
    return t


def file_accounting(summary: dict, raw: Path, curated: Path, removed: Path) -> dict:
    """Check datatrove's counts against the files and add word/char totals and a per-source breakdown."""
    t_in, t_out, t_rem = scan(raw), scan(curated), scan(removed)
    by_step_files = Counter()
    for (_, step), n in t_rem.by_step.items():
        by_step_files[step] += n
    if (
        t_in.docs != summary["input_docs"]
        or t_out.docs != summary["output_docs"]
        or t_in.docs != t_out.docs + t_rem.docs
    ):
        raise RuntimeError(
            f"curate files disagree: raw {t_in.docs}, curated {t_out.docs}, removed {t_rem.docs}; "
            f"datatrove counted {summary['input_docs']} in, {summary['output_docs']} out"
        )
    if dict(by_step_files) != {k: v for k, v in summary["dropped_by_step"].items() if v}:
        raise RuntimeError(f"removed files per step {dict(by_step_files)} != {summary['dropped_by_step']}")
    by_source = {
        src: {
            "input_docs": n,
            "output_docs": t_out.by_source[src],
            "dropped": {step: m for (s, step), m in sorted(t_rem.by_step.items()) if s == src},
        }
        for src, n in sorted(t_in.by_source.items())
    }
    return summary | {
        "words_in": t_in.words,
        "words_out": t_out.words,
        "chars_in": t_in.chars,
        "chars_out": t_out.chars,
        "by_source": by_source,
    }


def _replace_dir(src: Path, dst: Path) -> None:
    """Move ``src`` to ``dst``; an output that is a symlink (to another disk) is written through."""
    src.mkdir(parents=True, exist_ok=True)  # a step that dropped nothing never created its folder
    dst = dst.resolve() if dst.is_symlink() else dst
    if dst.exists():
        shutil.rmtree(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(src, dst)  # a rename on one disk, a copy to another


def finish(cfg: ZayaConfig, passes: list[PassInfo]) -> dict:
    """Check the accounting and that what was kept is enough to train on, move the outputs into place,
    write curate.json and the data report."""
    from zaya_pipeline.data.datatrove_parts import zero_gzip_mtime
    from zaya_pipeline.data.report import log_report_to_mlflow, write_report
    from zaya_pipeline.data.trainable import check_trainable

    lay = Layout.of(cfg)
    staged_curated, staged_removed = lay.work / "curated", lay.work / "removed"
    stats = {p.name: merged_stats(lay.logs / p.name) for p in passes if p.accounted}
    summary = summarize(passes, stats)
    for path in [*staged_curated.rglob("*.jsonl.gz"), *staged_removed.rglob("*.jsonl.gz")]:
        zero_gzip_mtime(path)  # identical runs give identical bytes (stable DVC hashes)
    staged_curated.mkdir(parents=True, exist_ok=True)
    staged_removed.mkdir(parents=True, exist_ok=True)
    summary = file_accounting(summary, lay.raw, staged_curated, staged_removed)
    check_trainable(cfg, summary, staged_curated)  # before the swap: refused, the old outputs stay
    _replace_dir(staged_curated, lay.curated)
    _replace_dir(staged_removed, lay.removed)
    state = read_json(lay.state)
    summary["seconds"] = round(time.time() - state["started"], 1)
    write_json(lay.reports / "curate.json", summary)
    paths = write_report(summary, lay.curated, lay.removed, lay.reports)
    log_report_to_mlflow(paths, cfg.registry)
    write_json(lay.state, state | {"finished": True})
    shutil.rmtree(lay.work, ignore_errors=True)
    for s in summary["steps"]:
        log.info(
            "curate %-17s in %6d  kept %6d  dropped %6d  edited %6d  %s",
            s["name"], s["docs_in"], s["kept"], s["dropped"], s["edited"], s["reasons"],
        )  # fmt: skip
    return summary


class FinishStep(PipelineStep):
    """``finish`` as a pipeline step: the final job of a Slurm run (local and Ray runs call ``finish``)."""

    type = "🗂 - INTERNAL"
    name = "curate: accounting, outputs and report"

    def __init__(self, cfg: ZayaConfig, passes: list[PassInfo]):
        super().__init__()
        self.cfg, self.passes = cfg, passes

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        finish(self.cfg, self.passes)
        yield from ()


def fingerprint(cfg: ZayaConfig, lay: Layout) -> str:
    """What a resumed run must share with the crashed one: data.curate (except min_kept_docs, which only
    ``finish`` reads: a run refused for keeping too little resumes under a lower threshold), the paths and the
    input files."""
    inputs = [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(lay.raw.glob("*.jsonl.gz"))]
    curate = {k: v for k, v in asdict(cfg.data.curate).items() if k != "min_kept_docs"}
    key = {
        "curate": curate,
        "layout": [str(x) for x in asdict(lay).values()],
        "inputs": inputs,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _start(cfg: ZayaConfig, lay: Layout) -> bool:
    """Resume (keep completion markers and work) or start afresh; returns True when resuming."""
    fp = fingerprint(cfg, lay)
    old = read_json(lay.state) if lay.state.is_file() else {}
    resume = cfg.data.curate.resume and old.get("fingerprint") == fp and not old.get("finished")
    if resume:
        done = len(list(lay.logs.glob("*/completions/*")))
        log.info("curate: resuming an unfinished run; datatrove skips its %d completed task(s)", done)
    else:
        remove_outputs(lay.logs, lay.work)
    # The outputs themselves stay until finish() swaps the staged ones in: a failed run leaves them intact.
    write_json(lay.state, {"fingerprint": fp, "finished": False, "started": time.time()})
    return resume


def _check(cfg: ZayaConfig) -> list:
    c = cfg.data.curate
    if c.tasks < 1:
        raise ConfigError(f"data.curate.tasks={c.tasks} must be >= 1")
    steps = parse_steps(c.steps)
    from zaya_pipeline.data.executors import check_executor

    check_executor(cfg.data.executor)
    raw = Path(cfg.paths.raw)
    if not sorted(raw.glob("*.jsonl.gz")):
        raise DataError(f"no *.jsonl.gz files in paths.raw={raw}: run the prepare stage first (zaya prepare)")
    return steps


def curate(cfg: ZayaConfig) -> dict:
    """Run the curation chain; writes ``paths.curated``, ``paths.removed``, ``reports/curate.json`` and the
    data report (on Slurm with ``wait: false``: submits the jobs and returns their ids)."""
    from zaya_pipeline.data import executors

    set_project_env()
    steps = _check(cfg)
    e, lay = cfg.data.executor, Layout.of(cfg)
    _start(cfg, lay)
    passes = build_passes(
        steps, cfg.data.curate.tasks, lay.raw, lay.work, lay.work / "curated", lay.work / "removed"
    )
    infos = [PassInfo(p.name, p.tasks, p.accounted) for p in passes]
    if e.type == "slurm":
        submitted = executors.submit_slurm(e, passes, FinishStep(cfg, infos), lay.logs, FINISH)
        if not e.slurm.wait:
            return {"slurm_jobs": [str(x.job_id) for x in submitted], "logs": str(lay.logs)}
        executors.wait_slurm(submitted, lay.logs / FINISH / "completions" / "00000", e.slurm.poll_seconds)
        summary = read_json(lay.reports / "curate.json")
    else:
        executors.run_blocking(e, passes, lay.logs)
        summary = finish(cfg, infos)
    return {
        "input_docs": summary["input_docs"],
        "output_docs": summary["output_docs"],
        "dropped_docs": summary["dropped_docs"],
        "seconds": summary["seconds"],
        "curated": cfg.paths.curated,
    }
