"""curate refuses, before it replaces anything, a kept corpus too little to train on (data/trainable.py)."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
from test_curate import SHORT, make_cfg, make_corpus, outputs, read_dir, snapshot

from zaya_pipeline.config import load_config
from zaya_pipeline.data.curate import curate
from zaya_pipeline.data.trainable import Splits, problems, top_drops
from zaya_pipeline.errors import DataError

ONE_TASK = ("data.curate.tasks=1", *SHORT)


def results(tmp: Path) -> dict[str, bytes]:
    """Every output of a curate run: the kept and removed shards, the metrics, plots and report."""
    return outputs(tmp) | snapshot(tmp / "reports")


def refusal(tmp: Path, *overrides: str) -> str:
    with pytest.raises(DataError) as err:
        curate(make_cfg(tmp, *ONE_TASK, *overrides))
    msg = str(err.value)
    assert "\n" not in msg, "one line"
    return msg


def test_filters_that_drop_everything_stop_curate_and_leave_the_last_outputs(tmp_path):
    make_corpus(tmp_path / "raw")
    n = len(read_dir(tmp_path / "raw"))
    curate(make_cfg(tmp_path, *ONE_TASK))
    before = results(tmp_path)
    assert "curated/00000.jsonl.gz" in before and "reports/curate.json" in before

    msg = refusal(tmp_path, "data.curate.min_kept_docs=100", "data.curate.steps.length.min_words=100000")
    assert msg.startswith(f"curate kept 0 of {n} documents, too little to train on: ")
    assert "fewer than data.curate.min_kept_docs=100 documents" in msg
    assert "the train and val splits would be empty (data.tokenize.val_fraction=0.5" in msg
    assert f"Dropped most: length {n} (too_few_words {n})" in msg, "the step, its count and its reason"
    assert "data.curate.steps.length.*" in msg and "data.curate.min_kept_docs" in msg
    assert f"{tmp_path}/curated and {tmp_path}/removed were left as they were" in msg
    assert results(tmp_path) == before, "a refused run replaced or removed an output"


def test_a_refused_run_resumes_under_a_lower_threshold_and_names_each_shortfall(tmp_path):
    """The filters' work is kept: other early-check keys, or a lower min_kept_docs, only re-run the check."""
    make_corpus(tmp_path / "raw")
    n = len(read_dir(tmp_path / "raw"))
    msg = refusal(tmp_path, "data.curate.min_kept_docs=100")
    kept = int(re.match(rf"curate kept (\d+) of {n} documents", msg).group(1))
    assert 0 < kept < 100 and "fewer than data.curate.min_kept_docs=100 documents" in msg
    assert "split" not in msg.split(". Dropped most")[0], "both splits hold documents at val_fraction 0.5"
    # the steps that dropped the most, by count, each with its reasons and its key
    drops = re.search(r"Dropped most: (.*); loosen those steps", msg).group(1)
    assert drops.split("; ")[0].startswith(("fineweb_quality 2 (", "gopher_repetition 2 (")), drops
    assert "data.curate.steps.gopher_repetition.*" in msg and "data.curate.steps.fineweb_quality.*" in msg
    assert not (tmp_path / "curated").exists(), "no output appeared"
    marker = tmp_path / "logs" / "curate" / "00_pass_0" / "completions" / "00000"
    done = marker.stat().st_mtime_ns

    msg = refusal(tmp_path, "data.tokenize.val_fraction=1e-9")
    assert "the val split would be empty (data.tokenize.val_fraction=1e-09" in msg
    assert "or change data.curate.min_kept_docs, data.tokenize.val_fraction." in msg
    msg = refusal(tmp_path, "train.seq_len=100000")
    estimate = "tokens (estimated as 1 per UTF-8 byte + 2 per document), fewer than the 1,600,001 of one"
    assert re.search(r"the train split would hold at most [\d,]+ " + re.escape(estimate), msg), msg
    assert "of one batch (16 sequences (train.micro_batch) x train.seq_len=100000 + 1)" in msg
    assert "the val split would hold at most" in msg and "train.micro_batch, train.seq_len" in msg

    summary = curate(make_cfg(tmp_path, *ONE_TASK, "data.curate.min_kept_docs=1"))
    assert summary["output_docs"] == kept == len(read_dir(tmp_path / "curated"))
    assert marker.stat().st_mtime_ns == done, "the passes ran again instead of resuming"


def _splits(train_docs: int, train_bytes: int, val_docs: int = 1, val_bytes: int = 1000) -> Splits:
    return Splits(Counter(train=train_docs, val=val_docs), Counter(train=train_bytes, val=val_bytes))


def test_one_batch_is_the_bound_not_more():
    """16 sequences of 128 tokens take 16 * 128 + 1 = 2,049 tokens; the bound is bytes + 2 per document."""
    cfg = load_config(["data.curate.min_kept_docs=2"])
    assert problems(cfg, 2, _splits(1, 2049 - 2)) == ([], ["data.curate.min_kept_docs"])
    found, keys = problems(cfg, 2, _splits(1, 2049 - 3))
    assert found == [
        "the train split would hold at most 2,048 tokens (estimated as 1 per UTF-8 byte + 2 per document), "
        "fewer than the 2,049 of one batch (16 sequences (train.micro_batch) x train.seq_len=128 + 1)"
    ]
    assert keys == ["data.curate.min_kept_docs", "train.micro_batch", "train.seq_len"]
    cfg = load_config(["data.curate.min_kept_docs=2", "train.global_batch=64"])
    found, keys = problems(cfg, 2, _splits(1, 2049))
    assert "(64 sequences (train.global_batch)" in found[0] and "train.global_batch" in keys
    found, _ = problems(cfg, 2, _splits(100, 10**6, val_docs=1, val_bytes=100))
    assert found == [
        "the val split would hold at most 102 tokens (estimated as 1 per UTF-8 byte + 2 per document), "
        "fewer than the 129 of one sequence (train.seq_len=128 + 1)"
    ]
    assert problems(cfg, 1, _splits(100, 10**6))[0] == ["fewer than data.curate.min_kept_docs=2 documents"]


def test_the_steps_named_are_those_that_dropped_the_most():
    steps = [
        {"name": "normalize", "dropped": 0, "reasons": {}},
        {"name": "length", "dropped": 5, "reasons": {"too_few_words": 4, "too_many_words": 1}},
        {"name": "gopher_quality", "dropped": 9, "reasons": {"a": 6, "b": 2, "c": 1}},
        {"name": "c4_quality", "dropped": 1, "reasons": {"lorem_ipsum": 1}},
        {"name": "exact_dedup", "dropped": 2, "reasons": {"exact_duplicate": 2}},
        {"name": "custom", "dropped": 1, "reasons": {}},
    ]
    named, keys = top_drops(steps)
    assert named == "gopher_quality 9 (a 6, b 2, 1 more); length 5 (too_few_words 4, too_many_words 1); " + (
        "exact_dedup 2 (exact_duplicate 2)"
    )
    assert keys == [f"data.curate.steps.{s}.*" for s in ("gopher_quality", "length", "exact_dedup")]
    assert top_drops(steps[:1]) == ("", [])
    assert top_drops(steps[-1:]) == ("custom 1", ["data.curate.steps.custom.*"])
