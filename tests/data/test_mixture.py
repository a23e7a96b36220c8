"""The multi-phase mixture stream: DP sharding, determinism, resume, phase switching, errors."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from zaya_pipeline.data.loader import boundary_fields
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
    meta = json.loads((c / "meta.json").read_text())
    (c / "meta.json").write_text(json.dumps(meta | {"vocab_size": shards.VOCAB, "eos_id": 1}))
    with pytest.raises(DataError, match=r"disagree on eos_id: .* has 0, .* \(source 'other'\) has 1"):
        load_sources({"web": str(a), "other": str(c)})


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_ranks_cover_every_window_once_per_epoch_with_no_overlap_and_no_gap(world_size):
    """One source of 500 windows, 20 sequences a step: 25 batches are one epoch over all ranks together."""
    one = {"a": np.arange(500 * SEQ + 1, dtype=np.uint32)}
    args = dict(sources=one, phases=[Phase("all", 0, {"a": 1})], seq_len=SEQ, seed=9)
    ranks = [
        MixtureStream(**args, batch_sequences=lambda b: 20, world_size=world_size, rank=r)
        for r in range(world_size)
    ]
    again = MixtureStream(**args, batch_sequences=lambda b: 20, world_size=world_size, rank=world_size - 1)
    starts = []
    for b in range(25):
        per_rank = [r.batch(b)["input_ids"][:, 0] for r in ranks]
        assert all(len(p) == 20 // world_size for p in per_rank)
        starts += torch.cat(per_rank).tolist()
        assert torch.equal(again.batch(b)["input_ids"][:, 0], per_rank[-1])  # deterministic per rank
    assert sorted(starts) == list(range(0, 500 * SEQ, SEQ))


@pytest.mark.parametrize("world_size, resume_world_size", [(1, 1), (2, 2), (4, 4), (2, 4), (4, 1)])
def test_state_dict_resumes_every_rank_at_the_exact_next_sample(world_size, resume_world_size):
    ref = stream()  # the uninterrupted global stream
    expected = [ref.batch(b) for b in range(30)]
    states = []
    for r in range(world_size):
        s = stream(world_size=world_size, rank=r)
        it = iter(s)
        for _ in range(11):
            next(it)
        states.append(s.state_dict())
    assert all(st == states[0] for st in states) and states[0]["next_batch"] == 11
    resumed = [stream(world_size=resume_world_size, rank=r) for r in range(resume_world_size)]
    for s in resumed:
        s.load_state_dict(states[0])
    iters = [iter(s) for s in resumed]
    for b in range(11, 30):
        parts = [next(it) for it in iters]
        assert all(p["batch_index"] == b for p in parts)
        whole = {k: torch.cat([p[k] for p in parts]) for k in ("input_ids", "labels")}
        assert torch.equal(whole["input_ids"], expected[b]["input_ids"])
        assert torch.equal(whole["labels"], expected[b]["labels"])
    assert resumed[0].state_dict()["next_batch"] == 30


def test_state_dict_of_another_order_is_refused():
    state = stream().state_dict()
    with pytest.raises(DataError, match=r"seed 5 differs .* 6 \(train\.seed"):
        stream(seed=6).load_state_dict(state)
    with pytest.raises(DataError, match=r"seq_len"):
        stream(seq_len=SEQ * 2).load_state_dict(state)
    with pytest.raises(DataError, match=r"no next_batch"):
        stream().load_state_dict({"seed": 5})


@pytest.mark.parametrize("mode", ["reset_positions", "mask"])
def test_batches_carry_the_boundary_fields(mode):
    toks = {"a": (np.arange(4_000) % 11).astype(np.uint32), "b": (np.arange(1_000) % 5).astype(np.uint32)}
    s = stream(sources=toks, eos_id=0, doc_boundaries=mode, world_size=2, rank=1)
    x = s.batch(3)
    assert torch.equal(x["position_ids"], boundary_fields(x["input_ids"], 0, mode)["position_ids"])
    assert ("doc_ids" in x) == (mode == "mask")
    assert x["position_ids"].shape == x["input_ids"].shape and int(x["position_ids"].max()) < 11
    plain = stream(sources=toks).batch(3)
    assert set(plain) == {"input_ids", "labels", "batch_index", "phase", "source_counts"}
    assert same(plain, stream(sources=toks, doc_boundaries="none", eos_id=0).batch(3))
    with pytest.raises(DataError, match=r"train\.data\.doc_boundaries=mask needs the eos_id"):
        stream(doc_boundaries="mask")
    with pytest.raises(ConfigError, match=r"train\.data\.doc_boundaries"):
        stream(doc_boundaries="reset", eos_id=0)


def test_data_module_gives_training_and_validation_batches_the_boundary_fields(tmp_path):
    from zaya_pipeline.config import load_config
    from zaya_pipeline.train.data import TokenDataModule

    shards = _token_shards()
    tokens = shards.write_shards(tmp_path / "tok", n_train=5_000, n_val=1_000)
    cfg = load_config(["train=debug", "train.data.doc_boundaries=mask"])
    dm = TokenDataModule(tokens, cfg.train, vocab_size=shards.VOCAB)
    dm.setup("fit")
    x = dm.stream().batch(0)
    assert x["doc_ids"].shape == x["input_ids"].shape == (cfg.train.micro_batch, cfg.train.seq_len)
    v = dm.val_set[0]
    assert torch.equal(v["doc_ids"], boundary_fields(v["input_ids"], shards.EOS, "mask")["doc_ids"])
