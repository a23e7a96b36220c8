"""Tiny synthetic token shards in the tokenize stage's format (meta.json + raw uint16 .ds files)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

VOCAB = 96
EOS = 0


def markov_tokens(n: int, vocab: int, seed: int) -> np.ndarray:
    """Documents from a fixed sparse Markov chain (each token has 2 likely successors), EOS-terminated:
    far more predictable than the unigram distribution, so a model that learns beats that baseline."""
    rng = np.random.default_rng(0)  # the chain is the same for every split
    successors = rng.integers(1, vocab, size=(vocab, 2))
    rng = np.random.default_rng(seed)
    out = np.empty(n, dtype=np.uint16)
    tok = 1
    for i in range(n):
        if rng.random() < 0.01:
            tok = EOS
        elif tok == EOS:
            tok = int(rng.integers(1, vocab))
        else:
            tok = int(successors[tok, rng.integers(0, 2)])
        out[i] = tok
    return out


def unigram_nats(train: np.ndarray, val: np.ndarray, vocab: int) -> float:
    counts = np.bincount(train, minlength=vocab).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    return float(-logp[val].mean())


def write_shards(root: Path, vocab: int = VOCAB, n_train: int = 40_000, n_val: int = 8_000) -> Path:
    train, val = markov_tokens(n_train, vocab, seed=1), markov_tokens(n_val, vocab, seed=2)
    for split, tokens in (("train", train), ("val", val)):
        (root / split).mkdir(parents=True)
        tokens.tofile(root / split / "000_shard.ds")
    meta = {
        "token_dtype": "uint16",
        "vocab_size": vocab,
        "eos_id": EOS,
        "unigram_val_nats_per_token": unigram_nats(train, val, vocab),
        "train": {"tokens": n_train},
        "val": {"tokens": n_val},
    }
    (root / "meta.json").write_text(json.dumps(meta))
    return root
