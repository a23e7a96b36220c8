"""Curation throughput per core: our default chain against datatrove's steps as its FineWeb example sets them.

Three arms over the same documents, each as one datatrove task in this process (``tasks=1``, ``workers=1``:
one core), so ``time.process_time`` counts all of an arm's work and other load on the machine does not:

* ``ours``: ``zaya_pipeline.data.curate.curate`` with the default ``data.curate.steps`` (normalize, PII, URL,
  length, language, Gopher repetition + quality, C4, FineWeb, exact dedup, MinHash 25x4), end to end.
  ``ours_chain`` is the part of it spent in the datatrove passes; the rest (``finish``) is the accounting
  over the files, the data report (PNG, HTML) and the MLflow run.
* ``fineweb``: datatrove's steps as in its ``examples/fineweb.py``: URLFilter → LanguageFilter (en, 0.65) →
  GopherRepetition → GopherQuality → C4Quality(filter_no_terminal_punct=False) → FineWebQuality → JsonlWriter;
  then MinHash (5-grams, 14 buckets x 8 hashes, 64-bit) stage 1 on that output, stages 2-3, and stage 4 →
  PIIFormatter → JsonlWriter. Offline substitutes, same code paths: the lid.176 model from the local wheel
  (``LocalLanguageFilter``), tldextract's bundled suffix list (``OfflineURLFilter``). datatrove's own spaCy
  word tokenizer, as the example has it.
* ``fineweb_tok``: the same with our cached ``EnglishTokenizer`` (steps.py), which ``ours`` uses too: the
  difference between ``ours_chain`` and ``fineweb_tok`` is what our added steps cost.

Every document gets a ``url`` (from its path: ``https://www.sqlite.org/...``, ``https://www.postgresql.org/
docs/15/...``) so that both URL filters do their work; FineWeb's URLFilter requires one. After a warm-up of
each arm on a few documents, rounds run the arms in rotating order; the JSON holds per round and as medians
the documents and MB (UTF-8 text in) per second of CPU and of wall time, and the cost ratios
``ours / fineweb`` (the target: at most 1.15), measured round by round::

    zaya prepare paths.raw=/tmp/corpus/raw         # the embedded Debian corpus (or any folder of JSONL.gz)
    python benchmarks/curate_throughput.py --raw /tmp/corpus/raw --docs 600 --rounds 3 \\
        --out benchmarks/results/curate_throughput.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench_env import header, version_of

ARMS = ("ours", "fineweb", "fineweb_tok")


def url_of(doc_id: str) -> str:
    package, _, page = doc_id.partition("/")
    if package.startswith("postgresql"):
        return f"https://www.postgresql.org/docs/15/{page}"
    if package.startswith("sqlite"):
        return f"https://www.sqlite.org/{page}"
    return f"https://docs.example.org/{doc_id}"


def load_docs(raw: Path, n: int) -> list[dict]:
    """Every ``n``-th share of the documents of ``raw`` (evenly over its files), each with a ``url``."""
    docs = []
    for path in sorted(raw.glob("*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            docs += [json.loads(line) for line in f]
    if n and n < len(docs):
        step = len(docs) / n
        docs = [docs[int(i * step)] for i in range(n)]
    for d in docs:
        d["metadata"] = {**(d.get("metadata") or {}), "url": url_of(d["id"])}
    return docs


def write_raw(docs: list[dict], folder: Path) -> None:
    folder.mkdir(parents=True)
    with gzip.open(folder / "00000.jsonl.gz", "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(d, ensure_ascii=False) + "\n" for d in docs)


def run_ours(raw: Path, work: Path) -> dict:
    from zaya_pipeline.config import load_config
    from zaya_pipeline.data import executors
    from zaya_pipeline.data.curate import curate

    paths = [f"paths.{k}={work}/{k}" for k in ("curated", "removed", "logs", "reports")]
    cfg = load_config(
        [
            f"paths.raw={raw}",
            *paths,
            f"registry.tracking_uri=sqlite:///{work}/mlflow.db",
            "data.curate.tasks=1",
        ]
        + ["data.executor.workers=1"]
    )
    chain = {}
    run_blocking = executors.run_blocking

    def timed(*args, **kwargs):
        c0, w0 = time.process_time(), time.perf_counter()
        run_blocking(*args, **kwargs)
        chain.update(cpu=time.process_time() - c0, wall=time.perf_counter() - w0)

    executors.run_blocking = timed
    try:
        summary = curate(cfg)
    finally:
        executors.run_blocking = run_blocking
    return {"kept": summary["output_docs"], "chain": chain}


def fineweb_passes(raw: Path, work: Path, tok) -> list[tuple[list, int]]:
    """datatrove's steps and MinHash as in examples/fineweb.py; (pipeline, tasks) per executor run."""
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.filters import (
        C4QualityFilter,
        FineWebQualityFilter,
        GopherQualityFilter,
        GopherRepetitionFilter,
    )
    from datatrove.pipeline.formatters import PIIFormatter
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter
    from datatrove.utils.hashing import HashConfig

    from zaya_pipeline.data.filters import LocalLanguageFilter, OfflineURLFilter

    out, removed, mh = work / "output", work / "removed", work / "minhash"

    def excl(name: str):
        return JsonlWriter(str(removed / name))

    config = MinhashConfig(
        hash_config=HashConfig(precision=64), num_buckets=14, hashes_per_bucket=8, n_grams=5
    )
    filtering = [
        JsonlReader(str(raw)),
        OfflineURLFilter(exclusion_writer=excl("url")),
        LocalLanguageFilter(languages=["en"], language_threshold=0.65, exclusion_writer=excl("lang")),
        GopherRepetitionFilter(exclusion_writer=excl("rep"), language=tok),
        GopherQualityFilter(exclusion_writer=excl("quality"), language=tok),
        C4QualityFilter(filter_no_terminal_punct=False, exclusion_writer=excl("c4"), language=tok),
        FineWebQualityFilter(exclusion_writer=excl("fineweb"), language=tok),
        JsonlWriter(str(out)),
    ]
    return [
        (filtering, 1),
        ([JsonlReader(str(out)), MinhashDedupSignature(str(mh / "sigs"), config=config, language=tok)], 1),
        ([MinhashDedupBuckets(str(mh / "sigs"), str(mh / "buckets"), config=config)], config.num_buckets),
        ([MinhashDedupCluster(str(mh / "buckets"), str(mh / "remove_ids"), config=config)], 1),
        (
            [
                JsonlReader(str(out)),
                MinhashDedupFilter(str(mh / "remove_ids"), exclusion_writer=excl("minhash")),
                PIIFormatter(),
                JsonlWriter(str(work / "deduped")),
            ],
            1,
        ),
    ]


def run_fineweb(raw: Path, work: Path, our_tokenizer: bool) -> dict:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.utils.typeshelper import Languages

    from zaya_pipeline.data.datatrove_parts import EnglishTokenizer

    tok = EnglishTokenizer() if our_tokenizer else Languages.english
    for i, (pipeline, tasks) in enumerate(fineweb_passes(raw, work, tok)):
        LocalPipelineExecutor(pipeline, tasks=tasks, workers=1, logging_dir=str(work / "logs" / str(i))).run()
    kept = 0
    for path in (work / "deduped").glob("*.jsonl*"):
        with gzip.open(path, "rt") as f:
            kept += sum(1 for _ in f)
    return {"kept": kept}


def run_arm(arm: str, raw: Path, tmp: Path) -> dict:
    work = Path(tempfile.mkdtemp(prefix=f"{arm}-", dir=tmp))
    c0, w0 = time.process_time(), time.perf_counter()
    result = run_ours(raw, work) if arm == "ours" else run_fineweb(raw, work, arm == "fineweb_tok")
    result.update(cpu=time.process_time() - c0, wall=time.perf_counter() - w0)
    shutil.rmtree(work)
    return result


RATIOS = {  # name: (numerator, denominator); "chain" = ours' datatrove passes only
    "ours_over_fineweb": ("ours", "fineweb"),
    "chain_over_fineweb": ("chain", "fineweb"),
    "chain_over_fineweb_tok": ("chain", "fineweb_tok"),
    "ours_over_fineweb_tok": ("ours", "fineweb_tok"),
}


def aggregate(rounds: list[dict], n_docs: int, mb: float) -> tuple[list[dict], dict]:
    """Per-round cost ratios, and medians of times, rates (per CPU / wall second) and ratios."""

    def seconds(rd: dict, arm: str, clock: str) -> float:
        return rd["ours"]["chain"][clock] if arm == "chain" else rd[arm][clock]

    per_round = [
        {"arms": rd}
        | {
            f"ratio_{name}_{clock}": round(seconds(rd, a, clock) / seconds(rd, b, clock), 3)
            for name, (a, b) in RATIOS.items()
            for clock in ("cpu", "wall")
        }
        for rd in rounds
    ]
    medians = {}
    for clock in ("cpu", "wall"):
        for arm in (*ARMS, "chain"):
            s = statistics.median(seconds(rd, arm, clock) for rd in rounds)
            key = "ours_chain" if arm == "chain" else arm
            medians[f"{key}_{clock}_s"] = round(s, 2)
            medians[f"{key}_docs_per_{clock}_s"] = round(n_docs / s, 3)
            medians[f"{key}_mb_per_{clock}_s"] = round(mb / s, 3)
        for name in RATIOS:
            medians[f"ratio_{name}_{clock}"] = statistics.median(
                r[f"ratio_{name}_{clock}"] for r in per_round
            )
    return per_round, medians


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--raw", type=Path, required=True, help="folder of *.jsonl.gz (the prepare stage's output)"
    )
    ap.add_argument(
        "--docs", type=int, default=600, help="documents to take, evenly over the corpus (0 = all)"
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/curate_throughput.json"))
    args = ap.parse_args()

    docs = load_docs(args.raw, args.docs)
    mb = sum(len(d["text"].encode("utf-8")) for d in docs) / 1e6
    tmp = Path(tempfile.mkdtemp(prefix="curate-bench-"))
    try:
        write_raw(docs, tmp / "raw")
        write_raw(docs[:20], tmp / "warm")
        for arm in ARMS:  # imports, spaCy, the LID model, MLflow's first store: not part of any round
            run_arm(arm, tmp / "warm", tmp)
        rounds = []
        for r in range(args.rounds):
            order = ARMS[r % 3 :] + ARMS[: r % 3]
            rounds.append({arm: run_arm(arm, tmp / "raw", tmp) for arm in order})
            print(json.dumps({"round": r, **rounds[-1]}), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    per_round, medians = aggregate(rounds, len(docs), mb)
    result = {
        **header("curate_throughput", "one core per arm (tasks=1, workers=1)"),
        "versions": {p: version_of(p) for p in ("datatrove", "spacy", "fasttext-numpy2-wheel", "tldextract")},
        "input": {"docs": len(docs), "mb": round(mb, 3), "raw": str(args.raw)},
        "kept": {arm: rounds[0][arm]["kept"] for arm in ARMS},
        "target": "ours / fineweb <= 1.15 (cost per document, median of per-round ratios)",
        "target_met_cpu": medians["ratio_ours_over_fineweb_cpu"] <= 1.15,
        "medians": medians,
        "rounds": per_round,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(medians, indent=2))


if __name__ == "__main__":
    main()
