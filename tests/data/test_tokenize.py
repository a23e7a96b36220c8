"""The tokenize stage: deterministic split, datatrove shards, meta.json counts, unigram baseline, errors."""

from __future__ import annotations

import gzip
import json
import math
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from zaya_pipeline.config import load_config
from zaya_pipeline.data.loader import load_split
from zaya_pipeline.data.tokenize import split_of, tokenize
from zaya_pipeline.data.tokenizer import train_tokenizer
from zaya_pipeline.errors import ConfigError, DataError

WORDS = ["the", "table", "index", "query", "returns", "rows", "where", "join", "naïve", "数据库", "запрос"]
VAL_FRACTION = 0.2


def make_docs(n: int) -> list[dict]:
    rng = random.Random(0)
    docs = [
        {
            "id": f"doc-{i}",
            "text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 60))),
            "metadata": {},
        }
        for i in range(n)
    ]
    docs[min(7, n - 1)]["text"] = (
        "this page quotes <|endoftext|> in its text, which must not end the document"
    )
    return docs


def write_jsonl_gz(path: Path, docs: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(d, ensure_ascii=False) + "\n" for d in docs)


def make_cfg(tmp: Path, *overrides: str):
    return load_config(
        [
            f"paths.curated={tmp}/curated",
            f"paths.tokenizer={tmp}/tokenizer",
            f"paths.tokens={tmp}/tokens",
            f"paths.reports={tmp}/reports",
            f"paths.logs={tmp}/logs",
            "tokenizer.vocab_size=300",
            f"data.tokenize.val_fraction={VAL_FRACTION}",
            "data.tokenize.split_seed=3",
            *overrides,
        ]
    )


def read_docs(split_dir: Path, dtype: str) -> list[list[int]]:
    """Every document in a split folder, from the .ds files and their .ds.index document ends."""
    docs = []
    for shard in sorted(split_dir.glob("*.ds")):
        tokens = np.fromfile(shard, dtype=np.dtype(dtype).newbyteorder("<")).tolist()
        ends = np.fromfile(f"{shard}.index", dtype="<u8").tolist()
        docs += [tokens[a:b] for a, b in zip([0, *ends[:-1]], ends, strict=True)]
    return docs


@pytest.fixture(scope="module")
def stage(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tokenize")
    docs = make_docs(150)
    write_jsonl_gz(tmp / "curated" / "00000.jsonl.gz", docs[:90])
    write_jsonl_gz(tmp / "curated" / "00001.jsonl.gz", docs[90:])
    cfg = make_cfg(tmp)
    train_tokenizer(cfg)
    summary = tokenize(cfg)
    tok = Tokenizer.from_file(str(tmp / "tokenizer" / "tokenizer.json"))
    meta = json.loads((tmp / "tokens" / "meta.json").read_text())
    return tmp, cfg, docs, tok, meta, summary


def test_split_is_deterministic_and_holds_out_the_val_fraction():
    ids = [f"page-{i}" for i in range(20_000)]
    splits = [split_of(i, 0.1, seed=0) for i in ids]
    assert splits == [split_of(i, 0.1, seed=0) for i in ids]
    assert abs(splits.count("val") / len(ids) - 0.1) < 0.01
    other_seed = [split_of(i, 0.1, seed=1) for i in ids]
    assert other_seed != splits and abs(other_seed.count("val") / len(ids) - 0.1) < 0.01


def test_shards_hold_every_document_once_in_its_split_ending_with_eos(stage):
    tmp, _, docs, tok, meta, _ = stage
    eos = meta["eos_id"]
    for split in ("train", "val"):
        shard_docs = read_docs(tmp / "tokens" / split, meta["token_dtype"])
        for ids in shard_docs:
            assert ids[-1] == eos and eos not in ids[:-1], "one eos per document, at its end"
        decoded = Counter(tok.decode(ids[:-1], skip_special_tokens=False) for ids in shard_docs)
        expected = Counter(d["text"] for d in docs if split_of(d["id"], VAL_FRACTION, 3) == split)
        assert decoded == expected
    n_val = meta["splits"]["val"]["docs"]
    assert n_val + meta["splits"]["train"]["docs"] == len(docs)
    assert 0.1 < n_val / len(docs) < 0.3


def test_meta_counts_match_the_shards_and_the_text(stage):
    tmp, _, docs, _, meta, summary = stage
    assert meta["token_dtype"] == "uint16" and meta["vocab_size"] % 64 == 0
    for split in ("train", "val"):
        counts = meta["splits"][split]
        files = sorted((tmp / "tokens" / split).glob("*.ds"))
        assert (
            counts["tokens"]
            == sum(f.stat().st_size for f in files) // 2
            == len(load_split(tmp / "tokens", split))
        )
        texts = [d["text"] for d in docs if split_of(d["id"], VAL_FRACTION, 3) == split]
        assert counts["docs"] == len(texts)
        assert counts["bytes"] == sum(len(t.encode("utf-8")) for t in texts)
    assert summary["train_tokens"] == meta["splits"]["train"]["tokens"]
    report = json.loads((tmp / "reports" / "tokenize.json").read_text())
    assert report["splits"] == meta["splits"]


def test_unigram_baseline_is_the_smoothed_train_unigram_cross_entropy(stage):
    tmp, _, _, _, meta, _ = stage
    train, val, vocab = (
        load_split(tmp / "tokens", "train"),
        load_split(tmp / "tokens", "val"),
        meta["vocab_size"],
    )
    counts = Counter(train.tolist())
    expected = -sum(math.log((counts[t] + 1) / (len(train) + vocab)) for t in val.tolist()) / len(val)
    assert meta["unigram_val_nats_per_token"] == pytest.approx(expected, abs=1e-5)
    assert meta["unigram_val_nats_per_token"] < math.log(vocab), "must beat the uniform distribution"


def test_rerun_rewrites_identical_shards(stage):
    tmp, cfg, _, _, meta, _ = stage
    before = {p.name: p.read_bytes() for p in sorted((tmp / "tokens").rglob("*.ds*"))}
    assert (tmp / "logs" / "tokenize" / "train" / "completions").is_dir(), "completion markers exist to clear"
    tokenize(cfg)
    after = {p.name: p.read_bytes() for p in sorted((tmp / "tokens").rglob("*.ds*"))}
    assert after == before and json.loads((tmp / "tokens" / "meta.json").read_text()) == meta


def test_zaya1_sized_vocab_writes_uint32_tokens(stage, tmp_path):
    src, _, docs, tok, _, _ = stage
    cfg = make_cfg(
        tmp_path,
        f"paths.curated={src}/curated",
        f"tokenizer.path={src}/tokenizer/tokenizer.json",
        "tokenizer.pad_to_multiple=262272",  # ZAYA1's vocabulary; > 65,536 ids: 4-byte tokens
        "data.tokenize.shuffle=false",
    )
    train_tokenizer(cfg)
    tokenize(cfg)
    meta = json.loads((tmp_path / "tokens" / "meta.json").read_text())
    assert meta["vocab_size"] == 262272 and meta["token_dtype"] == "uint32"
    train = load_split(tmp_path / "tokens", "train")
    assert train.dtype == np.uint32 and len(train) == meta["splits"]["train"]["tokens"]
    assert sum(f.stat().st_size for f in (tmp_path / "tokens" / "train").glob("*.ds")) == 4 * len(train)
    first = next(d for d in docs if split_of(d["id"], VAL_FRACTION, 3) == "train")  # unshuffled: file order
    ids = tok.encode(first["text"]).ids + [meta["eos_id"]]
    assert train[: len(ids)].tolist() == ids


def test_bos_token_starts_every_document(stage, tmp_path):
    src, _, docs, _, _, _ = stage
    cfg = make_cfg(tmp_path, f"paths.curated={src}/curated", "tokenizer.bos_token='<|bos|>'")
    train_tokenizer(cfg)
    tokenize(cfg)
    meta = json.loads((tmp_path / "tokens" / "meta.json").read_text())
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer" / "tokenizer.json"))
    bos, eos = meta["bos_id"], meta["eos_id"]
    assert bos == tok.token_to_id("<|bos|>") and bos != eos
    shard_docs = read_docs(tmp_path / "tokens" / "train", meta["token_dtype"])
    assert all(d[0] == bos and d[-1] == eos and bos not in d[1:] for d in shard_docs)
    decoded = Counter(tok.decode(d[1:-1], skip_special_tokens=False) for d in shard_docs)
    assert decoded == Counter(d["text"] for d in docs if split_of(d["id"], VAL_FRACTION, 3) == "train")
    assert stage[4]["bos_id"] is None, "no bos by default"


def test_more_tasks_than_files_leaves_no_empty_shards(stage, tmp_path):
    src = stage[0]
    cfg = make_cfg(tmp_path, f"paths.curated={src}/curated", f"paths.tokenizer={src}/tokenizer")
    cfg.data.tokenize.tasks = 3  # 2 input files: one task reads nothing
    tokenize(cfg)
    meta = json.loads((tmp_path / "tokens" / "meta.json").read_text())
    assert meta["splits"] == stage[4]["splits"]
    assert all(f.stat().st_size for f in (tmp_path / "tokens").rglob("*.ds"))


def test_inputs_missing_or_too_small_are_data_errors(stage, tmp_path):
    src = stage[0]
    with pytest.raises(DataError, match=r"no tokenizer.*paths\.tokenizer"):
        tokenize(make_cfg(tmp_path, f"paths.curated={src}/curated"))
    (tmp_path / "curated").mkdir()
    with pytest.raises(DataError, match=r"no \*\.jsonl\.gz files.*paths\.curated"):
        tokenize(make_cfg(tmp_path, f"paths.tokenizer={src}/tokenizer"))
    write_jsonl_gz(tmp_path / "curated" / "0.jsonl.gz", make_docs(2))
    with pytest.raises(DataError, match=r"val split is empty.*val_fraction"):
        tokenize(make_cfg(tmp_path, f"paths.tokenizer={src}/tokenizer", "data.tokenize.val_fraction=0.001"))
    assert not (tmp_path / "tokens").exists(), "a failed run must not leave outputs"
    with pytest.raises(ConfigError, match=r"data\.tokenize\.val_fraction"):
        tokenize(make_cfg(tmp_path, f"paths.tokenizer={src}/tokenizer", "data.tokenize.val_fraction=0"))
