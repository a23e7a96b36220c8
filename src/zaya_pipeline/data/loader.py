"""Token shards on disk and the packed dataset the trainer reads.

Layout written by the tokenize stage (datatrove ``DocumentTokenizer``)::

    <tokens>/meta.json                 token_dtype, vocab_size, eos_id, per-split counts
    <tokens>/<split>/*.ds              raw little-endian token ids (uint16, or uint32 for vocab > 65,535)
    <tokens>/<split>/*.ds.index        uint64 end offset of every document inside the .ds file

Every document ends with EOS, so concatenating the shards and cutting fixed windows packs documents with
their boundaries marked.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from zaya_pipeline.errors import DataError
from zaya_pipeline.utils import read_json

DTYPES = {"uint16": np.uint16, "uint32": np.uint32}


def read_token_meta(tokens_dir: str | Path) -> dict:
    path = Path(tokens_dir) / "meta.json"
    if not path.is_file():
        raise DataError(f"{path} is missing: run the tokenize stage first (zaya tokenize)")
    return read_json(path)


def load_split(tokens_dir: str | Path, split: str) -> np.ndarray:
    """All tokens of one split, shards concatenated in name order (memory-mapped when there is one shard)."""
    meta = read_token_meta(tokens_dir)
    dtype = DTYPES[meta["token_dtype"]]
    files = sorted((Path(tokens_dir) / split).glob("*.ds"))
    if not files:
        raise DataError(f"no token shards (*.ds) in {Path(tokens_dir) / split}")
    arrays = []
    for f in files:
        if f.stat().st_size % np.dtype(dtype).itemsize:
            raise DataError(f"{f}: size is not a whole number of {meta['token_dtype']} tokens (truncated shard?)")
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
