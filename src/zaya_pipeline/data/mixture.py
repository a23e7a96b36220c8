"""The training stream: multi-phase data mixtures, data-parallel sharding and exact resume.

Semantics (every quantity is a pure function of the constructor arguments and the batch index):

* **Sources** are token streams (1-D arrays, e.g. from ``load_split``), in the dict's order (source index
  s). Each is cut into non-overlapping windows of ``seq_len + 1`` tokens exactly as ``PackedDataset`` does.
* **Batches.** ``batch_sequences(b)`` is the GLOBAL number of sequences of batch b (a batch-size ramp plugs
  in here); it must be divisible by ``world_size``. ``S(b) = samples_before(b)`` is the global sample index
  of batch b's first sequence. Rank r holds global samples ``[S(b) + r*B/W, S(b) + (r+1)*B/W)``, so the
  ranks' slices, in rank order, are exactly the global batch.
* **Phases.** Phase p's budget is ``tokens // seq_len`` sequences; ``bound_p`` is the cumulative budget of
  phases 0..p. Batch b belongs to the first phase p with ``S(b) < bound_p`` (switching at batch
  granularity: a phase ends at the first batch whose start sample reaches its bound). The last phase never
  ends (its budget, 0 or not, is not used for switching). A phase shorter than one batch may get no batch.
* **Source of each sample.** Global sample j of a batch in phase p comes from the source the phase's
  weights pick with the uniform number ``u(seed, j)`` (a splitmix64 hash of the sample index, so choices
  are counter-based and a seek needs no per-batch generator). Every rank computes the whole batch's
  choices and materializes only its own slice.
* **Windows within a source.** The k-th draw (over all phases) from source s reads window
  ``perm(s, e)[k % n_windows]`` with ``e = k // n_windows`` and ``perm(s, e)`` a permutation seeded by
  ``(seed, s, e)``: no window repeats until the source is exhausted, and each epoch is reshuffled.
* **Resume.** ``start_batch=b`` replays the choices of batches < b (vectorized) to recover every source's
  draw count, then yields exactly what an uninterrupted stream yields from batch b on. ``state_dict()`` is
  that position (the batch after the last one returned) with what the order depends on; ``load_state_dict``
  checks those and seeks there. The position is global, so a stream resumes under another ``world_size``
  (same global batch): its ranks' slices still concatenate to the uninterrupted global batch.

A batch is a dict: ``input_ids`` and ``labels`` (int64 tensors of shape ``(B/W, seq_len)``), ``batch_index``
(int), ``phase`` (int) and ``source_counts`` (list of ints: this rank's sequences per source, in source
order; the names are ``MixtureStream.source_names``); with ``doc_boundaries`` other than "none" also the
fields of :func:`~zaya_pipeline.data.loader.boundary_fields` (``position_ids``, ``doc_ids``).
"""

from __future__ import annotations

import bisect
import math
import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import count
from pathlib import Path

import numpy as np

from zaya_pipeline.data.loader import (
    PackedDataset,
    boundary_fields,
    check_boundary_mode,
    load_split,
    read_token_meta,
)
from zaya_pipeline.errors import ConfigError, DataError

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)
_CHOICE_TAG = 0x6D69787475726521  # separates the choice hash from other uses of the seed
_CHUNK = 1 << 20  # samples hashed at once while seeking


def _mix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer, in place on a uint64 array."""
    x ^= x >> np.uint64(30)
    x *= _MUL1
    x ^= x >> np.uint64(27)
    x *= _MUL2
    x ^= x >> np.uint64(31)
    return x


def _uniforms(key: np.uint64, start: int, stop: int) -> np.ndarray:
    """Uniform floats in [0, 1) for global sample indices ``start..stop-1``."""
    x = np.arange(start, stop, dtype=np.uint64)
    x *= _GOLDEN
    x += key
    return (_mix64(x) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


@dataclass(frozen=True)
class Phase:
    """One stage of the mixture schedule."""

    name: str
    tokens: int  # token budget (sequences * seq_len); 0 = runs to the end (last phase only)
    weights: dict[str, float]  # source name -> sampling weight (>= 0, normalized; at least one > 0)


def _as_int(value, what: str) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{what} must be an integer, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise ConfigError(f"{what} must be an integer, got {value!r}") from None


class MixtureStream:
    """Iterable of training batches for ONE data-parallel rank (see the module docstring)."""

    def __init__(
        self,
        sources: dict[str, np.ndarray],
        phases: list[Phase],
        seq_len: int,
        batch_sequences: Callable[[int], int],
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        start_batch: int = 0,
        eos_id: int | None = None,
        doc_boundaries: str = "none",
    ):
        seq_len = _as_int(seq_len, "seq_len")
        if seq_len < 1:
            raise ConfigError(f"seq_len must be >= 1, got {seq_len}")
        if not sources:
            raise ConfigError("data mixture: no sources given")
        self.seq_len = seq_len
        check_boundary_mode(doc_boundaries)
        if doc_boundaries != "none" and eos_id is None:
            raise DataError(f"train.data.doc_boundaries={doc_boundaries} needs the eos_id of the tokens")
        self.eos_id, self.doc_boundaries = eos_id, doc_boundaries
        self.source_names = tuple(sources)
        self.datasets = [self._dataset(name, tokens, seq_len) for name, tokens in sources.items()]
        self.phases = list(phases)
        self.phase_sequences, self._bounds, self._cdfs = self._check_phases(self.phases)
        self.world_size = _as_int(world_size, "world_size")
        self.rank = _as_int(rank, "rank")
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ConfigError(
                f"need 0 <= rank < world_size, got rank {self.rank}, world_size {self.world_size}"
            )
        self.seed = _as_int(seed, "seed")
        self._key = _mix64(np.array([(self.seed % 2**64) ^ _CHOICE_TAG], dtype=np.uint64))[0]
        self._batch_sequences = batch_sequences
        self._starts = np.zeros(1024, dtype=np.int64)  # S(0..known-1)
        self._known = 1
        self._perms: list[dict[int, np.ndarray]] = [{} for _ in self.datasets]
        self.start_batch = _as_int(start_batch, "start_batch")
        if self.start_batch < 0:
            raise ConfigError(f"start_batch must be >= 0, got {self.start_batch}")
        self._cursor = (0, np.zeros(len(self.datasets), dtype=np.int64))  # (batch, draws before it)
        self._counts_before(self.start_batch)  # seek now, so errors and cost show up at construction
        self.next_batch = self.start_batch  # the batch after the last one returned: the resume position

    # ---- position -----------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Where to resume: ``next_batch``, plus the seed, seq_len and sources the order depends on."""
        return {
            "next_batch": self.next_batch,
            "seed": self.seed,
            "seq_len": self.seq_len,
            "sources": list(self.source_names),
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue at ``state["next_batch"]``; a state of a stream with another seed, seq_len or sources
        would not continue the same order, so it is refused."""
        mine = self.state_dict()
        for key in ("seed", "seq_len", "sources"):
            if key in state and state[key] != mine[key]:
                raise DataError(
                    f"data stream state: {key} {state[key]!r} differs from this stream's {mine[key]!r} "
                    "(train.seed / train.seq_len / train.data.sources): it would not continue the same order"
                )
        if "next_batch" not in state:
            raise DataError(f"data stream state has no next_batch (keys: {sorted(state)})")
        b = _as_int(state["next_batch"], "next_batch")
        if b < 0:
            raise DataError(f"data stream state: next_batch must be >= 0, got {b}")
        self._counts_before(b)
        self.start_batch = self.next_batch = b

    # ---- validation -------------------------------------------------------------------------------

    @staticmethod
    def _dataset(name: str, tokens: np.ndarray, seq_len: int) -> PackedDataset:
        if np.ndim(tokens) != 1:
            raise DataError(f"data source {name!r}: tokens must be a 1-D array, got shape {np.shape(tokens)}")
        try:
            return PackedDataset(tokens, seq_len)
        except DataError as err:
            raise DataError(f"data source {name!r}: {err}") from None

    def _check_phases(self, phases: list[Phase]) -> tuple[list[int], list[int], list[np.ndarray]]:
        """Budgets in sequences, the cumulative bounds of all phases but the last, and each phase's CDF."""
        if not phases:
            raise ConfigError("data mixture: phases is empty (need at least one phase)")
        known = ", ".join(self.source_names)
        budgets, cdfs = [], []
        for p, phase in enumerate(phases):
            last = p == len(phases) - 1
            tokens = _as_int(phase.tokens, f"phase {phase.name!r} tokens")
            if tokens == 0 and not last:
                raise ConfigError(
                    f"data mixture phase {phase.name!r}: tokens 0 (run to the end) is only allowed in the "
                    "last phase"
                )
            if tokens < 0 or 0 < tokens < self.seq_len:
                raise ConfigError(
                    f"data mixture phase {phase.name!r}: tokens must be 0 (last phase) or >= seq_len "
                    f"{self.seq_len}, got {tokens}"
                )
            budgets.append(tokens // self.seq_len)
            weights = np.zeros(len(self.source_names))
            for name, w in dict(phase.weights).items():
                if name not in self.source_names:
                    raise ConfigError(
                        f"data mixture phase {phase.name!r}: unknown source {name!r} in weights "
                        f"(known sources: {known})"
                    )
                w = float(w)
                if not math.isfinite(w) or w < 0:
                    raise ConfigError(
                        f"data mixture phase {phase.name!r}: weight of {name!r} must be finite and >= 0, "
                        f"got {w}"
                    )
                weights[self.source_names.index(name)] = w
            if weights.sum() <= 0:
                raise ConfigError(f"data mixture phase {phase.name!r}: weights must have a positive sum")
            cdf = np.cumsum(weights / weights.sum())
            cdf[np.flatnonzero(weights)[-1] :] = 1.0  # no rounding gap at the top, no mass on trailing zeros
            cdfs.append(cdf)
        bounds = np.cumsum(budgets[:-1]).tolist()
        return budgets, bounds, cdfs

    def _size_of(self, b: int) -> int:
        try:
            size = operator.index(self._batch_sequences(b))
        except TypeError:
            raise ConfigError(f"batch_sequences({b}) must return an integer") from None
        if size < 1 or size % self.world_size:
            raise ConfigError(
                f"batch_sequences({b}) = {size} global sequences: must be >= 1 and divisible by "
                f"world_size {self.world_size}"
            )
        return size

    # ---- the schedule -----------------------------------------------------------------------------

    def _extend(self, b: int) -> None:
        """Make S(0..b) known."""
        while self._known <= b:
            if self._known == len(self._starts):
                self._starts = np.concatenate([self._starts, np.zeros_like(self._starts)])
            i = self._known - 1
            self._starts[self._known] = int(self._starts[i]) + self._size_of(i)
            self._known += 1

    def samples_before(self, b: int) -> int:
        """Global sequences in batches 0..b-1 (= S(b), the global index of batch b's first sample)."""
        b = _as_int(b, "batch index")
        if b < 0:
            raise ValueError(f"batch index must be >= 0, got {b}")
        self._extend(b)
        return int(self._starts[b])

    def phase_of_batch(self, b: int) -> int:
        return bisect.bisect_right(self._bounds, self.samples_before(b))

    def phase_start_batches(self) -> list[int]:
        """First batch index of every phase (first is 0; equal neighbours mean an empty phase)."""
        out = [0]
        for bound in self._bounds:
            while int(self._starts[self._known - 1]) < bound:
                self._extend(self._known)
            out.append(int(np.searchsorted(self._starts[: self._known], bound, side="left")))
        return out

    # ---- draws --------------------------------------------------------------------------------------

    def _choose(self, phase: int, start: int, stop: int) -> np.ndarray:
        """Source index of global samples ``start..stop-1``, all in ``phase``."""
        cdf = self._cdfs[phase]
        if cdf[0] == 1.0:  # all weight on the first source: what the search would return, without hashing
            return np.zeros(stop - start, dtype=np.intp)
        return np.searchsorted(cdf, _uniforms(self._key, start, stop), side="right")

    def _replay(self, c: int, b: int) -> np.ndarray:
        """Draws per source over batches c..b-1."""
        counts = np.zeros(len(self.datasets), dtype=np.int64)
        if b <= c:
            return counts
        self._extend(b)
        phases = np.searchsorted(self._bounds, self._starts[c:b], side="right")
        for p in np.unique(phases):
            i0, i1 = np.searchsorted(phases, [p, p + 1], side="left")
            lo, hi = int(self._starts[c + i0]), int(self._starts[c + i1])
            for a in range(lo, hi, _CHUNK):
                counts += np.bincount(self._choose(int(p), a, min(a + _CHUNK, hi)), minlength=len(counts))
        return counts

    def _counts_before(self, b: int) -> np.ndarray:
        """Draws per source before batch b, advancing the cached cursor (replays from 0 when going back)."""
        c, counts = self._cursor
        if b < c:
            c, counts = 0, np.zeros_like(counts)
        counts = counts + self._replay(c, b)
        self._cursor = (b, counts)
        return counts

    def _perm(self, s: int, epoch: int) -> np.ndarray:
        cache = self._perms[s]
        if epoch not in cache:
            if len(cache) >= 2:
                cache.pop(next(iter(cache)))
            n = self.datasets[s].num_windows
            cache[epoch] = np.random.default_rng([self.seed % 2**64, s, epoch]).permutation(n)
        return cache[epoch]

    def _windows(self, s: int, draws: np.ndarray) -> np.ndarray:
        """The windows of source s read by its draws number ``draws``."""
        epochs, i = np.divmod(draws, self.datasets[s].num_windows)
        if epochs[0] == epochs[-1]:  # draws ascend: one epoch (nearly always)
            return self._perm(s, int(epochs[0]))[i]
        out = np.empty_like(draws)
        for e in np.unique(epochs):
            sel = epochs == e
            out[sel] = self._perm(s, int(e))[i[sel]]
        return out

    # ---- batches ------------------------------------------------------------------------------------

    def batch(self, b: int) -> dict:
        """Batch b for this rank (random access; sequential calls cost O(batch size) each)."""
        import torch

        b = _as_int(b, "batch index")
        if b < 0:
            raise ValueError(f"batch index must be >= 0, got {b}")
        counts = self._counts_before(b)
        self._extend(b + 1)
        start, size = int(self._starts[b]), int(self._starts[b + 1] - self._starts[b])
        phase = self.phase_of_batch(b)
        choices = self._choose(phase, start, start + size)
        draws = np.empty(size, dtype=np.int64)  # k: the draw index within each sample's source
        for s in range(len(self.datasets)):
            mask = choices == s
            draws[mask] = counts[s] + np.arange(np.count_nonzero(mask))
        self._cursor = (b + 1, counts + np.bincount(choices, minlength=len(counts)))
        local = size // self.world_size
        lo = self.rank * local
        mine, mine_draws = choices[lo : lo + local], draws[lo : lo + local]
        rows = np.empty((local, self.seq_len + 1), dtype=np.int64)
        for s, dataset in enumerate(self.datasets):  # one vectorized read per source
            sel = mine == s
            if sel.all():
                rows[:] = dataset.read_windows(self._windows(s, mine_draws))
            elif sel.any():
                rows[sel] = dataset.read_windows(self._windows(s, mine_draws[sel]))
        input_ids = torch.from_numpy(rows[:, :-1].copy())
        self.next_batch = b + 1
        return {
            "input_ids": input_ids,
            "labels": torch.from_numpy(rows[:, 1:].copy()),
            "batch_index": b,
            "phase": phase,
            "source_counts": np.bincount(mine, minlength=len(counts)).tolist(),
        } | boundary_fields(input_ids, self.eos_id, self.doc_boundaries)

    def __iter__(self) -> Iterator[dict]:
        """Batches next_batch, next_batch + 1, ... (infinite): from start_batch, or where
        ``load_state_dict`` put the stream."""
        for b in count(self.next_batch):
            yield self.batch(b)


def load_sources(paths: dict[str, str], split: str = "train") -> dict[str, np.ndarray]:
    """Each tokens dir's ``split`` (``load_split``), keyed like ``paths``; vocab_size must agree."""
    if not paths:
        raise ConfigError("data mixture: no sources given (paths is empty)")
    out: dict[str, np.ndarray] = {}
    first: tuple[str, dict] | None = None
    for name, tokens_dir in paths.items():
        meta = read_token_meta(tokens_dir)
        if meta.get("vocab_size") is None:
            raise DataError(f"{Path(tokens_dir) / 'meta.json'} has no vocab_size")
        if first is None:
            first = (str(tokens_dir), meta)
        for key in ("vocab_size", "eos_id"):  # one model vocabulary, one document separator
            if meta.get(key) != first[1].get(key):
                raise DataError(
                    f"data sources disagree on {key}: {first[0]} has {first[1].get(key)}, "
                    f"{tokens_dir} (source {name!r}) has {meta.get(key)}"
                )
        out[name] = load_split(tokens_dir, split)
    return out
