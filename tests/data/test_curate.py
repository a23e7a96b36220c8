"""curate stage: a real datatrove run over a generated corpus with planted duplicates and junk."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest

from zaya_pipeline.config import load_config
from zaya_pipeline.data.curate import curate
from zaya_pipeline.errors import ConfigError, DataError

STEPS = ["gopher_repetition", "gopher_quality", "c4_quality", "exact_dedup", "minhash_dedup"]


def pseudo_words(rng: random.Random, n: int) -> list[str]:
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]
    words = set()
    while len(words) < n:
        words.add("".join(rng.choice(syllables) for _ in range(rng.randint(2, 4))))
    return sorted(words)


def prose(rng: random.Random, vocab: list[str], sentences: int = 12) -> str:
    """Lines of three sentences each, with English stop words: passes the Gopher and C4 filters."""
    w = lambda: rng.choice(vocab)
    made = [
        f"The {w()} {w()} of the {w()} {w()} and {w()} to the {w()} {w()} {w()} with {w()}."
        for _ in range(sentences)
    ]
    return "\n".join(" ".join(made[i : i + 3]) for i in range(0, sentences, 3))


def make_corpus(raw: Path) -> dict[str, str]:
    """Three raw shards; returns what should happen to each planted document (id → step or 'kept')."""
    rng = random.Random(7)
    vocab = pseudo_words(rng, 400)
    good = {f"good-{i:02d}": prose(rng, vocab) for i in range(16)}
    a, b = prose(rng, vocab), prose(rng, vocab)
    # same text after normalisation: doubled spaces and other sentence punctuation
    a_copy = a.replace(" of the ", " of  the ").replace(". The", "! The")
    words = b.split(" ")
    words[40], words[80] = "zuzuzu", "kokoko"  # two words changed: a near duplicate
    b_near = " ".join(words)
    junk = {
        "junk-repeated": "\n".join(["Click here to subscribe to the newsletter and the offers."] * 20),
        "junk-short": "The " + " ".join(vocab[:40]) + " and the end.",  # < 50 words
        "junk-numbers": " ".join(str(1000 + 37 * i) for i in range(80)),
        "junk-lorem": prose(rng, vocab) + "\nLorem ipsum dolor sit amet, and the rest of the text.",
        "junk-no-sentences": prose(rng, vocab).replace(".", ""),
    }
    shards = {
        # all junk in the first shard: task 0 keeps nothing, which must not shift the later tasks' inputs
        "a_junk": junk,
        "b": {**{k: v for k, v in good.items() if int(k[-2:]) < 8}, "dup-a": a, "near-b": b},
        "c": {
            **{k: v for k, v in good.items() if int(k[-2:]) >= 8},
            "dup-a-copy": a_copy,
            "near-b-copy": b_near,
        },
    }
    raw.mkdir(parents=True)
    for name, docs in shards.items():
        with gzip.open(raw / f"{name}.jsonl.gz", "wt", encoding="utf-8") as f:
            for doc_id, text in docs.items():
                f.write(json.dumps({"id": doc_id, "text": text, "metadata": {"source": name}}) + "\n")
    return {
        "junk-repeated": "gopher_repetition",
        "junk-short": "gopher_quality",
        "junk-numbers": "gopher_quality",
        "junk-lorem": "c4_quality",
        "junk-no-sentences": "c4_quality",
    }


def make_cfg(tmp_path: Path, *overrides: str):
    paths = [f"paths.{k}={tmp_path}/{k}" for k in ("raw", "curated", "removed", "logs", "reports")]
    return load_config([*paths, *overrides])


def read_dir(folder: Path) -> list[dict]:
    records = []
    for path in sorted(folder.rglob("*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            records += [json.loads(line) for line in f]
    return records


@pytest.fixture
def corpus(tmp_path: Path) -> dict[str, str]:
    return make_corpus(tmp_path / "raw")


def test_curate_drops_junk_and_duplicates_and_accounts_for_every_document(tmp_path, corpus):
    # 3 tasks on 2 worker processes: the forkserver path, and dedup across shards
    summary = curate(make_cfg(tmp_path, "data.curate.tasks=3", "data.curate.workers=2"))
    kept = {r["id"]: r for r in read_dir(tmp_path / "curated")}
    removed = {r["id"]: r for r in read_dir(tmp_path / "removed")}
    raw = read_dir(tmp_path / "raw")

    assert len(raw) == len(kept) + len(removed) and not set(kept) & set(removed), "every document lands once"
    assert {f"good-{i:02d}" for i in range(16)} <= set(kept)
    assert len({"dup-a", "dup-a-copy"} & set(kept)) == 1, "one copy of the exact duplicate survives"
    assert len({"near-b", "near-b-copy"} & set(kept)) == 1, "one copy of the near duplicate survives"
    for doc_id, step in corpus.items():
        assert removed[doc_id]["metadata"]["curate_step"] == step, doc_id
    reasons = {doc_id: r["metadata"]["filter_reason"] for doc_id, r in removed.items()}
    assert reasons["junk-repeated"] == "dup_line_frac"
    assert reasons["junk-short"] == "gopher_short_doc"
    assert reasons["junk-numbers"] == "gopher_below_alpha_threshold"
    assert reasons["junk-lorem"] == "lorem_ipsum"
    assert reasons["junk-no-sentences"] == "too_few_sentences"
    assert {reasons[i] for i in removed if i.startswith("dup-a")} == {"exact_duplicate"}
    assert {reasons[i] for i in removed if i.startswith("near-b")} == {"near_duplicate"}
    # removed records keep their text and source; curated records are clean {"id", "text", "metadata"}
    assert removed["junk-lorem"]["text"].endswith("and the rest of the text.")
    assert all(
        set(r) == {"id", "text", "metadata"} and set(r["metadata"]) == {"source"} for r in kept.values()
    )
    assert "Lorem" not in " ".join(r["text"] for r in kept.values())

    report = json.loads((tmp_path / "reports" / "curate.json").read_text())
    assert [s["name"] for s in report["steps"]] == STEPS
    assert report["input_docs"] == len(raw) and report["output_docs"] == len(kept) == summary["output_docs"]
    assert report["input_docs"] == report["output_docs"] + sum(s["dropped"] for s in report["steps"])
    for s in report["steps"]:
        assert s["docs_in"] == s["kept"] + s["dropped"] and sum(s["reasons"].values()) == s["dropped"], s
    by_step = {s["name"]: s for s in report["steps"]}
    assert by_step["exact_dedup"]["reasons"] == {"exact_duplicate": 1}
    assert by_step["minhash_dedup"]["reasons"] == {"near_duplicate": 1}
    assert by_step["c4_quality"]["reasons"] == {"lorem_ipsum": 1, "too_few_sentences": 1}
    assert report["by_source"]["a_junk"] == {
        "input_docs": 5,
        "output_docs": 0,
        "dropped": {"c4_quality": 2, "gopher_quality": 2, "gopher_repetition": 1},
    }
    assert report["chars_out"] == sum(len(r["text"]) for r in kept.values()) < report["chars_in"]
    assert 0 < report["words_out"] < report["words_in"]
    assert (tmp_path / "logs" / "curate" / "00_pass_0" / "stats.json").is_file()
    assert not list(tmp_path.glob(".curate-work-*")), "intermediate shards are cleaned up"


def snapshot(folder: Path) -> dict[str, bytes]:
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    return {f"{folder.name}/{p.relative_to(folder).as_posix()}": p.read_bytes() for p in files}


def test_rerun_gives_identical_bytes_and_other_params_redo_the_work(tmp_path, corpus):
    curate(make_cfg(tmp_path, "data.curate.tasks=1", "data.curate.workers=1"))
    first = snapshot(tmp_path / "curated") | snapshot(tmp_path / "removed")
    assert "removed/minhash_dedup/00000.jsonl.gz" in first
    curate(make_cfg(tmp_path, "data.curate.tasks=1", "data.curate.workers=1"))
    assert snapshot(tmp_path / "curated") | snapshot(tmp_path / "removed") == first
    summary = curate(
        make_cfg(
            tmp_path,
            "data.curate.tasks=1",
            "data.curate.workers=1",
            "data.curate.minhash=false",
            "data.curate.exact_dedup=false",
            "data.curate.c4_quality=false",
        )
    )
    kept = {r["id"] for r in read_dir(tmp_path / "curated")}
    assert {"dup-a", "dup-a-copy", "near-b", "near-b-copy", "junk-lorem", "junk-no-sentences"} <= kept
    assert sorted(p.name for p in (tmp_path / "removed").iterdir()) == ["gopher_quality", "gopher_repetition"]
    assert sorted(p.name for p in (tmp_path / "logs" / "curate").iterdir()) == ["00_pass_0"], (
        "stale logs left"
    )
    report = json.loads((tmp_path / "reports" / "curate.json").read_text())
    assert [s["name"] for s in report["steps"]] == ["gopher_repetition", "gopher_quality"]
    assert summary["output_docs"] == len(kept) == report["input_docs"] - 3


def test_curate_without_raw_corpus_says_to_run_prepare(tmp_path):
    with pytest.raises(DataError, match="zaya prepare"):
        curate(make_cfg(tmp_path))
    assert not (tmp_path / "curated").exists()


def test_curate_rejects_zero_tasks(tmp_path, corpus):
    with pytest.raises(ConfigError, match="data.curate.tasks"):
        curate(make_cfg(tmp_path, "data.curate.tasks=0"))


def test_english_tokenizer_matches_datatrove_spacy_tokenizer():
    from datatrove.utils.word_tokenizers import SpaCyTokenizer

    from zaya_pipeline.data.steps import EnglishTokenizer

    texts = [
        "Hello, world! It's 3.14 -- isn't it?\nSecond line: e.g. U.S.A. and (brackets).",
        "SELECT * FROM t WHERE x = 'a';  -- a comment\n\n  indented  code();",
        "short",
        "",
    ]
    ref, fast = SpaCyTokenizer("en"), EnglishTokenizer(max_vocab=10)  # tiny vocab: exercises the rebuild
    for text in texts * 2:
        assert fast.word_tokenize(text) == ref.word_tokenize(text)
        assert fast.sent_tokenize(text) == ref.sent_tokenize(text)
        assert fast.span_tokenize(text) == ref.span_tokenize(text)
