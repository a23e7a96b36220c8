"""The tokenizer stage: a byte-level BPE trained on the curated corpus, or a user's ``tokenizer.json``.

``tokenizer.path`` may also name a tokenizer folder (``tokenizer.json`` + ``meta.json``: this stage's output,
or what ``zaya import`` writes) or a transformers ``zaya`` model folder (ZAYA1's: config.json, tokenizer.json,
tokenizer_config.json). Either is taken as it is, padded to the model's vocabulary, with the special tokens
it names (``tokenizer.eos_token`` and the other ``tokenizer.*`` keys do not apply then).

Outputs (``paths.tokenizer``, written atomically)::

    tokenizer.json   HF ``tokenizers`` file; its size is a multiple of ``tokenizer.pad_to_multiple``
    meta.json        vocab_size, eos_id, pad_id, bos_id (None without tokenizer.bos_token), the token strings,
                     source, trained_on_docs, ...

and the DVC metrics file ``paths.reports/tokenizer.json``. The model's embedding takes exactly ``vocab_size``
rows, so the vocabulary is padded with never-produced special tokens (``<|unused_N|>``) to a size that tiles
well on accelerators. A big corpus is sampled (``tokenizer.sample_fraction``: documents picked by a hash of
their id, so the sample spreads over every file; ``tokenizer.max_train_docs`` caps it).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from zaya_pipeline.config import TokenizerConfig, ZayaConfig
from zaya_pipeline.data.text_io import iter_documents
from zaya_pipeline.errors import ConfigError, DataError, first_line
from zaya_pipeline.hf_config import hf_value, is_hf_folder, read_config
from zaya_pipeline.progress import Progress, stderr_is_terminal
from zaya_pipeline.utils import (
    atomic_dir,
    get_logger,
    read_json,
    remove_outputs,
    round_up,
    set_project_env,
    write_json,
)

log = get_logger("tokenizer")

UNUSED_TOKEN = "<|unused_{}|>"
COMPRESSION_SAMPLE_DOCS = 256  # documents encoded to measure characters per token
BYTE_ALPHABET = 256


def train_tokenizer(cfg: ZayaConfig) -> dict:
    """Train (or validate and copy) the tokenizer; write tokenizer.json, meta.json and the metrics file."""
    set_project_env()
    tcfg = cfg.tokenizer
    _check_config(tcfg)
    out_dir, report = Path(cfg.paths.tokenizer), Path(cfg.paths.reports) / "tokenizer.json"
    start = time.perf_counter()
    tok, meta = _tokenizer_and_meta(tcfg, cfg.paths.curated)
    docs, chars, base_size = meta["trained_on_docs"], meta["trained_on_chars"], meta["base_vocab_size"]
    seconds = time.perf_counter() - start
    sample_docs, sample_chars, sample_tokens = _compression_sample(tok, cfg.paths.curated)
    remove_outputs(report)  # only now: a run that failed before this leaves the previous outputs
    with atomic_dir(out_dir) as tmp:
        tok.save(str(tmp / "tokenizer.json"))
        write_json(tmp / "meta.json", meta)
    metrics = {
        "vocab_size": meta["vocab_size"],
        "base_vocab_size": base_size,
        "trained_on_docs": docs,
        "trained_on_chars": chars,
        "sample_docs": sample_docs,
        "sample_chars_per_token": round(sample_chars / max(sample_tokens, 1), 4),
        "seconds": round(seconds, 2),
    }
    write_json(report, metrics)
    log.info(
        "wrote %s (vocab %d, %.2f chars/token)",
        out_dir,
        meta["vocab_size"],
        metrics["sample_chars_per_token"],
    )
    return {k: metrics[k] for k in ("vocab_size", "trained_on_docs", "sample_chars_per_token", "seconds")}


def _tokenizer_and_meta(tcfg: TokenizerConfig, curated: str) -> tuple[Tokenizer, dict]:
    """The tokenizer the stage writes and its meta.json: a given folder as it is, or a given tokenizer.json
    or one trained on the curated corpus, padded to ``tokenizer.pad_to_multiple``."""
    if tcfg.path and is_hf_folder(Path(tcfg.path)):  # a transformers zaya model folder (e.g. ZAYA1's)
        folder = Path(tcfg.path)
        config = read_config(folder)
        tok, meta = tokenizer_from_hf(folder, config, int(hf_value(config, "vocab_size")))
        return tok, {**meta, "source": tcfg.path, "trained_on_docs": 0, "trained_on_chars": 0}
    if tcfg.path and Path(tcfg.path).is_dir():
        tok, meta = load_tokenizer_folder(Path(tcfg.path))
        base = meta.get("base_vocab_size", meta["vocab_size"])
        return tok, {
            **meta,
            "base_vocab_size": base,
            "source": tcfg.path,
            "trained_on_docs": 0,
            "trained_on_chars": 0,
        }
    if tcfg.path:
        tok, docs, chars, source = load_user_tokenizer(tcfg), 0, 0, tcfg.path
    else:
        counter = _Counter(training_documents(curated, tcfg))
        tok = train_bpe(counter, tcfg)
        docs, chars, source = counter.docs, counter.chars, "trained"
        if not docs:
            raise DataError(f"the curated corpus {curated} (paths.curated) holds no documents")
        log.info("trained BPE on %d documents (%d chars): %d tokens", docs, chars, tok.get_vocab_size())
    base_size = tok.get_vocab_size()
    pad_vocab(tok, tcfg.pad_to_multiple)
    return tok, {
        "vocab_size": tok.get_vocab_size(),
        "base_vocab_size": base_size,
        "eos_id": tok.token_to_id(tcfg.eos_token),
        "pad_id": tok.token_to_id(tcfg.pad_token),
        "bos_id": tok.token_to_id(tcfg.bos_token) if tcfg.bos_token else None,
        "eos_token": tcfg.eos_token,
        "pad_token": tcfg.pad_token,
        "bos_token": tcfg.bos_token,
        "source": source,
        "trained_on_docs": docs,
        "trained_on_chars": chars,
    }


def in_sample(doc: dict, fraction: float) -> bool:
    """Whether a curated document is in the tokenizer's training sample: a stable hash of its id (of its text
    when it has none) below ``fraction``."""
    key = str(doc["id"]) if doc.get("id") is not None else doc["text"]
    digest = hashlib.blake2b(key.encode(), digest_size=8, person=b"zaya-bpe").digest()
    return int.from_bytes(digest, "little") < fraction * 2**64


def training_documents(curated: str | Path, tcfg: TokenizerConfig) -> Iterator[dict]:
    """The curated documents the BPE learns from, in file order: the sample, then the first max_train_docs."""
    docs = iter_documents(curated)
    if tcfg.sample_fraction < 1.0:
        docs = (d for d in docs if in_sample(d, tcfg.sample_fraction))
    return islice(docs, tcfg.max_train_docs) if tcfg.max_train_docs else docs


def train_bpe(texts: Iterable[str], tcfg: TokenizerConfig) -> Tokenizer:
    """Byte-level BPE: every byte is in the alphabet and nothing is normalized, so decoding is exact."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=tcfg.vocab_size,
        min_frequency=tcfg.min_frequency,
        special_tokens=special_tokens(tcfg),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=stderr_is_terminal(),  # the BPE merges' own bar, on a terminal only
    )
    tok.train_from_iterator(texts, trainer=trainer)
    if tok.get_vocab_size() < tcfg.vocab_size:
        log.warning(
            "corpus too small for tokenizer.vocab_size=%d: got %d", tcfg.vocab_size, tok.get_vocab_size()
        )
    return tok


def load_user_tokenizer(tcfg: TokenizerConfig) -> Tokenizer:
    """Read ``tokenizer.path``; it must parse and hold the eos token. Missing pad / bos tokens are added."""
    path = Path(tcfg.path)
    if not path.is_file():
        raise DataError(f"tokenizer.path: file {path} does not exist")
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust side raises a bare Exception for any parse error
        raise DataError(f"tokenizer.path: {path} is not a valid tokenizer.json ({exc})") from None
    if tok.token_to_id(tcfg.eos_token) is None:
        raise DataError(
            f"tokenizer.path: {path} has no eos token {tcfg.eos_token!r}; set tokenizer.eos_token to the "
            "end-of-document token of that tokenizer"
        )
    ids = tok.get_vocab(with_added_tokens=True).values()
    if max(ids) + 1 != tok.get_vocab_size():
        raise DataError(
            f"tokenizer.path: {path} has gaps in its token ids (max id {max(ids)}, {len(ids)} tokens)"
        )
    for name in special_tokens(tcfg)[1:]:
        if tok.token_to_id(name) is None:
            log.info("%s has no token %r: adding it", path, name)
            tok.add_special_tokens([name])
    return tok


META_KEYS = ("vocab_size", "eos_id", "eos_token", "pad_id", "pad_token", "bos_id", "bos_token")


def load_tokenizer_folder(folder: Path) -> tuple[Tokenizer, dict]:
    """A finished tokenizer folder (``tokenizer.path`` set to a folder): its tokenizer.json and meta.json,
    checked against each other (size, special token ids)."""
    tok, meta = load_tokenizer(folder, key="tokenizer.path")
    missing = [k for k in META_KEYS if k not in meta]
    if missing:
        raise DataError(f"tokenizer.path: {folder}/meta.json lacks {', '.join(missing)}")
    if meta["vocab_size"] != tok.get_vocab_size():
        raise DataError(
            f"tokenizer.path: {folder}/meta.json says vocab_size {meta['vocab_size']}, its tokenizer.json "
            f"holds {tok.get_vocab_size()} tokens"
        )
    for role in ("eos", "pad", "bos"):
        token, token_id = meta[f"{role}_token"], meta[f"{role}_id"]
        if (token or token_id is not None) and tok.token_to_id(token or "") != token_id:
            raise DataError(
                f"tokenizer.path: {folder}/meta.json: {role}_token {token!r} is not id {token_id} of its "
                "tokenizer.json"
            )
    return tok, {k: v for k, v in meta.items() if k not in ("trained_on_docs", "trained_on_chars")}


def tokenizer_from_hf(folder: Path, config: dict, vocab_size: int) -> tuple[Tokenizer, dict]:
    """The tokenizer of a transformers model folder as a finished tokenizer folder's contents: its
    tokenizer.json padded with unused tokens to the model's ``vocab_size``, and meta.json. The special
    tokens are tokenizer_config.json's (or special_tokens_map.json's) ``eos_token`` / ``bos_token`` /
    ``pad_token``, else the ids config.json gives; eos separates the documents when tokenizing."""
    path = folder / "tokenizer.json"
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust side raises a bare Exception for any parse error
        raise DataError(f"{path}: not a valid tokenizer.json ({first_line(exc)})") from None
    named: dict = {}
    for name in ("special_tokens_map.json", "tokenizer_config.json"):  # the second wins
        if (folder / name).is_file():
            try:
                named |= {k: v for k, v in read_json(folder / name).items() if k.endswith("_token")}
            except (ValueError, AttributeError) as exc:
                raise DataError(f"{folder / name}: not a JSON object ({first_line(exc)})") from None
    meta: dict = {"base_vocab_size": tok.get_vocab_size()}
    for role in ("eos", "pad", "bos"):
        token = named.get(f"{role}_token")
        token = token.get("content") if isinstance(token, dict) else token
        token_id = hf_value(config, f"{role}_token_id")
        if isinstance(token_id, list):  # several end tokens: the first ends a document
            token_id = token_id[0] if token_id else None
        if token is None and token_id is not None:
            token = tok.id_to_token(int(token_id))
        token_id = tok.token_to_id(token) if token is not None else None
        if token is not None and token_id is None:
            raise DataError(f"{folder}: its {role} token {token!r} is not in {path}")
        meta[f"{role}_token"], meta[f"{role}_id"] = token or "", token_id
    if meta["eos_id"] is None:
        raise DataError(f"{folder}: no eos token (tokenizer_config.json eos_token, config.json eos_token_id)")
    if tok.get_vocab_size() > vocab_size:
        raise DataError(
            f"{path}: {tok.get_vocab_size()} tokens, more than the model's vocab_size {vocab_size}"
        )
    pad_to_size(tok, vocab_size)
    meta["vocab_size"] = tok.get_vocab_size()
    return tok, meta


def special_tokens(tcfg: TokenizerConfig) -> list[str]:
    """eos, pad and (when configured) bos, in the order they take ids."""
    return [tcfg.eos_token, tcfg.pad_token] + ([tcfg.bos_token] if tcfg.bos_token else [])


def pad_vocab(tok: Tokenizer, multiple: int) -> int:
    """Append unused special tokens until the size is a multiple of ``multiple``; return how many."""
    added = pad_to_size(tok, round_up(tok.get_vocab_size(), multiple))
    assert tok.get_vocab_size() % multiple == 0, "added tokens must take fresh ids"
    return added


def pad_to_size(tok: Tokenizer, size: int) -> int:
    """Append unused special tokens until the tokenizer holds ``size`` tokens; return how many."""
    missing = size - tok.get_vocab_size()
    vocab = tok.get_vocab(with_added_tokens=True)
    names: list[str] = []
    i = 0
    while len(names) < missing:
        if (name := UNUSED_TOKEN.format(i)) not in vocab:
            names.append(name)
        i += 1
    if names:
        tok.add_special_tokens(names)
    assert tok.get_vocab_size() == size, "added tokens must take fresh ids"
    return len(names)


def load_tokenizer(tokenizer_dir: str | Path, key: str = "paths.tokenizer") -> tuple[Tokenizer, dict]:
    """A tokenizer folder (the stage's output, for later stages): the tokenizer and its meta.json."""
    tokenizer_dir = Path(tokenizer_dir)
    path, meta_path = tokenizer_dir / "tokenizer.json", tokenizer_dir / "meta.json"
    if not (path.is_file() and meta_path.is_file()):
        hint = (
            "run `zaya tokenizer` first"
            if key == "paths.tokenizer"
            else "expected tokenizer.json + meta.json"
        )
        raise DataError(f"no tokenizer in {tokenizer_dir} ({key}): {hint}")
    try:
        return Tokenizer.from_file(str(path)), read_json(meta_path)
    except Exception as exc:  # the Rust side raises a bare Exception for any parse error
        raise DataError(f"{tokenizer_dir} ({key}): unreadable tokenizer ({first_line(exc)})") from None


class _Counter:
    """Iterates the texts of documents once, counting documents and characters on the way."""

    def __init__(self, docs: Iterator[dict]):
        self._docs = docs
        self.docs = self.chars = 0

    def __iter__(self) -> Iterator[str]:
        with Progress(0, "tokenizer: reading", "doc", logger=log) as bar:
            for doc in self._docs:
                self.docs += 1
                self.chars += len(doc["text"])
                bar.update(1)
                yield doc["text"]


def _compression_sample(tok: Tokenizer, curated: str) -> tuple[int, int, int]:
    texts = [d["text"] for d in iter_documents(curated, limit=COMPRESSION_SAMPLE_DOCS)]
    tokens = sum(len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False))
    return len(texts), sum(map(len, texts)), tokens


def _check_config(tcfg: TokenizerConfig) -> None:
    if not tcfg.eos_token or not tcfg.pad_token or len(set(special_tokens(tcfg))) < len(special_tokens(tcfg)):
        raise ConfigError(
            f"tokenizer.eos_token ({tcfg.eos_token!r}), tokenizer.pad_token ({tcfg.pad_token!r}) and "
            f"tokenizer.bos_token ({tcfg.bos_token!r}, may be empty) must be different non-empty strings"
        )
    if not 0.0 < tcfg.sample_fraction <= 1.0:
        raise ConfigError(f"tokenizer.sample_fraction must be in (0, 1], got {tcfg.sample_fraction}")
    if tcfg.pad_to_multiple < 1:
        raise ConfigError(f"tokenizer.pad_to_multiple must be >= 1, got {tcfg.pad_to_multiple}")
    if tcfg.max_train_docs < 0:
        raise ConfigError(f"tokenizer.max_train_docs must be >= 0 (0 = all), got {tcfg.max_train_docs}")
    n_special = len(special_tokens(tcfg))
    if not tcfg.path and tcfg.vocab_size <= BYTE_ALPHABET + n_special:
        raise ConfigError(
            f"tokenizer.vocab_size must exceed {BYTE_ALPHABET + n_special} (256 byte tokens + "
            f"{n_special} special tokens), got {tcfg.vocab_size}"
        )
