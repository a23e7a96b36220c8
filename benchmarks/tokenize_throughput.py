"""Tokenization throughput per core: the tokenize stage against plain ``tokenizers`` batch encoding.

Both arms run single-threaded (``TOKENIZERS_PARALLELISM=false``; the stage with ``data.tokenize.tasks=1``,
which datatrove runs in this process) over the same documents with the same ``tokenizer.json``:

* ``stage``: ``zaya_pipeline.data.tokenize.tokenize`` end to end: read the JSONL.gz files, split by id hash
  (each split's pipeline reads every file), encode, append EOS, write and shuffle the shards, count the
  unigram baseline, write meta.json;
* ``tokenizers``: ``Tokenizer.encode_batch`` over the texts, already in memory, in batches of 10,000 (what
  datatrove's ``DocumentTokenizer`` uses).

After one warm-up call of each arm (imports, datatrove's first-call dependency checks; recorded as
``cold``), rounds alternate the arms; the JSON holds, per arm, the median tokens per CPU second
(``time.process_time`` of this process, so other load on the machine does not count against either arm) and
per wall second, and the ratio stage / tokenizers. The stage's tokens include one EOS per document::

    zaya prepare paths.raw=/tmp/corpus            # the embedded Debian corpus (or any folder of JSONL.gz)
    python benchmarks/tokenize_throughput.py --corpus /tmp/corpus --copies 4 \\
        --out benchmarks/results/tokenize_throughput.json
"""

from __future__ import annotations

import os

os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per arm, before tokenizers starts its pool

import argparse  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from bench_env import header, version_of  # noqa: E402

BATCH = 10_000


def replicate(corpus: Path, out: Path, copies: int) -> list[str]:
    """``copies`` copies of every *.jsonl.gz document of ``corpus`` (ids suffixed) in ``out``; their texts."""
    from zaya_pipeline.data.text_io import iter_documents

    docs = list(iter_documents(corpus))
    out.mkdir(parents=True)
    texts = []
    for c in range(copies):
        with gzip.open(out / f"{c:05d}.jsonl.gz", "wt", encoding="utf-8") as f:
            for d in docs:
                f.write(json.dumps({"id": f"{d['id']}#{c}", "text": d["text"]}, ensure_ascii=False) + "\n")
                texts.append(d["text"])
    return texts


def timed(fn) -> tuple[float, float, object]:
    c0, w0 = time.process_time(), time.perf_counter()
    result = fn()
    return time.process_time() - c0, time.perf_counter() - w0, result


def stage_config(work: Path, curated: Path, tok_dir: Path):
    from zaya_pipeline.config import load_config

    overrides = [f"paths.curated={curated}", f"paths.tokenizer={tok_dir}", "data.tokenize.tasks=1"]
    # paths.removed does not exist: the data report's count of dropped documents' tokens is not timed
    overrides += [f"paths.{key}={work}/{key}" for key in ("tokens", "reports", "logs", "removed")]
    return load_config(overrides)


def run_stage(cfg) -> int:
    from zaya_pipeline.data.tokenize import tokenize

    summary = tokenize(cfg)
    return summary["train_tokens"] + summary["val_tokens"]


def run_tokenizers(tok_file: Path, texts: list[str]) -> int:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_file))
    return sum(
        len(e.ids) for i in range(0, len(texts), BATCH) for e in tok.encode_batch(texts[i : i + BATCH])
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", type=Path, required=True, help="folder of *.jsonl.gz documents")
    ap.add_argument("--copies", type=int, default=1, help="replicate the corpus to amortize fixed costs")
    ap.add_argument("--vocab", type=int, default=4096, help="BPE vocabulary trained on the corpus")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    from zaya_pipeline.config import load_config
    from zaya_pipeline.data.tokenizer import train_tokenizer

    with tempfile.TemporaryDirectory(prefix="tok_bench_") as tmp:
        tmp = Path(tmp)
        texts = replicate(args.corpus, tmp / "curated", args.copies)
        tok_dir = tmp / "tokenizer"
        train_tokenizer(
            load_config(
                [
                    f"paths.curated={args.corpus}",
                    f"paths.tokenizer={tok_dir}",
                    f"paths.reports={tmp}/tok_reports",
                    f"tokenizer.vocab_size={args.vocab}",
                ]
            )
        )
        cfg = stage_config(tmp / "stage", tmp / "curated", tok_dir)  # composing the config is not timed
        arms = {
            "stage": lambda: run_stage(cfg),
            "tokenizers": lambda: run_tokenizers(tok_dir / "tokenizer.json", texts),
        }
        cold = {}  # the warm-up call: imports and datatrove's first-call checks, as one `zaya tokenize` pays
        for name, fn in arms.items():
            shutil.rmtree(tmp / "stage", ignore_errors=True)
            cpu, wall, tokens = timed(fn)
            cold[name] = {"tokens": tokens, "cpu_s": round(cpu, 3), "wall_s": round(wall, 3)}
        rounds = []
        for r in range(args.rounds):
            row = {}
            for name, fn in arms.items():
                shutil.rmtree(tmp / "stage", ignore_errors=True)
                cpu, wall, tokens = timed(fn)
                row[name] = {"tokens": tokens, "cpu_s": round(cpu, 3), "wall_s": round(wall, 3)}
            rounds.append(row)
            print(
                f"round {r}: "
                + ", ".join(f"{k} {v['tokens'] / v['cpu_s']:,.0f} tok/cpu-s" for k, v in row.items())
            )

    def median(name: str, key: str) -> float:
        return statistics.median(row[name]["tokens"] / row[name][key] for row in rounds)

    summary = {
        name: {
            "tokens": rounds[0][name]["tokens"],
            "median_tokens_per_cpu_s": round(median(name, "cpu_s")),
            "median_tokens_per_wall_s": round(median(name, "wall_s")),
        }
        for name in arms
    }
    ratio = statistics.median(
        (row["stage"]["tokens"] / row["stage"]["cpu_s"])
        / (row["tokenizers"]["tokens"] / row["tokenizers"]["cpu_s"])
        for row in rounds
    )
    result = {
        **header("tokenize_throughput"),
        "versions": {p: version_of(p) for p in ("tokenizers", "datatrove")},
        "corpus": {"folder": str(args.corpus), "copies": args.copies, "docs": len(texts)},
        "vocab_size": args.vocab,
        "summary": summary,
        "median_ratio_stage_over_tokenizers_per_cpu_s": round(ratio, 3),
        "target_ratio": 0.8,
        "cold_ratio_stage_over_tokenizers_per_cpu_s": round(
            (cold["stage"]["tokens"] / cold["stage"]["cpu_s"])
            / (cold["tokenizers"]["tokens"] / cold["tokenizers"]["cpu_s"]),
            3,
        ),
        "cold": cold,
        "rounds": rounds,
    }
    print(
        json.dumps(
            {k: result[k] for k in ("summary", "median_ratio_stage_over_tokenizers_per_cpu_s")}, indent=1
        )
    )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
