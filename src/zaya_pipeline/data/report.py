"""The data report: what went into curation, what came out, what was dropped and why, for people and DVC.

``write_report`` runs at the end of the curate stage, over its summary (``reports/curate.json``) and the
records of ``paths.curated`` and ``paths.removed``. It writes, under ``paths.reports``::

    data_report.json          DVC metrics: documents / words / characters per step and per drop reason,
                              length histograms (kept vs dropped), language mix, duplicate cluster sizes
    plots/data_steps.csv      DVC plots: one row per step (docs_in, kept, dropped, words/chars dropped)
    plots/data_reasons.csv    one row per (step, reason)
    plots/data_lengths.csv    document length histogram: words (bin lower edge, powers of 2), kept, dropped
    plots/data_languages.csv  metadata "language" → kept, dropped ("unknown" where no step recorded one)
    plots/data_clusters.csv   duplicate cluster sizes: method, size (documents), clusters
    data_report.png           the same as one figure
    data_report.html          one self-contained page (the figure embedded as base64, and the tables);
                              the tokenize stage writes data_report_tokens.html, the same with token counts

Words are whitespace-separated, as in ``reports/curate.json``; tokens are known only after the tokenize
stage, which adds them with ``add_token_counts`` (``plots/data_tokens.csv`` and the HTML page).

Duplicate clusters, by what the records carry: exact dedup from ``duplicate_count`` (datatrove's
``ExactDedupFilter`` sets it on the kept copy) when present, else recomputed from the removed copies (every
exact duplicate removed shares its normalized text with the one copy that was kept, so a cluster is
"removed copies with one hash + 1"); near dedup from the ``minhash_cluster_size`` that each removed copy
carries (datatrove's ``MinhashDedupFilter(load_cluster_sizes=True)``: a cluster of s documents leaves s - 1
removed copies that each say s), else only the number of removed copies. Steps are told apart by type
(``summary["steps"][i]["type"]``), so a renamed dedup step is still found.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import html
import math
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

from zaya_pipeline.data.jsonl import read_jsonl
from zaya_pipeline.utils import read_json, write_json

REPORT_JSON, REPORT_PNG, REPORT_HTML = "data_report.json", "data_report.png", "data_report.html"
TOKENS_HTML = "data_report_tokens.html"  # the tokenize stage's page: the report and its token counts
PLOTS = "plots"
TOKENS_CSV, TOKENS_DROPPED_CSV = "data_tokens.csv", "data_tokens_dropped.csv"
DIGEST_TAG = "zaya.data_report"  # MLflow tag: digest of the data_report.json a run holds
UNKNOWN_LANGUAGE = "unknown"
EXACT_TYPE, NEAR_TYPE = "exact_dedup", "minhash_dedup"  # step types (data/chain.py)
TOP = 15  # reasons / languages drawn in the figure (the tables and CSVs hold all)


def _records(folder: Path) -> Iterator[dict]:
    for path in sorted(Path(folder).rglob("*.jsonl.gz")):
        for _, rec in read_jsonl(path):
            yield rec


def length_bin(words: int) -> int:
    """Lower edge of the power-of-two bin holding ``words`` (0 for empty documents)."""
    return 0 if words < 1 else 1 << (words.bit_length() - 1)


def _exact_key(text: str) -> str:
    from datatrove.utils.text import simplify_text

    from zaya_pipeline.data.datatrove_parts import EXACT_NORM  # the normalization exact dedup hashed

    return hashlib.blake2b(simplify_text(text, EXACT_NORM).encode("utf-8"), digest_size=16).hexdigest()


def collect(curated: Path, removed: Path, types: dict[str, str]) -> dict:
    """One pass over the kept and dropped records: everything the report shows beyond curate.json.

    ``types`` maps a step id to its type (``exact_dedup``, ``minhash_dedup``, ...): step ids are the user's.
    """
    hist = {"kept": Counter(), "dropped": Counter()}
    by_reason: dict[tuple[str, str], Counter] = defaultdict(Counter)
    languages: dict[str, Counter] = defaultdict(Counter)
    exact_counts, exact_removed, near_by_size = Counter(), Counter(), Counter()
    near_removed = 0
    recorded = {"duplicate_count": False, "minhash_cluster_size": False}
    for group, folder in (("kept", curated), ("dropped", removed)):
        for rec in _records(folder):
            meta, words = rec.get("metadata") or {}, len(rec["text"].split())
            hist[group][length_bin(words)] += 1
            languages[str(meta.get("language") or UNKNOWN_LANGUAGE)][group] += 1
            if "duplicate_count" in meta:
                recorded["duplicate_count"] = True
                if int(meta["duplicate_count"]) > 0:
                    exact_counts[int(meta["duplicate_count"]) + 1] += 1
            if group == "dropped":
                step = str(meta.get("curate_step", ""))
                reason = str(meta.get("filter_reason") or "unnamed")
                by_reason[step, reason].update(docs=1, words=words, chars=len(rec["text"]))
                if types.get(step) == EXACT_TYPE:
                    exact_removed[_exact_key(rec["text"])] += 1
                elif types.get(step) == NEAR_TYPE:
                    near_removed += 1
                    if "minhash_cluster_size" in meta:
                        recorded["minhash_cluster_size"] = True
                        near_by_size[int(meta["minhash_cluster_size"])] += 1
    if recorded["duplicate_count"]:
        exact = {"method": "duplicate_count metadata", "sizes": exact_counts}
    else:
        exact = {"method": "removed copies by normalized-text hash", "sizes": Counter(
            n + 1 for n in exact_removed.values()
        )}  # fmt: skip
    if recorded["minhash_cluster_size"]:
        # a cluster of s documents keeps one and removes s - 1 copies, each recording s
        sizes = Counter({s: n // (s - 1) for s, n in near_by_size.items() if s > 1})
        near = {"method": "minhash_cluster_size of the removed copies", "sizes": sizes}
    else:
        near = {"method": "not recorded (removed copies only)", "sizes": Counter()}
    near["removed"] = near_removed
    exact["removed"] = sum(exact_removed.values())
    return {"hist": hist, "by_reason": by_reason, "languages": languages, "exact": exact, "near": near}


def _clusters(d: dict) -> dict:
    sizes = d["sizes"]
    return {
        "method": d["method"],
        "removed_docs": d["removed"],
        "clusters": sum(sizes.values()),
        "largest": max(sizes, default=0),
        "sizes": {str(k): sizes[k] for k in sorted(sizes)},
    }


def build(summary: dict, curated: Path, removed: Path) -> dict:
    """The content of ``data_report.json``."""
    c = collect(curated, removed, {s["name"]: s.get("type", s["name"]) for s in summary["steps"]})
    steps = []
    for s in summary["steps"]:
        reasons = {r: dict(v) for (step, r), v in sorted(c["by_reason"].items()) if step == s["name"]}
        steps.append(
            {
                "name": s["name"],
                "type": s.get("type", s["name"]),
                "docs_in": s["docs_in"],
                "kept": s["kept"],
                "dropped": s["dropped"],
                "edited": s.get("edited", 0),
                "words_dropped": sum(v["words"] for v in reasons.values()),
                "chars_dropped": sum(v["chars"] for v in reasons.values()),
                "reasons": reasons,
            }
        )
    seen = set(c["hist"]["kept"]) | set(c["hist"]["dropped"])
    top = max(seen, default=0)
    # every power of two up to the longest document, so the histogram's x axis has no holes
    bins = sorted({0} & seen | {1 << i for i in range(top.bit_length())})
    totals = ("input_docs", "output_docs", "dropped_docs", "words_in", "words_out", "chars_in", "chars_out")
    return {
        **{k: summary[k] for k in totals if k in summary},
        "steps": steps,
        "length_hist": {
            "bins_words": bins,
            "kept": [c["hist"]["kept"][b] for b in bins],
            "dropped": [c["hist"]["dropped"][b] for b in bins],
        },
        "languages": {
            lang: {"kept": v["kept"], "dropped": v["dropped"]}
            for lang, v in sorted(c["languages"].items(), key=lambda kv: (-kv[1].total(), kv[0]))
        },
        "duplicates": {"exact": _clusters(c["exact"]), "near": _clusters(c["near"])},
    }


def _write_csv(path: Path, header: list[str], rows: list[list]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(header)
        w.writerows(rows)
    return path


def _reason_rows(steps: list[dict]) -> list[list]:
    return [[s["name"], r, v["docs"], v["words"], v["chars"]] for s in steps for r, v in s["reasons"].items()]


def _language_rows(report: dict) -> list[list]:
    return [[lang, v["kept"], v["dropped"]] for lang, v in report["languages"].items()]


def write_plots(report: dict, plots: Path) -> list[Path]:
    steps, hist = report["steps"], report["length_hist"]
    dup = report["duplicates"]
    return [
        _write_csv(
            plots / "data_steps.csv",
            ["step", "type", "docs_in", "kept", "dropped", "edited", "words_dropped", "chars_dropped"],
            [[s["name"], s["type"], s["docs_in"], s["kept"], s["dropped"], s["edited"], s["words_dropped"],
              s["chars_dropped"]] for s in steps],
        ),
        _write_csv(
            plots / "data_reasons.csv",
            ["reason", "step", "docs", "words", "chars"],
            [[r, step, *rest] for step, r, *rest in _reason_rows(steps)],
        ),
        _write_csv(
            plots / "data_lengths.csv",
            ["words", "kept", "dropped"],
            [list(row) for row in zip(hist["bins_words"], hist["kept"], hist["dropped"], strict=True)],
        ),
        _write_csv(
            plots / "data_languages.csv",
            ["language", "kept", "dropped"],
            _language_rows(report),
        ),
        _write_csv(
            plots / "data_clusters.csv",
            ["method", "size", "clusters"],
            [[kind, int(size), n] for kind in ("exact", "near") for size, n in dup[kind]["sizes"].items()],
        ),
    ]  # fmt: skip


def write_figure(report: dict, path: Path) -> Path:
    """One PNG, six panels: the step funnel, drop reasons, lengths, languages, duplicate clusters, totals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(2, 3, figsize=(18, 10), layout="constrained")
    steps = report["steps"]
    names = [s["name"] for s in steps]
    a = ax[0, 0]
    a.barh(names, [s["kept"] for s in steps], color="tab:green", label="kept")
    a.barh(
        names,
        [s["dropped"] for s in steps],
        left=[s["kept"] for s in steps],
        color="tab:red",
        label="dropped",
    )
    a.invert_yaxis()
    a.set(title="Documents per step", xlabel="documents")
    a.legend(loc="lower right")

    reasons = sorted(
        ((f"{s['name']}: {r}", v["docs"]) for s in steps for r, v in s["reasons"].items()),
        key=lambda x: -x[1],
    )[:TOP]
    a = ax[0, 1]
    if reasons:
        a.barh([r for r, _ in reasons], [n for _, n in reasons], color="tab:red")
        a.invert_yaxis()
        a.tick_params(axis="y", labelsize=8)
    a.set(title="Drop reasons", xlabel="documents")
    a.xaxis.set_major_locator(MaxNLocator(integer=True))

    hist, a = report["length_hist"], ax[0, 2]
    labels = [str(b) for b in hist["bins_words"]]
    x = range(len(labels))
    a.bar([i - 0.2 for i in x], hist["kept"], width=0.4, color="tab:green", label="kept")
    a.bar([i + 0.2 for i in x], hist["dropped"], width=0.4, color="tab:red", label="dropped")
    a.set_xticks(list(x), labels, rotation=45)
    a.set(title="Document length", xlabel="words (bin lower edge)", ylabel="documents")
    a.legend()

    langs, a = list(report["languages"].items())[:TOP], ax[1, 0]
    a.bar([k for k, _ in langs], [v["kept"] for _, v in langs], color="tab:green", label="kept")
    a.bar(
        [k for k, _ in langs],
        [v["dropped"] for _, v in langs],
        bottom=[v["kept"] for _, v in langs],
        color="tab:red",
        label="dropped",
    )
    a.set(title="Language mix", ylabel="documents")
    a.legend()

    a = ax[1, 1]
    for kind, color in (("exact", "tab:purple"), ("near", "tab:orange")):
        sizes = report["duplicates"][kind]["sizes"]
        if sizes:
            a.bar([int(s) for s in sizes], list(sizes.values()), color=color, alpha=0.7, label=kind)
    a.set(title="Duplicate cluster sizes", xlabel="documents per cluster", ylabel="clusters")
    a.xaxis.set_major_locator(MaxNLocator(integer=True))
    a.yaxis.set_major_locator(MaxNLocator(integer=True))
    if any(report["duplicates"][k]["sizes"] for k in ("exact", "near")):
        a.legend()

    a = ax[1, 2]
    a.axis("off")
    a.set_title("Totals")
    a.text(0, 1, "\n".join(_totals_lines(report)), va="top", family="monospace", fontsize=10)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, metadata={"Software": None})  # no version stamp: same report, same bytes
    plt.close(fig)
    return path


def _totals_lines(report: dict) -> list[str]:
    def row(name: str, key_in: str, key_out: str) -> str:
        n_in, n_out = report.get(key_in, 0), report.get(key_out, 0)
        share = f"{100 * n_out / n_in:5.1f}%" if n_in else "  -  "
        return f"{name:<11}{n_in:>12,}{n_out:>12,}  {share}"

    return [
        f"{'':<11}{'in':>12}{'out':>12}  kept",
        row("documents", "input_docs", "output_docs"),
        row("words", "words_in", "words_out"),
        row("characters", "chars_in", "chars_out"),
        "",
        f"exact duplicate clusters: {report['duplicates']['exact']['clusters']}",
        f"near-duplicate copies removed: {report['duplicates']['near']['removed_docs']}",
    ]


def _table(header: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(_fmt(c))}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _fmt(value) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def render_html(
    reports_dir: Path, tokens: dict | None = None, dropped_tokens: list[list] | None = None
) -> Path:
    """The page from ``data_report.json`` and ``data_report.png``: ``data_report.html`` (the curate stage's),
    or with the token counts ``data_report_tokens.html`` (the tokenize stage's: each stage writes its own)."""
    reports_dir = Path(reports_dir)
    report = read_json(reports_dir / REPORT_JSON)
    png = base64.b64encode((reports_dir / REPORT_PNG).read_bytes()).decode("ascii")
    steps, dup = report["steps"], report["duplicates"]
    sections = [
        ("Totals", "<pre>" + html.escape("\n".join(_totals_lines(report))) + "</pre>"),
        ("Steps", _table(
            ["step", "type", "documents in", "kept", "dropped", "edited", "words dropped", "chars dropped"],
            [[s["name"], s["type"], s["docs_in"], s["kept"], s["dropped"], s["edited"], s["words_dropped"],
              s["chars_dropped"]] for s in steps],
        )),
        ("Drop reasons", _table(
            ["step", "reason", "documents", "words", "characters"],
            _reason_rows(steps),
        )),
        ("Languages", _table(
            ["language", "kept", "dropped"], _language_rows(report)
        )),
        ("Duplicate clusters", _table(
            ["dedup", "how it is known", "copies removed", "clusters", "largest", "sizes (docs: clusters)"],
            [[k, d["method"], d["removed_docs"], d["clusters"], d["largest"],
              ", ".join(f"{s}: {n}" for s, n in d["sizes"].items()) or "-"] for k, d in dup.items()],
        )),
    ]  # fmt: skip
    if tokens:
        rows = [
            [split, v.get("docs", ""), v.get("tokens", ""), v.get("bytes", "")] for split, v in tokens.items()
        ]
        sections.append(("Tokens per split", _table(["split", "documents", "tokens", "bytes"], rows)))
    if dropped_tokens:
        sections.append(
            (
                "Tokens dropped per step and reason",
                _table(["step", "reason", "documents", "tokens"], dropped_tokens),
            )
        )
    body = "".join(f"<h2>{html.escape(t)}</h2>{content}" for t, content in sections)
    page = (
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>Data report</title><style>"
        "body{font-family:sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse;margin:1em 0}"
        "td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}td:first-child,th{text-align:left}"
        "img{max-width:100%}</style></head><body><h1>Data report</h1>"
        f"<img alt='data report figure' src='data:image/png;base64,{png}'>{body}</body></html>\n"
    )
    path = reports_dir / (REPORT_HTML if tokens is None else TOKENS_HTML)
    path.write_text(page, encoding="utf-8")
    return path


def write_report(summary: dict, curated: Path, removed: Path, reports_dir: Path) -> list[Path]:
    """Write every report file (see the module docstring); returns their paths, the JSON first."""
    reports_dir = Path(reports_dir)
    report = build(summary, Path(curated), Path(removed))
    write_json(reports_dir / REPORT_JSON, report)
    paths = [reports_dir / REPORT_JSON, *write_plots(report, reports_dir / PLOTS)]
    paths.append(write_figure(report, reports_dir / REPORT_PNG))
    paths.append(render_html(reports_dir))
    return paths


def count_dropped_tokens(removed: Path, tokenizer_file: Path, batch: int = 512) -> list[list]:
    """Tokens of the dropped documents (no EOS) per (step, reason): rows [step, reason, documents, tokens]."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_file))
    counts: dict[tuple[str, str], Counter] = defaultdict(Counter)
    pending: list[tuple[tuple[str, str], str]] = []

    def flush() -> None:
        encoded = tok.encode_batch([text for _, text in pending], add_special_tokens=False)
        for (key, _), enc in zip(pending, encoded, strict=True):
            counts[key].update(docs=1, tokens=len(enc.ids))
        pending.clear()

    for rec in _records(removed):
        meta = rec.get("metadata") or {}
        pending.append(
            ((str(meta.get("curate_step", "")), str(meta.get("filter_reason") or "unnamed")), rec["text"])
        )
        if len(pending) >= batch:
            flush()
    flush()
    return [[step, reason, c["docs"], c["tokens"]] for (step, reason), c in sorted(counts.items())]


def add_token_counts(
    reports_dir: Path,
    splits: dict[str, dict],
    tokenizer_file: Path | None = None,
    removed: Path | None = None,
    registry_cfg=None,
) -> list[Path]:
    """For the end of the tokenize stage: token counts into the report.

    ``splits`` = {split: {docs, tokens, bytes}} → ``plots/data_tokens.csv``. When the curate stage wrote a
    report in ``reports_dir``: with the tokenizer and the removed documents, their tokens per step and reason
    → ``plots/data_tokens_dropped.csv``; ``data_report_tokens.html``, the report's page with both tables;
    with ``registry_cfg`` the files go to the MLflow run that holds that report (found by the digest of
    ``data_report.json``)."""
    reports_dir = Path(reports_dir)
    rows = [[s, v["docs"], v["tokens"], v.get("bytes", "")] for s, v in splits.items()]
    paths = [_write_csv(reports_dir / PLOTS / TOKENS_CSV, ["split", "docs", "tokens", "bytes"], rows)]
    if not ((reports_dir / REPORT_JSON).is_file() and (reports_dir / REPORT_PNG).is_file()):
        return paths  # no curate report here (a tokenize run on its own): nothing to add to
    dropped = None
    if tokenizer_file is not None and removed is not None and Path(removed).is_dir():
        dropped = count_dropped_tokens(Path(removed), Path(tokenizer_file))
        header = ["step", "reason", "docs", "tokens"]
        paths.append(_write_csv(reports_dir / PLOTS / TOKENS_DROPPED_CSV, header, dropped))
    paths.append(render_html(reports_dir, tokens=splits, dropped_tokens=dropped))
    if registry_cfg is not None:
        _add_to_report_run(paths, reports_dir / REPORT_JSON, registry_cfg)
    return paths


def _digest(report_json: Path) -> str:
    return hashlib.sha256(Path(report_json).read_bytes()).hexdigest()[:32]


def _add_to_report_run(paths: list[Path], report_json: Path, registry_cfg) -> str | None:
    """Log ``paths`` into the MLflow run of the report ``report_json`` (None when no run holds it)."""
    import mlflow

    from zaya_pipeline.tracking import tracking_uri, using_tracking_uri

    with using_tracking_uri(tracking_uri(registry_cfg)):
        experiment = mlflow.get_experiment_by_name(registry_cfg.experiment_name)
        if experiment is None:
            return None
        runs = mlflow.search_runs(
            [experiment.experiment_id],
            filter_string=f"tags.`{DIGEST_TAG}` = '{_digest(report_json)}'",
            order_by=["attributes.start_time DESC"],
            max_results=1,
            output_format="list",
        )
        if not runs:
            return None
        client = mlflow.MlflowClient()
        for p in map(Path, paths):
            sub = "data_report" + ("/plots" if p.suffix == ".csv" else "")
            client.log_artifact(runs[0].info.run_id, str(p), artifact_path=sub)
        return runs[0].info.run_id


def log_report_to_mlflow(paths: list[Path], registry_cfg) -> str:
    """Log the report files as artifacts (and its totals as metrics) of a new run "curate" in the experiment
    ``registry.experiment_name`` of the configured store; returns the run id."""
    import mlflow

    from zaya_pipeline.tracking import (
        ending_run,
        process_tags,
        setup_mlflow,
        tracking_uri,
        using_tracking_uri,
    )

    uri = tracking_uri(registry_cfg)
    with using_tracking_uri(uri):
        experiment_id = setup_mlflow(registry_cfg)
        # the digest: the tokenize stage adds its counts here; the host and pid: tracking.end_dead_runs
        tags = {"zaya.stage": "curate", DIGEST_TAG: _digest(Path(paths[0])), **process_tags()}
        run = mlflow.start_run(experiment_id=experiment_id, run_name="curate", tags=tags)
        with ending_run(uri, run.info.run_id):  # FINISHED, or FAILED / KILLED however the block ends
            for p in map(Path, paths):
                mlflow.log_artifact(
                    str(p), artifact_path="data_report" + ("/plots" if p.suffix == ".csv" else "")
                )
                if p.name == REPORT_JSON:
                    report = read_json(p)
                    metrics = {k: v for k, v in report.items() if isinstance(v, int | float)}
                    metrics |= {f"dropped.{s['name']}": s["dropped"] for s in report["steps"]}
                    mlflow.log_metrics({k: float(v) for k, v in metrics.items() if math.isfinite(v)})
            return run.info.run_id
