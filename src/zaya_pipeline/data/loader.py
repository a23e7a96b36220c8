"""Token shards on disk and the packed dataset the trainer reads.

Layout written by the tokenize stage (datatrove ``DocumentTokenizer``)::

    <tokens>/meta.json                 token_dtype, vocab_size, eos_id, per-split counts
    <tokens>/<split>/*.ds              raw little-endian token ids (uint16 while vocab <= 65,536, else uint32)
    <tokens>/<split>/*.ds.index        little-endian uint64 end (in tokens) of every document in the .ds file
    <tokens>/<split>/*.ds.metadata     datatrove's note: "tokenizer path|token bytes", token count

Every document ends with EOS, so concatenating the shards and cutting fixed windows packs documents with
their boundaries marked.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from zaya_pipeline.errors import DataError
from zaya_pipeline.utils import read_json

# Explicit little-endian: datatrove packs ids with struct "<H" / "<I" whatever the host's byte order.
DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}


def read_token_meta(tokens_dir: str | Path) -> dict:
    path = Path(tokens_dir) / "meta.json"
    if not path.is_file():
        raise DataError(f"{path} is missing: run the tokenize stage first (zaya tokenize)")
    return read_json(path)


def load_split(tokens_dir: str | Path, split: str) -> np.ndarray:
    """All tokens of one split, shards concatenated in name order (memory-mapped when there is one shard)."""
    return read_shards(Path(tokens_dir) / split, read_token_meta(tokens_dir)["token_dtype"])


def read_shards(split_dir: str | Path, token_dtype: str) -> np.ndarray:
    """The ``*.ds`` files of one split folder as one token array (``token_dtype``: "uint16" or "uint32")."""
    if token_dtype not in DTYPES:
        raise DataError(f"token_dtype {token_dtype!r} in meta.json is not one of {sorted(DTYPES)}")
    dtype = DTYPES[token_dtype]
    files = [f for f in sorted(Path(split_dir).glob("*.ds")) if f.stat().st_size]  # mmap refuses empty files
    if not files:
        raise DataError(f"no token shards (*.ds) in {split_dir}")
    arrays = []
    for f in files:
        if f.stat().st_size % dtype.itemsize:
            raise DataError(f"{f}: size is not a whole number of {token_dtype} tokens (truncated shard?)")
        arrays.append(np.memmap(f, dtype=dtype, mode="r"))
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


class PackedDataset:
    """Fixed windows of ``seq_len + 1`` tokens; item i = (input_ids, labels) of window ``order[i]``.

    Windows do not overlap and cover the stream except its tail; ``seed`` fixes the order (None keeps the
    on-disk order, as evaluation wants). Indexable, so it works as a map-style torch Dataset.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, seed: int | None = None):
        if seq_len < 1:
            raise DataError(f"seq_len must be >= 1, got {seq_len}")
        self.tokens = tokens
        self.seq_len = seq_len
        self.num_windows = (len(tokens) - 1) // seq_len
        if self.num_windows < 1:
            raise DataError(f"only {len(tokens)} tokens: too few for one window of {seq_len + 1} tokens")
        idx = np.arange(self.num_windows)
        self.order = idx if seed is None else np.random.default_rng(seed).permutation(idx)

    def __len__(self) -> int:
        return self.num_windows

    def __getitem__(self, i: int) -> dict:
        import torch

        start = int(self.order[i]) * self.seq_len
        window = torch.from_numpy(np.asarray(self.tokens[start : start + self.seq_len + 1], dtype=np.int64))
        return {"input_ids": window[:-1], "labels": window[1:]}
