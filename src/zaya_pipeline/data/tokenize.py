"""The tokenize stage: curated JSONL → train/val token shards, with datatrove's ``DocumentTokenizer``.

One datatrove pipeline per split, ``JsonlReader → SplitFilter → DocumentTokenizer``: the filter keeps the
documents whose salted id hash falls in that split (``splits.split_of``), so the split is deterministic,
disjoint and independent of file order or task count. Layout and format of the output: see
``zaya_pipeline.data.loader``.
"""

from __future__ import annotations

import math
import os
import time
from functools import cached_property
from pathlib import Path

import numpy as np
from datatrove.data import Document
from datatrove.pipeline.filters.base_filter import BaseFilter
from datatrove.pipeline.readers import JsonlReader
from datatrove.pipeline.tokens import DocumentTokenizer
from tokenizers.processors import TemplateProcessing

from zaya_pipeline.config import TokenizeConfig, ZayaConfig
from zaya_pipeline.data.datatrove_parts import run_explained
from zaya_pipeline.data.executors import LocalExecutor
from zaya_pipeline.data.loader import read_shards, token_counts
from zaya_pipeline.data.splits import SPLITS, split_of
from zaya_pipeline.data.text_io import CURATED_GLOB, curated_files
from zaya_pipeline.errors import ConfigError, DataError
from zaya_pipeline.progress import Progress
from zaya_pipeline.utils import atomic_dir, get_logger, read_json, remove_outputs, set_project_env, write_json

log = get_logger("tokenize")


class SplitFilter(BaseFilter):
    """Keeps the documents of one split; counts the UTF-8 bytes of their text (for bits-per-byte)."""

    name = "🔀 Train/val split"

    def __init__(self, split: str, val_fraction: float, seed: int):
        super().__init__()
        self.split, self.val_fraction, self.seed = split, val_fraction, seed

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        if split_of(str(doc.id), self.val_fraction, self.seed) != self.split:
            return False, "other_split"
        self.stat_update("text_bytes", value=len(doc.text.encode("utf-8")))
        return True


class SafeDocumentTokenizer(DocumentTokenizer):
    """``DocumentTokenizer`` that encodes special-token strings found in the text as plain text, and puts
    ``bos_token`` (when given) before every document.

    Otherwise a page that quotes ``<|endoftext|>`` would get a fake document boundary; the bos and eos around
    each document come from the post-processor and are unaffected.
    """

    def __init__(self, *args, bos_token: str = "", **kwargs):
        super().__init__(*args, **kwargs)
        self.bos_token = bos_token

    @cached_property
    def tokenizer(self):  # noqa: ANN201 - the tokenizers type, imported lazily by datatrove
        tok = super().tokenizer
        tok.encode_special_tokens = True
        if self.bos_token:
            bos, eos = self.bos_token, self.eos_token
            tok.post_processor = TemplateProcessing(
                single=f"{bos} $A {eos}",
                special_tokens=[(bos, tok.token_to_id(bos)), (eos, tok.token_to_id(eos))],
            )
        return tok


def token_dtype(vocab_size: int) -> str:
    """The shard dtype datatrove picks: 2-byte ids while every id fits in uint16, else 4 bytes."""
    return "uint16" if vocab_size <= np.iinfo(np.uint16).max + 1 else "uint32"


def tokenize(cfg: ZayaConfig) -> dict:
    """Write the ``paths.tokens`` shards and meta.json, and the metrics file ``reports/tokenize.json``."""
    set_project_env()
    tcfg = cfg.data.tokenize
    _check_config(tcfg)
    tok_dir = Path(cfg.paths.tokenizer)
    tok_file, tok_meta_file = tok_dir / "tokenizer.json", tok_dir / "meta.json"
    if not (tok_file.is_file() and tok_meta_file.is_file()):
        raise DataError(f"no tokenizer in {tok_dir} (paths.tokenizer): run `zaya tokenizer` first")
    tok_meta = read_json(tok_meta_file)
    curated_files(cfg.paths.curated)  # a clear error for a missing or empty corpus, before datatrove starts
    out_dir, report = Path(cfg.paths.tokens), Path(cfg.paths.reports) / "tokenize.json"
    logs = Path(cfg.paths.logs) / "tokenize"
    # Stale completion markers would make datatrove skip every task and leave the new shards empty. The
    # shards (atomic_dir) and the report are replaced only once the new ones are complete.
    remove_outputs(logs)
    dtype = token_dtype(tok_meta["vocab_size"])
    start = time.perf_counter()
    with atomic_dir(out_dir) as tmp:
        splits = {}
        with Progress(len(SPLITS), "tokenize", "split", logger=log, every_s=0) as bar:
            for split in SPLITS:
                out = tmp / split
                splits[split] = _tokenize_split(cfg, split, tok_file, tok_meta, out, logs / split, dtype)
                bar.update(1, last=split, tokens=splits[split]["tokens"])
        nats = unigram_cross_entropy(
            read_shards(tmp / "train", dtype), read_shards(tmp / "val", dtype), tok_meta["vocab_size"]
        )
        meta = {
            "token_dtype": dtype,
            "vocab_size": tok_meta["vocab_size"],
            "eos_id": tok_meta["eos_id"],
            "bos_id": tok_meta.get("bos_id"),  # None: documents have no BOS (tokenizer.bos_token)
            "val_fraction": tcfg.val_fraction,
            "split_seed": tcfg.split_seed,
            "splits": splits,
            "unigram_val_nats_per_token": round(nats, 6),
            "unigram_val_bits_per_byte": round(
                nats * splits["val"]["tokens"] / splits["val"]["bytes"] / math.log(2), 6
            ),
        }
        write_json(tmp / "meta.json", meta)
    seconds = round(time.perf_counter() - start, 2)
    metrics = {k: meta[k] for k in ("splits", "unigram_val_nats_per_token", "unigram_val_bits_per_byte")}
    write_json(report, {**metrics, "seconds": seconds})
    from zaya_pipeline.data.report import add_token_counts  # tokens per split and per drop reason

    add_token_counts(cfg.paths.reports, splits, tok_file, cfg.paths.removed, cfg.registry)
    log.info("wrote %s in %.1fs (unigram baseline %.3f nats/token)", out_dir, seconds, nats)
    return {
        "train_tokens": splits["train"]["tokens"],
        "val_tokens": splits["val"]["tokens"],
        "token_dtype": dtype,
        "unigram_val_nats_per_token": meta["unigram_val_nats_per_token"],
        "seconds": seconds,
    }


def unigram_cross_entropy(train, val, vocab_size: int) -> float:
    """Cross-entropy (nats/token) of ``val`` under the add-one-smoothed unigram distribution of ``train``
    (token arrays or :class:`~zaya_pipeline.data.loader.ShardedTokens`, counted shard by shard)."""
    counts = token_counts(train, vocab_size).astype(np.float64)
    log_p = np.log(counts + 1.0) - math.log(counts.sum() + vocab_size)
    val_counts = token_counts(val, vocab_size)
    return float(-(val_counts @ log_p) / val_counts.sum())


def _tokenize_split(
    cfg: ZayaConfig, split: str, tok_file: Path, tok_meta: dict, out: Path, logs: Path, dtype: str
):
    """Tokenize one split into ``out``; return its {docs, tokens, bytes} counts."""
    start = time.perf_counter()
    text_bytes = _run_split(cfg, split, tok_file, tok_meta, out, logs)
    docs, tokens = _shard_counts(out, np.dtype(dtype).itemsize)
    if not docs:
        raise DataError(
            f"the {split} split is empty: {cfg.paths.curated} has too few documents for "
            f"data.tokenize.val_fraction={cfg.data.tokenize.val_fraction}"
        )
    log.info("%s: %d docs, %d tokens in %.1fs", split, docs, tokens, time.perf_counter() - start)
    return {"docs": docs, "tokens": tokens, "bytes": text_bytes}


def _run_split(cfg: ZayaConfig, split: str, tok_file: Path, tok_meta: dict, out: Path, logs: Path) -> int:
    """Run the datatrove pipeline of one split; return the UTF-8 bytes of the documents it kept."""
    tcfg = cfg.data.tokenize
    pipeline = [
        JsonlReader(cfg.paths.curated, glob_pattern=CURATED_GLOB, recursive=False),
        SplitFilter(split, tcfg.val_fraction, tcfg.split_seed),
        SafeDocumentTokenizer(
            output_folder=str(out),
            tokenizer_name_or_path=str(tok_file),  # a file path: datatrove loads it locally, never the hub
            eos_token=tok_meta["eos_token"],
            bos_token=tok_meta.get("bos_token") or "",
            shuffle_documents=tcfg.shuffle,
            seed=tcfg.split_seed,
            max_tokens_per_file=tcfg.max_tokens_per_file,
        ),
    ]
    workers = min(tcfg.tasks, os.cpu_count() or 1)
    executor = LocalExecutor(pipeline, tasks=tcfg.tasks, workers=workers, logging_dir=str(logs))
    stats = run_explained(executor, f"tokenize ({split} split, {cfg.paths.curated})", logs)
    return int(stats.stats[1]["text_bytes"].total)


def _shard_counts(folder: Path, itemsize: int) -> tuple[int, int]:
    """(documents, tokens) in a split folder; drops the empty shards that tasks without input leave behind."""
    docs = tokens = 0
    for shard in sorted(folder.glob("*.ds")):
        companions = [shard.with_name(shard.name + ext) for ext in (".index", ".metadata")]
        if shard.stat().st_size == 0:
            remove_outputs(shard, *companions)
            continue
        ends = np.fromfile(companions[0], dtype="<u8")
        n = shard.stat().st_size // itemsize
        assert len(ends) and int(ends[-1]) == n, (
            f"{shard}: index ends at {ends[-1:]} but the shard has {n} tokens"
        )
        docs, tokens = docs + len(ends), tokens + n
    return docs, tokens


def _check_config(tcfg: TokenizeConfig) -> None:
    if not 0.0 < tcfg.val_fraction < 1.0:
        raise ConfigError(f"data.tokenize.val_fraction must be in (0, 1), got {tcfg.val_fraction}")
    if tcfg.tasks < 1:
        raise ConfigError(f"data.tokenize.tasks must be >= 1, got {tcfg.tasks}")
    if tcfg.max_tokens_per_file < 1:
        raise ConfigError(f"data.tokenize.max_tokens_per_file must be >= 1, got {tcfg.max_tokens_per_file}")
