"""curate stage: real datatrove runs over a generated corpus with junk planted for every step of the chain."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest
from english_corpus import WORDS, prose, random_words, sentence
from test_filters import GERMAN

from zaya_pipeline.config import load_config
from zaya_pipeline.data.curate import curate
from zaya_pipeline.errors import ConfigError, DataError

ALL_STEPS = [
    *("normalize", "pii", "url", "length", "language", "gopher_repetition", "gopher_quality", "c4_quality"),
    *("fineweb_quality", "exact_dedup", "minhash_dedup", "sentence_dedup"),
]
BLOCKED_URL = "https://www.spamdomain.com/offers"


def make_corpus(raw: Path) -> dict[str, tuple[str, str]]:
    """Three raw shards; returns the planted drops: id → (step, reason)."""
    rng = random.Random(7)
    good = {f"good-{i:02d}": prose(rng) for i in range(16)}
    a, b = prose(rng), prose(rng)
    # the same text after normalization: doubled spaces, other sentence punctuation
    a_copy = a.replace(" of the ", " of  the ").replace(". The", "! The")
    words = b.split(" ")
    words[40], words[80] = "zebra", "violin"  # two words changed: a near duplicate
    near = " ".join(words)
    # 3 sentences from each of 3 pages: too little of any one page for MinHash to call it a near duplicate
    copied_lines = [good[f"good-0{i}"].split("\n")[0] for i in (0, 2, 4)]
    triples = [random_words(rng, 3) for _ in range(40)]  # a list of 40 short lines after some prose
    junk = {
        "junk-url": (prose(rng), {"url": BLOCKED_URL}),
        "junk-short": ("The " + " ".join(random_words(rng, 30)) + " and the end.", {}),
        "junk-german": (f"{GERMAN}\n{GERMAN}", {}),
        "junk-repeated": ("\n".join(["Click here to subscribe to the newsletter and the offers."] * 20), {}),
        "junk-no-stop-words": (" ".join(random_words(rng, 120)) + ".", {}),
        "junk-lorem": (prose(rng) + "\nLorem ipsum dolor sit amet, and the rest of the text.", {}),
        "junk-no-sentences": (prose(rng).replace(".", ""), {}),
        "junk-listing": (prose(rng) + "\n" + "\n".join(f"{' '.join(w).capitalize()}." for w in triples), {}),
    }
    shards = {
        # all junk in the first shard: task 0 keeps nothing, which must not shift the later tasks' inputs
        "a_junk": junk,
        "b": {
            **{k: (v, {}) for k, v in good.items() if int(k[-2:]) < 8},
            "dup-a": (a, {}),
            "near-b": (b, {}),
        },
        "c": {
            **{k: (v, {}) for k, v in good.items() if int(k[-2:]) >= 8},
            "dup-a-copy": (a_copy, {}),
            "near-b-copy": (near, {}),
            "pii": (prose(rng) + "\nWrite to jane.roe@mail.company.org or ping 8.8.8.8 for the list.", {}),
            "messy": (prose(rng).replace("\n", "\u200b\r\n").replace(" the ", " the\u00a0 "), {}),
            "clean-url": (prose(rng), {"url": "https://docs.python.org/3/library/json.html"}),
            # sentence dedup: a page made mostly of other pages' sentences (left too short once they go) and
            # one with three of good-01's sentences among its own (edited, kept); both after their sources
            "sent-copier": ("\n".join([*copied_lines, " ".join(sentence(rng) for _ in range(2))]), {}),
            "sent-edited": (prose(rng, 9) + "\n" + good["good-01"].split("\n")[0], {}),
        },
    }
    raw.mkdir(parents=True)
    for name, docs in shards.items():
        with gzip.open(raw / f"{name}.jsonl.gz", "wt", encoding="utf-8") as f:
            for doc_id, (text, meta) in docs.items():
                f.write(json.dumps({"id": doc_id, "text": text, "metadata": {"source": name, **meta}}) + "\n")
    return {
        "junk-url": ("url", "domain"),
        "junk-short": ("length", "too_few_words"),
        "junk-german": ("language", "low_language_score"),
        "junk-repeated": ("gopher_repetition", "dup_line_frac"),
        "junk-no-stop-words": ("gopher_quality", "gopher_enough_stop_words"),
        "junk-lorem": ("c4_quality", "lorem_ipsum"),
        "junk-no-sentences": ("c4_quality", "too_few_sentences"),
        "junk-listing": ("fineweb_quality", "short_line_ratio"),
        "sent-copier": ("sentence_dedup", "sentence_duplicates"),
    }


def make_cfg(tmp_path: Path, *overrides: str):
    paths = [f"paths.{k}={tmp_path}/{k}" for k in ("raw", "curated", "removed", "logs", "reports")]
    mlflow = f"registry.tracking_uri=sqlite:///{tmp_path}/mlflow.db"
    # these corpora keep a few dozen documents: under the default floor, and a 5% val split of them is empty
    # (curate refuses both: test_trainable.py)
    enough = ["data.curate.min_kept_docs=1", "data.tokenize.val_fraction=0.5"]
    return load_config([*paths, mlflow, *enough, *overrides])


def read_dir(folder: Path) -> list[dict]:
    records = []
    for path in sorted(folder.rglob("*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            records += [json.loads(line) for line in f]
    return records


@pytest.fixture(scope="module")
def full_run(tmp_path_factory) -> tuple[Path, dict, dict]:
    """Every step on (sentence dedup too), 3 tasks (dedup across shards) run in this process: a pool of worker
    processes costs seconds per pass here (test_chain checks that every pass survives the trip to one)."""
    tmp = tmp_path_factory.mktemp("full")
    planted = make_corpus(tmp / "raw")
    (tmp / "blocklist.txt").write_text("spamdomain.com\n")
    cfg = make_cfg(
        tmp,
        "data.curate.tasks=3",
        "data.executor.workers=1",
        "data.curate.steps.sentence_dedup.enabled=true",
        "data.curate.steps.url.use_integrated_lists=false",  # 4.5M domains to load per task: test_filters
        "data.curate.steps.minhash_dedup.num_buckets=4",  # fewer bucket tasks; 14 x 8 is test_minhash's
        f"data.curate.steps.url.blocklist_file={tmp}/blocklist.txt",
    )
    summary = curate(cfg)
    return tmp, planted, summary


def test_every_step_drops_its_junk_and_every_document_is_accounted_for(full_run):
    tmp, planted, summary = full_run
    raw, kept = read_dir(tmp / "raw"), {r["id"]: r for r in read_dir(tmp / "curated")}
    removed = {r["id"]: r for r in read_dir(tmp / "removed")}
    # the accounting identity, on the files: every input document lands exactly once
    assert len(raw) == len(kept) + len(removed) and not set(kept) & set(removed)
    assert {r["id"] for r in raw} == set(kept) | set(removed)
    for doc_id, (step, reason) in planted.items():
        meta = removed[doc_id]["metadata"]
        assert (meta["curate_step"], meta["filter_reason"]) == (step, reason), doc_id
        assert removed[doc_id]["text"], "a dropped document keeps its text"
    for doc_id, r in removed.items():
        step = r["metadata"]["curate_step"]
        assert (tmp / "removed" / step).is_dir() and r["metadata"]["filter_reason"], doc_id
    assert {f"good-{i:02d}" for i in range(16)} | {"pii", "messy", "clean-url", "sent-edited"} <= set(kept)
    assert len({"dup-a", "dup-a-copy"} & set(kept)) == 1 and len({"near-b", "near-b-copy"} & set(kept)) == 1
    assert {removed[i]["metadata"]["filter_reason"] for i in removed if i.startswith("dup-a")} == {
        "exact_duplicate"
    }
    near = next(removed[i] for i in removed if i.startswith("near-b"))["metadata"]
    assert (near["filter_reason"], near["minhash_cluster_size"]) == ("near_duplicate", 2)
    # what the format steps and sentence dedup changed
    assert "jane.roe@" not in kept["pii"]["text"] and "8.8.8.8" not in kept["pii"]["text"]
    assert "@example." in kept["pii"]["text"]
    assert not [c for c in ("\u200b", "\r", "\u00a0", "  ") if c in kept["messy"]["text"]]
    assert kept["sent-edited"]["text"].count(".") == 9, "the 3 copied sentences are gone"
    assert kept["good-01"]["text"].count(".") == 12, "the source keeps its sentences"
    assert kept["good-03"]["metadata"]["language"] == "en"
    assert set(kept["good-03"]["metadata"]) == {"source", "language", "language_score"}

    report = json.loads((tmp / "reports" / "curate.json").read_text())
    assert [s["name"] for s in report["steps"]] == ALL_STEPS
    assert report["input_docs"] == len(raw) == summary["input_docs"]
    assert report["output_docs"] == len(kept) == summary["output_docs"]
    assert report["input_docs"] == report["output_docs"] + sum(s["dropped"] for s in report["steps"])
    by_step = {s["name"]: s for s in report["steps"]}
    for s in report["steps"]:
        assert s["docs_in"] == s["kept"] + s["dropped"] and sum(s["reasons"].values()) == s["dropped"], s
    for a, b in zip(report["steps"], report["steps"][1:], strict=False):
        assert b["docs_in"] == a["kept"], "each step sees what the one before kept"
    assert {k: s["edited"] for k, s in by_step.items() if s["edited"]} == {
        "normalize": 2,  # "messy", and the doubled spaces of dup-a-copy
        "pii": 1,
        "sentence_dedup": 1,
    }
    assert by_step["exact_dedup"]["reasons"] == {"exact_duplicate": 1}
    assert by_step["minhash_dedup"]["reasons"] == {"near_duplicate": 1}
    assert by_step["sentence_dedup"]["reasons"] == {"sentence_duplicates": 1}
    assert report["by_source"]["a_junk"]["output_docs"] == 0
    assert report["chars_out"] == sum(len(r["text"]) for r in kept.values()) < report["chars_in"]
    assert (tmp / "logs" / "curate" / "07_pass_3" / "stats.json").is_file()
    assert not (tmp / "curated.work").exists(), "intermediate shards are cleaned up"
    assert json.loads((tmp / "logs" / "curate" / "run.json").read_text())["finished"] is True
    assert (tmp / "reports" / "data_report.html").is_file()


def snapshot(folder: Path) -> dict[str, bytes]:
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    return {f"{folder.name}/{p.relative_to(folder).as_posix()}": p.read_bytes() for p in files}


def outputs(tmp: Path) -> dict[str, bytes]:
    return snapshot(tmp / "curated") | snapshot(tmp / "removed")


# a short chain for the tests about runs rather than steps (one worker: tasks run in this process)
SHORT = [
    "data.executor.workers=1",
    *(f"data.curate.steps.{s}.enabled=false" for s in ("pii", "url", "language", "c4_quality")),
    "data.curate.steps.minhash_dedup.num_buckets=2",
]


def test_rerun_gives_identical_bytes_and_other_params_redo_the_work(tmp_path):
    make_corpus(tmp_path / "raw")
    curate(make_cfg(tmp_path, "data.curate.tasks=1", *SHORT))
    first = outputs(tmp_path)
    assert "removed/minhash_dedup/00000.jsonl.gz" in first
    curate(make_cfg(tmp_path, "data.curate.tasks=1", *SHORT))
    assert outputs(tmp_path) == first
    off = [
        f"data.curate.steps.{s}.enabled=false" for s in ("minhash_dedup", "exact_dedup", "fineweb_quality")
    ]
    summary = curate(make_cfg(tmp_path, "data.curate.tasks=1", *SHORT, *off))
    kept = {r["id"] for r in read_dir(tmp_path / "curated")}
    assert {"dup-a", "dup-a-copy", "near-b", "near-b-copy", "junk-listing"} <= kept
    assert sorted(p.name for p in (tmp_path / "removed").iterdir()) == [
        "gopher_quality",
        "gopher_repetition",
        "length",
    ]
    assert sorted(p.name for p in (tmp_path / "logs" / "curate").iterdir()) == ["00_pass_0", "run.json"], (
        "stale logs left"
    )
    assert summary["output_docs"] == len(kept)


def test_a_rerun_after_a_crash_skips_the_completed_tasks(tmp_path, monkeypatch):
    """Task 1 of the first pass dies; the rerun redoes only that task and ends with the same bytes."""
    from zaya_pipeline.data.filters import LengthFilter

    make_corpus(tmp_path / "raw")
    (tmp_path / "raw" / "a_junk.jsonl.gz").unlink()  # 2 shards, 2 tasks
    clean = tmp_path / "clean"
    (clean / "raw").mkdir(parents=True)
    for f in (tmp_path / "raw").iterdir():
        (clean / "raw" / f.name).write_bytes(f.read_bytes())
    curate(make_cfg(clean, "data.curate.tasks=2", *SHORT))

    original, seen = LengthFilter.filter, []

    def crash_on_shard_c(self, doc):
        if doc.metadata["source"] == "c" and doc.id == "near-b-copy":
            raise RuntimeError("simulated crash")
        seen.append(doc.metadata["source"])
        return original(self, doc)

    monkeypatch.setattr(LengthFilter, "filter", crash_on_shard_c)
    with pytest.raises(DataError, match="curate pass 00_pass_0 failed: RuntimeError: simulated crash"):
        curate(make_cfg(tmp_path, "data.curate.tasks=2", *SHORT))
    logs = tmp_path / "logs" / "curate"
    assert sorted(p.name for p in (logs / "00_pass_0" / "completions").iterdir()) == ["00000"]
    marker = (logs / "00_pass_0" / "completions" / "00000").stat().st_mtime_ns
    assert set(seen) == {"b", "c"} and not (tmp_path / "curated").exists()

    seen.clear()
    monkeypatch.setattr(LengthFilter, "filter", lambda self, doc: seen.append(doc.id) or original(self, doc))
    summary = curate(make_cfg(tmp_path, "data.curate.tasks=2", *SHORT))
    c_ids = {r["id"] for r in read_dir(tmp_path / "raw") if r["metadata"]["source"] == "c"}
    assert set(seen) == c_ids, "only task 1 (shard c) ran again"
    assert (logs / "00_pass_0" / "completions" / "00000").stat().st_mtime_ns == marker
    assert outputs(tmp_path) == outputs(clean), "the resumed run gives the bytes of an uncrashed one"
    assert summary["input_docs"] == len(read_dir(tmp_path / "raw")), "counts include the skipped task"
    report = json.loads((tmp_path / "reports" / "curate.json").read_text())
    assert report == json.loads((clean / "reports" / "curate.json").read_text()) | {
        "seconds": report["seconds"]
    }


def test_curate_without_raw_corpus_says_to_run_prepare(tmp_path):
    with pytest.raises(DataError, match="zaya prepare"):
        curate(make_cfg(tmp_path))
    assert not (tmp_path / "curated").exists()


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("data.curate.tasks=0", "data.curate.tasks"),
        ("data.curate.steps.minhash_dedup.num_buckets=0", "data.curate.steps.minhash_dedup.num_buckets"),
        ("data.executor.workers=0", "data.executor.workers"),
        ("data.curate.min_kept_docs=-1", "data.curate.min_kept_docs"),
    ],
)
def test_bad_config_fails_before_anything_runs(tmp_path, override, key):
    make_corpus(tmp_path / "raw")
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        curate(make_cfg(tmp_path, override))
    assert not (tmp_path / "logs").exists()


def test_english_tokenizer_matches_datatrove_spacy_tokenizer():
    from datatrove.utils.word_tokenizers import SpaCyTokenizer

    from zaya_pipeline.data.datatrove_parts import EnglishTokenizer

    texts = [
        "Hello, world! It's 3.14 -- isn't it?\nSecond line: e.g. U.S.A. and (brackets).",
        "SELECT * FROM t WHERE x = 'a';  -- a comment\n\n  indented  code();",
        "short",
        "",
        " ".join(WORDS[:50]),
    ]
    ref, fast = SpaCyTokenizer("en"), EnglishTokenizer(max_vocab=10)  # tiny vocab: exercises the rebuild
    for text in texts * 2:
        assert fast.word_tokenize(text) == ref.word_tokenize(text)
        assert fast.sent_tokenize(text) == ref.sent_tokenize(text)
        assert fast.span_tokenize(text) == ref.span_tokenize(text)
