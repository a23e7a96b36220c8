"""The tokenizer stage: byte-level BPE training, vocabulary padding, user tokenizer files, outputs."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from zaya_pipeline.config import load_config
from zaya_pipeline.data.tokenizer import in_sample, load_tokenizer, train_tokenizer, training_documents
from zaya_pipeline.errors import ConfigError, DataError

# fmt: off
WORDS = [
    "the", "table", "index", "query", "returns", "rows", "column", "select", "insert", "update", "delete",
    "where", "join", "transaction", "lock", "page", "schema", "value", "null", "integer", "text", "blob",
    "trigger", "view", "vacuum", "journal", "cursor", "naïve", "café", "Größe", "données", "数据库", "запрос",
    "ελληνικά",
]
# fmt: on


def make_docs(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [
        {
            "id": f"doc-{i}",
            "text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 80))),
            "metadata": {},
        }
        for i in range(n)
    ]


def write_jsonl_gz(path: Path, docs: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(d, ensure_ascii=False) + "\n" for d in docs)
    return path


def make_cfg(tmp: Path, *overrides: str):
    return load_config(
        [
            f"paths.curated={tmp}/curated",
            f"paths.tokenizer={tmp}/tokenizer",
            f"paths.reports={tmp}/reports",
            f"paths.logs={tmp}/logs",
            "tokenizer.vocab_size=400",
            *overrides,
        ]
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tok")
    docs = make_docs(200)
    write_jsonl_gz(tmp / "curated" / "00000.jsonl.gz", docs[:120])
    write_jsonl_gz(tmp / "curated" / "00001.jsonl.gz", docs[120:])
    summary = train_tokenizer(make_cfg(tmp))
    return tmp, docs, summary


def test_decode_inverts_encode_for_any_utf8(trained):
    tmp, _, _ = trained
    tok = Tokenizer.from_file(str(tmp / "tokenizer" / "tokenizer.json"))
    texts = [
        "  leading spaces, trailing\t\n",
        "never seen: Ωμέγα ✓ ☃ 🎉👩🏽‍💻 ∑∫√ \u00a0nbsp \u200bzero-width",
        "控制字符 \x00\x01\x7f and CRLF\r\n",
        "a page quoting <|endoftext|> and <|pad|> literally",
        "",
    ]
    for text in texts:
        assert tok.decode(tok.encode(text).ids, skip_special_tokens=False) == text


def test_vocab_is_padded_to_the_multiple_and_meta_names_the_special_ids(trained):
    tmp, docs, summary = trained
    tok = Tokenizer.from_file(str(tmp / "tokenizer" / "tokenizer.json"))
    meta = json.loads((tmp / "tokenizer" / "meta.json").read_text())
    size = tok.get_vocab_size()
    assert size % 64 == 0 and size == meta["vocab_size"] == summary["vocab_size"]
    assert meta["base_vocab_size"] < size, "the trained vocabulary should need padding in this test"
    assert sorted(tok.get_vocab(with_added_tokens=True).values()) == list(range(size))
    assert tok.token_to_id("<|unused_0|>") == meta["base_vocab_size"]
    assert meta["eos_id"] == tok.token_to_id("<|endoftext|>") and meta["eos_token"] == "<|endoftext|>"
    assert meta["pad_id"] == tok.token_to_id("<|pad|>") and meta["pad_id"] != meta["eos_id"]
    assert meta["source"] == "trained"
    assert meta["trained_on_docs"] == len(docs)
    assert meta["trained_on_chars"] == sum(len(d["text"]) for d in docs)
    report = json.loads((tmp / "reports" / "tokenizer.json").read_text())
    assert report["vocab_size"] == size and report["trained_on_docs"] == len(docs)
    assert 1.0 < report["sample_chars_per_token"] < 20.0
    assert not list((tmp / "tokenizer").parent.glob(".tokenizer.tmp-*")), "atomic_dir left its temp folder"


def test_load_tokenizer_returns_the_stage_output(trained, tmp_path):
    tmp, _, _ = trained
    tok, meta = load_tokenizer(tmp / "tokenizer")
    assert tok.get_vocab_size() == meta["vocab_size"] and tok.id_to_token(meta["eos_id"]) == meta["eos_token"]
    with pytest.raises(DataError, match=r"paths\.tokenizer.*zaya tokenizer"):
        load_tokenizer(tmp_path)


def test_training_is_deterministic(trained, tmp_path):
    tmp, _, _ = trained
    train_tokenizer(make_cfg(tmp, f"paths.tokenizer={tmp_path}/again", f"paths.reports={tmp_path}/reports"))
    first = (tmp / "tokenizer" / "tokenizer.json").read_bytes()
    assert (tmp_path / "again" / "tokenizer.json").read_bytes() == first


def test_max_train_docs_takes_the_first_documents_in_sorted_file_order(tmp_path):
    docs = make_docs(60, seed=1)
    write_jsonl_gz(tmp_path / "curated" / "b.jsonl.gz", docs[:30])  # written first, sorts second
    write_jsonl_gz(tmp_path / "curated" / "a.jsonl.gz", docs[30:])
    train_tokenizer(make_cfg(tmp_path, "tokenizer.max_train_docs=40"))
    meta = json.loads((tmp_path / "tokenizer" / "meta.json").read_text())
    first = docs[30:] + docs[:10]
    assert meta["trained_on_docs"] == 40
    assert meta["trained_on_chars"] == sum(len(d["text"]) for d in first)


def test_sample_fraction_spreads_the_training_sample_over_every_file(tmp_path):
    docs = make_docs(400, seed=3)
    write_jsonl_gz(tmp_path / "curated" / "a.jsonl.gz", docs[:200])
    write_jsonl_gz(tmp_path / "curated" / "b.jsonl.gz", docs[200:])
    cfg = make_cfg(tmp_path, "tokenizer.sample_fraction=0.25")
    sample = list(training_documents(cfg.paths.curated, cfg.tokenizer))
    ids = [d["id"] for d in sample]
    assert ids == [d["id"] for d in docs if in_sample(d, 0.25)], "the hash decides, in file order"
    assert 60 < len(ids) < 140 and {"a", "b"} == {"a" if int(i[4:]) < 200 else "b" for i in ids}
    assert set(ids) <= {d["id"] for d in docs if in_sample(d, 0.5)}, "a bigger sample contains a smaller one"
    train_tokenizer(cfg)
    meta = json.loads((tmp_path / "tokenizer" / "meta.json").read_text())
    assert meta["trained_on_docs"] == len(sample)
    assert meta["trained_on_chars"] == sum(len(d["text"]) for d in sample)
    capped = make_cfg(tmp_path, "tokenizer.sample_fraction=0.25", "tokenizer.max_train_docs=10")
    assert [d["id"] for d in training_documents(capped.paths.curated, capped.tokenizer)] == ids[:10]


def test_bos_token_takes_the_id_after_eos_and_pad(trained, tmp_path):
    tmp = trained[0]
    cfg = make_cfg(tmp_path, f"paths.curated={tmp}/curated", "tokenizer.bos_token='<|bos|>'")
    train_tokenizer(cfg)
    tok, meta = load_tokenizer(tmp_path / "tokenizer")
    assert (meta["eos_id"], meta["pad_id"], meta["bos_id"]) == (0, 1, 2) and meta["bos_token"] == "<|bos|>"
    assert tok.token_to_id("<|bos|>") == 2 and meta["vocab_size"] % 64 == 0
    assert json.loads((tmp / "tokenizer" / "meta.json").read_text())["bos_id"] is None, "off by default"
    user = _user_tokenizer(tmp_path / "user.json", ["<|endoftext|>"])
    user_cfg = make_cfg(
        tmp_path,
        f"paths.curated={tmp}/curated",
        f"paths.tokenizer={tmp_path}/user_tok",
        f"tokenizer.path={tmp_path}/user.json",
        "tokenizer.bos_token='<|bos|>'",
    )
    train_tokenizer(user_cfg)
    _, user_meta = load_tokenizer(tmp_path / "user_tok")
    assert (user_meta["pad_id"], user_meta["bos_id"]) == (user.get_vocab_size(), user.get_vocab_size() + 1)


def _user_tokenizer(path: Path, specials: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=specials, show_progress=False)
    tok.train_from_iterator([d["text"] for d in make_docs(50, seed=2)], trainer=trainer)
    tok.save(str(path))
    return tok


def test_user_tokenizer_is_validated_padded_and_copied(trained, tmp_path):
    curated = trained[0] / "curated"
    user = _user_tokenizer(tmp_path / "user.json", ["<|endoftext|>"])
    assert user.get_vocab_size() % 64 and user.token_to_id("<|pad|>") is None
    cfg = make_cfg(tmp_path, f"paths.curated={curated}", f"tokenizer.path={tmp_path}/user.json")
    train_tokenizer(cfg)
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer" / "tokenizer.json"))
    meta = json.loads((tmp_path / "tokenizer" / "meta.json").read_text())
    assert tok.get_vocab_size() % 64 == 0 and meta["vocab_size"] == tok.get_vocab_size()
    assert meta["source"] == f"{tmp_path}/user.json" and meta["trained_on_docs"] == 0
    assert meta["eos_id"] == user.token_to_id("<|endoftext|>")
    assert meta["pad_id"] == user.get_vocab_size(), "a missing pad token is added after the user's tokens"
    text = "the query returns rows"
    assert tok.encode(text).ids == user.encode(text).ids


def test_user_tokenizer_errors_name_the_key_and_the_file(trained, tmp_path):
    curated = trained[0] / "curated"
    missing = tmp_path / "nope.json"
    with pytest.raises(DataError, match=r"tokenizer\.path.*nope\.json"):
        train_tokenizer(make_cfg(tmp_path, f"paths.curated={curated}", f"tokenizer.path={missing}"))
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": {"type": "BPE", "vocab": ')
    with pytest.raises(DataError, match=r"tokenizer\.path.*bad\.json.*not a valid tokenizer"):
        train_tokenizer(make_cfg(tmp_path, f"paths.curated={curated}", f"tokenizer.path={bad}"))
    _user_tokenizer(tmp_path / "noeos.json", ["</s>"])
    with pytest.raises(DataError, match=r"no eos token '<\|endoftext\|>'.*tokenizer\.eos_token"):
        train_tokenizer(
            make_cfg(tmp_path, f"paths.curated={curated}", f"tokenizer.path={tmp_path}/noeos.json")
        )
    assert not (tmp_path / "tokenizer").exists(), "a failed run must not leave outputs"


def test_missing_empty_or_malformed_corpus_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match=r"paths\.curated.*does not exist"):
        train_tokenizer(make_cfg(tmp_path))
    (tmp_path / "curated").mkdir()
    with pytest.raises(DataError, match=r"no \*\.jsonl\.gz files"):
        train_tokenizer(make_cfg(tmp_path))
    path = write_jsonl_gz(tmp_path / "curated" / "x.jsonl.gz", make_docs(3))
    with gzip.open(path, "at") as f:
        f.write('{"id": "broken", "text": \n')
    with pytest.raises(DataError, match=r"x\.jsonl\.gz:4: malformed JSON"):
        train_tokenizer(make_cfg(tmp_path))


def test_bad_tokenizer_config_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"tokenizer\.vocab_size"):
        train_tokenizer(make_cfg(tmp_path, "tokenizer.vocab_size=100"))
    with pytest.raises(ConfigError, match=r"tokenizer\.eos_token"):
        train_tokenizer(make_cfg(tmp_path, "tokenizer.pad_token='<|endoftext|>'"))
    with pytest.raises(ConfigError, match=r"tokenizer\.bos_token \('<\|pad\|>'"):
        train_tokenizer(make_cfg(tmp_path, "tokenizer.bos_token='<|pad|>'"))
    with pytest.raises(ConfigError, match=r"tokenizer\.sample_fraction must be in \(0, 1\], got 0\.0"):
        train_tokenizer(make_cfg(tmp_path, "tokenizer.sample_fraction=0"))
