"""The multi-phase mixture stream: DP sharding, determinism, resume, phase switching, errors."""

from __future__ import annotations

import importlib.util
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from zaya_pipeline.data.mixture import MixtureStream, Phase, load_sources
from zaya_pipeline.errors import ConfigError, DataError

SEQ = 8


def _token_shards():
    """tests/train/token_shards.py (not a package; tests/train's conftest imports it the same way)."""
    if "token_shards" not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "train" / "token_shards.py"
        spec = importlib.util.spec_from_file_location("token_shards", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["token_shards"] = module
    return sys.modules["token_shards"]


def sources(n_a: int = 4_000, n_b: int = 1_000) -> dict[str, np.ndarray]:
    """Token ids = positions (offset per source), so a window's first token tells where it came from."""
    return {
        "a": np.arange(n_a, dtype=np.uint32),
        "b": np.arange(n_b, dtype=np.uint32) + 1_000_000,
    }


def ramp(b: int) -> int:
    return min(4 + 4 * b, 32)  # 4, 8, ..., 32: divisible by 1, 2, 4


PHASES = [Phase("warm", 40 * 16 * SEQ, {"a": 0.7, "b": 0.3}), Phase("anneal", 0, {"a": 0.2, "b": 0.8})]


def stream(**kw) -> MixtureStream:
    args = dict(sources=sources(), phases=PHASES, seq_len=SEQ, batch_sequences=ramp, seed=5)
    return MixtureStream(**(args | kw))


def same(x: dict, y: dict) -> bool:
    return (
        torch.equal(x["input_ids"], y["input_ids"])
        and torch.equal(x["labels"], y["labels"])
        and (x["batch_index"], x["phase"], x["source_counts"])
        == (y["batch_index"], y["phase"], y["source_counts"])
    )


def test_batch_shapes_and_fields():
    s = stream(world_size=2, rank=1)
    x = s.batch(3)
    assert x["input_ids"].shape == x["labels"].shape == (ramp(3) // 2, SEQ)
    assert x["input_ids"].dtype == x["labels"].dtype == torch.int64
    assert torch.equal(x["input_ids"][:, 1:], x["labels"][:, :-1])
    assert x["batch_index"] == 3 and x["phase"] == 0 and sum(x["source_counts"]) == ramp(3) // 2
    assert s.samples_before(3) == 4 + 8 + 12


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_ranks_partition_the_global_batch(world_size):
    full = stream()
    ranks = [stream(world_size=world_size, rank=r) for r in range(world_size)]
    for b in [0, 1, 2, 9, 40, 41]:
        parts = [r.batch(b) for r in ranks]
        whole = full.batch(b)
        assert torch.equal(torch.cat([p["input_ids"] for p in parts]), whole["input_ids"])
        assert torch.equal(torch.cat([p["labels"] for p in parts]), whole["labels"])
        assert np.sum([p["source_counts"] for p in parts], axis=0).tolist() == whole["source_counts"]


def test_same_seed_same_batches_other_seed_differs():
    a, b, c = stream(), stream(), stream(seed=6)
    assert all(same(a.batch(i), b.batch(i)) for i in range(5))
    assert not all(torch.equal(a.batch(i)["input_ids"], c.batch(i)["input_ids"]) for i in range(5))


@pytest.mark.parametrize("start", [0, 1, 7, 23])
def test_resume_equals_the_uninterrupted_stream(start):
    # the ramp gives S(29) = 816, S(30) = 848: phase 1 starts at batch 30; source b (124 windows) wraps often
    phases = [Phase("p0", 840 * SEQ, {"a": 0.7, "b": 0.3}), Phase("p1", 0, {"a": 0.2, "b": 0.8})]
    ref, n = stream(phases=phases), 40
    expected = [x for _, x in zip(range(start + n), iter(ref), strict=False)][start:]
    got = [x for _, x in zip(range(n), iter(stream(phases=phases, start_batch=start)), strict=False)]
    assert [x["batch_index"] for x in got] == list(range(start, start + n))
    assert all(same(x, y) for x, y in zip(got, expected, strict=True))
    assert start < ref.phase_start_batches()[1] == 30 < start + n  # the compared range crosses the switch
    assert sum(x["source_counts"][1] for x in expected) > ref.datasets[1].num_windows  # and an epoch of b


def test_random_access_going_back_replays():
    s = stream()
    later = [s.batch(i) for i in range(30)]
    assert same(s.batch(4), later[4])
    assert same(stream().batch(29), later[29])


def test_phase_switches_at_the_configured_batch():
    B, budget = 12, 100 * SEQ + 3  # 100 sequences -> batch ceil(100 / 12) = 9
    phases = [Phase("a-only", budget, {"a": 1}), Phase("b-only", 0, {"a": 0, "b": 1})]
    s = stream(phases=phases, batch_sequences=lambda b: B)
    switch = s.phase_start_batches()[1]
    assert switch == math.ceil((budget // SEQ) / B) == 9
    for b in range(switch + 5):
        x = s.batch(b)
        assert x["phase"] == s.phase_of_batch(b) == (b >= switch)
        assert x["source_counts"] == ([0, B] if b >= switch else [B, 0])
        first = x["input_ids"][:, 0]
        assert bool((first >= 1_000_000).all()) == (b >= switch)


def test_phase_start_batches_with_a_ramp_and_three_phases():
    phases = [Phase("x", 30 * SEQ, {"a": 1}), Phase("y", 50 * SEQ, {"b": 1}), Phase("z", 0, {"a": 1})]
    s = stream(phases=phases)
    starts = s.phase_start_batches()
    # S(b) for the ramp: 0, 4, 12, 24, 40, 60, 84 -> S >= 30 at b=4, S >= 80 at b=6
    assert starts == [0, 4, 6]
    assert [s.phase_of_batch(b) for b in range(8)] == [0, 0, 0, 0, 1, 1, 2, 2]


def test_mixture_proportions():
    s = stream(phases=[Phase("mix", 0, {"a": 0.75, "b": 0.25})], batch_sequences=lambda b: 64)
    counts = np.sum([s.batch(b)["source_counts"] for b in range(100)], axis=0)
    n = counts.sum()
    stderr = math.sqrt(0.75 * 0.25 / n)
    assert abs(counts[0] / n - 0.75) < 4 * stderr


def test_no_repetition_within_an_epoch():
    s = stream(phases=[Phase("mix", 0, {"a": 0.5, "b": 0.5})], batch_sequences=lambda b: 16)
    n_windows = s.datasets[1].num_windows
    firsts = []
    for b in range(60):
        ids = s.batch(b)["input_ids"][:, 0]
        firsts += [int(t) for t in ids if t >= 1_000_000]
    assert len(firsts) > 2 * n_windows
    epoch0, epoch1 = firsts[:n_windows], firsts[n_windows : 2 * n_windows]
    every_window = {1_000_000 + i * SEQ for i in range(n_windows)}
    assert set(epoch0) == set(epoch1) == every_window and len(set(epoch0)) == n_windows
    assert epoch0 != epoch1  # reshuffled


def test_unknown_source_names_phase_and_source():
    with pytest.raises(ConfigError, match=r"phase 'p1'.*unknown source 'c'.*known sources: a, b"):
        stream(phases=[Phase("p0", 100 * SEQ, {"a": 1}), Phase("p1", 0, {"c": 1})])


def test_batch_not_divisible_by_world_size():
    with pytest.raises(ConfigError, match=r"batch_sequences\(2\) = 6 .* world_size 4"):
        stream(world_size=4, batch_sequences=lambda b: 6 if b == 2 else 8).batch(2)


@pytest.mark.parametrize(
    "phases, message",
    [
        ([Phase("p0", 0, {"a": 0, "b": 0})], r"phase 'p0': weights must have a positive sum"),
        ([Phase("p0", 0, {"a": -1, "b": 2})], r"phase 'p0': weight of 'a' must be finite and >= 0"),
        ([Phase("p0", 0, {"a": 1}), Phase("p1", 0, {"b": 1})], r"phase 'p0': tokens 0 .* only .* last phase"),
        ([Phase("p0", SEQ - 1, {"a": 1})], r"phase 'p0': tokens must be .* >= seq_len"),
        ([], r"phases is empty"),
    ],
)
def test_bad_phases(phases, message):
    with pytest.raises(ConfigError, match=message):
        stream(phases=phases)


def test_too_short_source_is_named():
    with pytest.raises(DataError, match=r"data source 'b'"):
        stream(sources={"a": np.arange(100), "b": np.arange(SEQ)})


def test_a_far_seek_lands_on_the_same_batch_as_stepping_there():
    # 100,000 batches: the vectorized replay (~0.2 s, measured) crosses many source epochs.
    far = next(iter(stream(batch_sequences=lambda b: 64, start_batch=100_000)))
    near = stream(batch_sequences=lambda b: 64, start_batch=99_998)
    it = iter(near)
    next(it), next(it)
    x = next(it)
    assert far["batch_index"] == x["batch_index"] == 100_000 and far["input_ids"].shape == (64, SEQ)
    assert torch.equal(far["input_ids"], x["input_ids"]) and far["source_counts"] == x["source_counts"]


def test_load_sources(tmp_path):
    shards = _token_shards()
    a = shards.write_shards(tmp_path / "a")
    b = shards.write_shards(tmp_path / "b", n_train=5_000, n_val=1_000)
    loaded = load_sources({"web": str(a), "code": str(b)})
    assert list(loaded) == ["web", "code"] and [len(v) for v in loaded.values()] == [40_000, 5_000]
    assert len(load_sources({"web": str(a)}, split="val")["web"]) == 8_000

    c = shards.write_shards(tmp_path / "c", vocab=shards.VOCAB + 1, n_train=2_000, n_val=1_000)
    message = (
        rf"vocab_size: {re.escape(str(a))} has {shards.VOCAB}, {re.escape(str(c))} .* has {shards.VOCAB + 1}"
    )
    with pytest.raises(DataError, match=message):
        load_sources({"web": str(a), "other": str(c)})
