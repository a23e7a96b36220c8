"""Token shards on disk and the packed dataset the trainer reads.

Layout written by the tokenize stage (datatrove ``DocumentTokenizer``)::

    <tokens>/meta.json                 token_dtype, vocab_size, eos_id, bos_id, per-split counts
    <tokens>/<split>/*.ds              raw little-endian token ids (uint16 while vocab <= 65,536, else uint32)
    <tokens>/<split>/*.ds.index        little-endian uint64 end (in tokens) of every document in the .ds file
    <tokens>/<split>/*.ds.metadata     datatrove's note: "tokenizer path|token bytes", token count

Every document ends with EOS (and starts with BOS when the tokenizer has one), so concatenating the shards
and cutting fixed windows packs documents with their boundaries marked. A split of many shards is read as a
:class:`ShardedTokens` view over one memory map per shard: nothing is copied into RAM except the windows
being read.

Document boundaries inside a window (``train.data.doc_boundaries``, see :func:`boundary_fields`):

* ``none``: plain packing; a token attends to everything before it in the window, positions 0..T-1.
* ``reset_positions``: the batch carries ``position_ids`` that restart at 0 at every document start (the
  token after an EOS), so RoPE sees each document's own positions; attention still crosses documents.
* ``mask``: ``position_ids`` as above plus ``doc_ids``: attention is block-diagonal causal per document and
  CCA's convolutions and value shift do not reach across a boundary, so a document's logits are those it
  would get alone (up to float rounding; see docs/data.md for what still couples documents in a batch).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from zaya_pipeline.errors import ConfigError, DataError
from zaya_pipeline.utils import read_json

# Explicit little-endian: datatrove packs ids with struct "<H" / "<I" whatever the host's byte order.
DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
BOUNDARY_MODES = ("none", "reset_positions", "mask")


def read_token_meta(tokens_dir: str | Path) -> dict:
    path = Path(tokens_dir) / "meta.json"
    if not path.is_file():
        raise DataError(f"{path} is missing: run the tokenize stage first (zaya tokenize)")
    return read_json(path)


def load_split(tokens_dir: str | Path, split: str) -> np.ndarray | ShardedTokens:
    """All tokens of one split, shards in name order, memory-mapped (see :func:`read_shards`)."""
    return read_shards(Path(tokens_dir) / split, read_token_meta(tokens_dir)["token_dtype"])


def read_shards(split_dir: str | Path, token_dtype: str) -> np.ndarray | ShardedTokens:
    """The ``*.ds`` files of one split folder as one 1-D token sequence (``token_dtype``: "uint16" or
    "uint32"): the memmap itself for one shard, else a :class:`ShardedTokens` over one memmap per shard."""
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
    return arrays[0] if len(arrays) == 1 else ShardedTokens(arrays)


class ShardedTokens:
    """Several 1-D token arrays (memmaps) read as one: ``len``, integer and contiguous-slice indexing, and
    :meth:`gather` of many fixed-length rows.

    A slice inside one shard is a view of its memmap; one that crosses shards copies just that range.
    ``np.asarray`` (and ``tolist``) materialize everything: whole-split statistics should loop over
    ``shards`` instead.
    """

    ndim = 1

    def __init__(self, shards: list[np.ndarray]):
        assert shards and all(s.ndim == 1 and s.dtype == shards[0].dtype for s in shards)
        self.shards = shards
        self.dtype = shards[0].dtype
        # plain ndarray views of the maps: slicing a np.memmap costs several times more (loader throughput)
        self._views = [np.asarray(s) for s in shards]
        self._ends = np.cumsum([len(s) for s in shards])  # _ends[i] = tokens in shards 0..i
        self._offsets = [0, *self._ends[:-1].tolist()]
        self.shape = (int(self._ends[-1]),)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key):
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step != 1:
                raise IndexError("ShardedTokens supports contiguous slices only")
            return self._range(start, max(start, stop))
        i = int(key)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(f"index {key} out of range for {len(self)} tokens")
        s = int(np.searchsorted(self._ends, i, side="right"))
        return self.shards[s][i - self._offsets[s]]

    def _range(self, start: int, stop: int) -> np.ndarray:
        first = int(np.searchsorted(self._ends, start, side="right"))
        if first == len(self.shards) or stop <= self._ends[first]:  # inside one shard (or empty)
            s = min(first, len(self.shards) - 1)
            return self.shards[s][start - self._offsets[s] : stop - self._offsets[s]]
        parts, s = [], first
        while start < stop:
            lo, hi = start - self._offsets[s], min(stop, int(self._ends[s])) - self._offsets[s]
            parts.append(self._views[s][lo:hi])
            start, s = self._offsets[s] + hi, s + 1
        return np.concatenate(parts)

    def gather(self, starts: np.ndarray, length: int) -> np.ndarray:
        """Rows ``self[start : start + length]`` for every start (all in range), as one (n, length) array."""
        out = np.empty((len(starts), length), dtype=self.dtype)
        shard_of = np.searchsorted(self._ends, starts, side="right").tolist()
        for r, (s, start) in enumerate(zip(shard_of, np.asarray(starts).tolist(), strict=True)):
            lo = start - self._offsets[s]
            row = self._views[s][lo : lo + length]
            out[r] = row if len(row) == length else self._range(start, start + length)  # crosses a shard
        return out

    def max(self):
        return max(s.max() for s in self.shards)

    def __array__(self, dtype=None, copy=None):
        out = np.concatenate(self.shards)
        return out if dtype is None else out.astype(dtype)

    def tolist(self) -> list[int]:
        return np.asarray(self).tolist()


def shards_of(tokens: np.ndarray | ShardedTokens) -> list[np.ndarray]:
    """The memmaps behind ``tokens`` (itself when it is one array)."""
    return tokens.shards if isinstance(tokens, ShardedTokens) else [tokens]


def token_counts(tokens: np.ndarray | ShardedTokens, vocab_size: int, chunk: int = 1 << 24) -> np.ndarray:
    """How often each id occurs (int64, ``vocab_size`` long), read chunk by chunk: a split of any size
    costs ``chunk`` int64 ids of RAM, not a copy of the whole split."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for shard in shards_of(tokens):
        for i in range(0, len(shard), chunk):
            counts += np.bincount(shard[i : i + chunk], minlength=vocab_size)[:vocab_size]
    return counts


def check_boundary_mode(mode: str) -> None:
    if mode not in BOUNDARY_MODES:
        raise ConfigError(f"train.data.doc_boundaries must be one of {list(BOUNDARY_MODES)}, got {mode!r}")


def boundary_fields(input_ids, eos_id: int | None, mode: str) -> dict:
    """The extra batch fields of ``mode`` for ``input_ids`` (int64 CPU tensor, shape (..., T)).

    A document starts at position 0 and after every EOS; ``doc_ids`` numbers the documents of a row
    (0, 1, ...; the EOS belongs to the document it ends) and ``position_ids`` counts from 0 at each start.
    A window that begins inside a document counts that document's positions from 0 too.
    """
    import torch

    check_boundary_mode(mode)
    if mode == "none":
        return {}
    if eos_id is None:
        raise DataError(f"train.data.doc_boundaries={mode} needs the eos_id of the tokens (meta.json)")
    # numpy: a few microseconds per call where torch's per-op overhead is ten times that (loader throughput)
    is_eos = input_ids.numpy() == eos_id
    after_eos = np.zeros_like(is_eos)
    after_eos[..., 1:] = is_eos[..., :-1]
    idx = np.arange(is_eos.shape[-1])  # broadcast over the rows
    start_of_doc = np.maximum.accumulate(np.where(after_eos, idx, 0), axis=-1)
    fields = {"position_ids": torch.from_numpy(idx - start_of_doc)}
    if mode == "mask":
        fields["doc_ids"] = torch.from_numpy(np.cumsum(after_eos, axis=-1))
    return fields


class PackedDataset:
    """Fixed windows of ``seq_len + 1`` tokens; item i = (input_ids, labels) of window ``order[i]``.

    Windows do not overlap and cover the stream except its tail; ``seed`` fixes the order (None keeps the
    on-disk order, as evaluation wants). Indexable, so it works as a map-style torch Dataset. With
    ``doc_boundaries`` other than "none" items also carry :func:`boundary_fields` (needs ``eos_id``).
    """

    def __init__(
        self,
        tokens: np.ndarray | ShardedTokens,
        seq_len: int,
        seed: int | None = None,
        eos_id: int | None = None,
        doc_boundaries: str = "none",
    ):
        if seq_len < 1:
            raise DataError(f"seq_len must be >= 1, got {seq_len}")
        check_boundary_mode(doc_boundaries)
        self.tokens = tokens
        self._rows = tokens if isinstance(tokens, ShardedTokens) else ShardedTokens([np.asarray(tokens)])
        self.seq_len = seq_len
        self.eos_id, self.doc_boundaries = eos_id, doc_boundaries
        self.num_windows = (len(tokens) - 1) // seq_len
        if self.num_windows < 1:
            raise DataError(f"only {len(tokens)} tokens: too few for one window of {seq_len + 1} tokens")
        idx = np.arange(self.num_windows)
        self.order = idx if seed is None else np.random.default_rng(seed).permutation(idx)

    def __len__(self) -> int:
        return self.num_windows

    def __getitem__(self, i: int) -> dict:
        import torch

        window = torch.from_numpy(self.read_windows(self.order[i : i + 1])[0])
        item = {"input_ids": window[:-1], "labels": window[1:]}
        return item | boundary_fields(item["input_ids"], self.eos_id, self.doc_boundaries)

    def read_windows(self, windows: np.ndarray) -> np.ndarray:
        """Windows by their position in the stream (not through ``order``): int64 (n, seq_len + 1)."""
        starts = np.asarray(windows, dtype=np.int64) * self.seq_len
        return self._rows.gather(starts, self.seq_len + 1).astype(np.int64)
