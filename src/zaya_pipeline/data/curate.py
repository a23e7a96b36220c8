"""``zaya curate``: the datatrove pipeline from ``paths.raw`` to ``paths.curated``.

Steps, each optional (``data.curate.*``), in this order::

    JsonlReader → Gopher repetition → Gopher quality → C4 quality      (filters; C4 also drops lines)
                → exact dedup   (3 datatrove stages: signature, find duplicates, filter)
                → MinHash dedup (4 datatrove stages: signature, buckets, clusters, filter) → JsonlWriter

A dedup's signature stage runs at the end of the pass before it and its filter at the start of the pass
after it, so the data is read once per dedup. Intermediate shards live in a temporary work folder beside
``paths.curated``. Every dropped document is written to ``paths.removed/<step>/`` with ``curate_step`` and
``filter_reason`` in its metadata. The counts per step come from datatrove's stats files
(``paths.logs/curate/<pass>/stats.json``) and go into the DVC metrics file ``paths.reports/curate.json``;
the run checks ``input_docs == output_docs + Σ dropped``.
"""

from __future__ import annotations

import functools
import gzip
import json
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zaya_pipeline.config import CurateConfig, ZayaConfig
from zaya_pipeline.errors import ConfigError, DataError
from zaya_pipeline.utils import atomic_dir, get_logger, remove_outputs, set_project_env, write_json

log = get_logger("curate")

READ, WRITE = "read", "write"  # pseudo step names: where documents enter and leave the pipeline
# datatrove's dedup filters drop without naming a reason: ours, also written into the removed records
DEDUP_REASONS = {"exact_dedup": "exact_duplicate", "minhash_dedup": "near_duplicate"}


@dataclass
class Pass:
    """One LocalPipelineExecutor run; ``steps`` maps a pipeline index to the step name it is accounted as."""

    name: str
    pipeline: list
    tasks: int
    steps: dict[int, str] = field(default_factory=dict)
    writes: Path | None = None  # folder of per-task shards the next pass reads


@dataclass
class Dedup:
    name: str
    signature: Any  # last step of the pass before
    middle: list[Pass]
    filter: Any  # first step after the reader of the pass after


def _reader(folder: Path) -> Any:
    from datatrove.pipeline.readers import JsonlReader

    return JsonlReader(str(folder), glob_pattern="*.jsonl.gz", recursive=False, add_file_path=False)


def _writer(folder: Path, adapter: Any = None) -> Any:
    from datatrove.pipeline.writers import JsonlWriter

    return JsonlWriter(str(folder), output_filename="${rank}.jsonl.gz", adapter=adapter)


def _exclusion(removed: Path, step: str, reason: str = "") -> Any:
    from zaya_pipeline.data.steps import removed_record

    return _writer(removed / step, functools.partial(removed_record, step=step, reason=reason))


def _filters(c: CurateConfig, removed: Path, tok: Any) -> list[tuple[str, Any]]:
    from datatrove.pipeline.filters import C4QualityFilter, GopherQualityFilter, GopherRepetitionFilter

    chosen = [
        ("gopher_repetition", c.gopher_repetition, GopherRepetitionFilter, {}),
        ("gopher_quality", c.gopher_quality, GopherQualityFilter,
         {"min_doc_words": c.gopher_min_doc_words, "max_doc_words": c.gopher_max_doc_words}),
        ("c4_quality", c.c4_quality, C4QualityFilter, {"filter_curly_bracket": c.c4_filter_curly_bracket}),
    ]  # fmt: skip
    return [
        (name, cls(language=tok, exclusion_writer=_exclusion(removed, name), **kwargs))
        for name, enabled, cls, kwargs in chosen
        if enabled
    ]


def _exact_dedup(work: Path, removed: Path) -> Dedup:
    from datatrove.pipeline.dedup.exact_dedup import (
        ExactDedupConfig,
        ExactDedupFilter,
        ExactDedupSignature,
        ExactFindDedups,
    )

    from zaya_pipeline.data.steps import normalized_text

    config = ExactDedupConfig(content_getter=normalized_text)
    sigs, dups = work / "exact_sigs", work / "exact_dups"
    return Dedup(
        name="exact_dedup",
        signature=ExactDedupSignature(str(sigs), config=config, finder_workers=1),
        middle=[Pass("exact_find", [ExactFindDedups(str(sigs), str(dups), config=config)], tasks=1)],
        filter=ExactDedupFilter(
            str(dups),
            config=config,
            exclusion_writer=_exclusion(removed, "exact_dedup", DEDUP_REASONS["exact_dedup"]),
        ),
    )


def _minhash_dedup(c: CurateConfig, work: Path, removed: Path, tok: Any) -> Dedup:
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )

    config = MinhashConfig(
        n_grams=c.minhash_ngram, num_buckets=c.minhash_buckets, hashes_per_bucket=c.minhash_hashes_per_bucket
    )
    sigs, buckets, clusters = work / "minhash_sigs", work / "minhash_buckets", work / "minhash_clusters"
    return Dedup(
        name="minhash_dedup",
        signature=MinhashDedupSignature(str(sigs), config=config, language=tok),
        middle=[
            Pass(
                "minhash_buckets",
                [MinhashDedupBuckets(str(sigs), str(buckets), config=config)],
                tasks=c.minhash_buckets,
            ),
            Pass(
                "minhash_cluster", [MinhashDedupCluster(str(buckets), str(clusters), config=config)], tasks=1
            ),
        ],
        filter=MinhashDedupFilter(
            str(clusters),
            exclusion_writer=_exclusion(removed, "minhash_dedup", DEDUP_REASONS["minhash_dedup"]),
        ),
    )


def build_passes(c: CurateConfig, raw: Path, work: Path, curated: Path, removed: Path) -> list[Pass]:
    """The executor runs of the whole stage, in order."""
    from zaya_pipeline.data.steps import EnglishTokenizer, curated_record

    tok = EnglishTokenizer()  # one instance for every step of a pass: its word lists are cached per instance
    dedups = []
    if c.exact_dedup:
        dedups.append(_exact_dedup(work, removed))
    if c.minhash:
        dedups.append(_minhash_dedup(c, work, removed, tok))
    passes: list[Pass] = []
    # the accounted steps that follow the reader of the current pass
    head: list[tuple[str, Any]] = _filters(c, removed, tok)
    source = raw
    for i, dedup in enumerate(dedups):
        shards = work / f"shards_{i}"
        steps = [(READ, _reader(source)), *head, ("", _writer(shards)), ("", dedup.signature)]
        passes.append(_pass(f"pass_{i}", steps, c.tasks, writes=shards))
        passes.extend(dedup.middle)
        source, head = shards, [(dedup.name, dedup.filter)]
    passes.append(
        _pass(
            f"pass_{len(dedups)}",
            [(READ, _reader(source)), *head, (WRITE, _writer(curated, curated_record))],
            c.tasks,
        )
    )
    return [Pass(f"{i:02d}_{p.name}", p.pipeline, p.tasks, p.steps, p.writes) for i, p in enumerate(passes)]


def _pass(name: str, steps: list[tuple[str, Any]], tasks: int, writes: Path | None = None) -> Pass:
    return Pass(name, [s for _, s in steps], tasks, {i: n for i, (n, _) in enumerate(steps) if n}, writes)


def _run_pass(p: Pass, workers: int, logs: Path) -> list[dict]:
    """Run one pass with datatrove; returns its merged stats (one dict per pipeline step)."""
    from datatrove.executor import LocalPipelineExecutor

    from zaya_pipeline.data.steps import fill_missing_shards

    executor = LocalPipelineExecutor(
        p.pipeline,
        tasks=p.tasks,
        workers=min(workers, p.tasks),
        logging_dir=str(logs / p.name),
        skip_completed=False,
    )
    executor.run()
    if p.writes is not None:
        fill_missing_shards(p.writes, p.tasks)
    with open(logs / p.name / "stats.json") as f:
        return json.load(f)


def _count(stats: dict, key: str) -> int:
    value = stats.get(key, 0)
    return int(value["total"] if isinstance(value, dict) else value)


def summarize(passes: list[Pass], stats: dict[str, list[dict]]) -> dict:
    """Per-step counts and drop reasons from datatrove's stats, and the accounting check."""
    steps, input_docs, output_docs = [], None, 0
    for p in passes:
        for index, name in p.steps.items():
            s = stats[p.name][index]["stats"]
            if name == READ and input_docs is None:
                input_docs = _count(s, "documents")
            elif name == WRITE:
                output_docs = _count(s, "total")
            elif name != READ:
                reasons = {
                    k.removeprefix("dropped_"): _count(s, k) for k in sorted(s) if k.startswith("dropped_")
                }
                dropped = _count(s, "dropped")
                if dropped and not reasons:
                    reasons = {DEDUP_REASONS.get(name, "unnamed"): dropped}
                steps.append(
                    {
                        "name": name,
                        "docs_in": _count(s, "total"),
                        "kept": _count(s, "forwarded"),
                        "dropped": dropped,
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


def _check(cfg: ZayaConfig) -> Path:
    c = cfg.data.curate
    for key in ("tasks", "workers", "minhash_ngram", "minhash_buckets", "minhash_hashes_per_bucket"):
        if getattr(c, key) < 1:
            raise ConfigError(f"data.curate.{key}={getattr(c, key)} must be >= 1")
    raw = Path(cfg.paths.raw)
    if not sorted(raw.glob("*.jsonl.gz")):
        raise DataError(f"no *.jsonl.gz files in paths.raw={raw}: run the prepare stage first (zaya prepare)")
    return raw


def _run(cfg: ZayaConfig, raw: Path, logs: Path) -> dict:
    """All passes, in temporary folders that replace ``paths.curated`` and ``paths.removed`` at the end."""
    from zaya_pipeline.data.steps import zero_gzip_mtime

    c = cfg.data.curate
    curated, removed = Path(cfg.paths.curated), Path(cfg.paths.removed)
    curated.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".curate-work-", dir=curated.parent))
    try:
        with atomic_dir(curated) as out, atomic_dir(removed) as rem:
            passes = build_passes(c, raw, work, out, rem)
            stats = {}
            for p in passes:
                t0 = time.monotonic()
                stats[p.name] = _run_pass(p, c.workers, logs)
                log.info("curate pass %s: %d task(s) in %.1f s", p.name, p.tasks, time.monotonic() - t0)
            for path in [*out.rglob("*.jsonl.gz"), *rem.rglob("*.jsonl.gz")]:
                zero_gzip_mtime(path)  # identical runs give identical bytes (stable DVC hashes)
            return file_accounting(summarize(passes, stats), raw, out, rem)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def curate(cfg: ZayaConfig) -> dict:
    """Run the curation pipeline; writes ``paths.curated``, ``paths.removed`` and ``reports/curate.json``."""
    set_project_env()
    raw = _check(cfg)
    logs, report = Path(cfg.paths.logs) / "curate", Path(cfg.paths.reports) / "curate.json"
    # Old logs hold datatrove's completion markers: a rerun with other parameters must redo every task.
    remove_outputs(cfg.paths.curated, cfg.paths.removed, logs, report)
    start = time.monotonic()
    summary = _run(cfg, raw, logs)
    summary["seconds"] = round(time.monotonic() - start, 1)
    write_json(report, summary)
    for s in summary["steps"]:
        log.info(
            "curate %-17s in %6d  kept %6d  dropped %6d  %s",
            s["name"],
            s["docs_in"],
            s["kept"],
            s["dropped"],
            s["reasons"],
        )
    return {
        "input_docs": summary["input_docs"],
        "output_docs": summary["output_docs"],
        "dropped_docs": summary["dropped_docs"],
        "seconds": summary["seconds"],
        "curated": cfg.paths.curated,
    }
