"""The token-shard reader and the packed dataset the trainer and evaluator use."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from zaya_pipeline.data.loader import (
    PackedDataset,
    ShardedTokens,
    boundary_fields,
    load_split,
    read_token_meta,
    token_counts,
)
from zaya_pipeline.errors import ConfigError, DataError


def write_split(tokens_dir: Path, split: str, shards: dict[str, np.ndarray], dtype: str = "uint16") -> None:
    (tokens_dir / split).mkdir(parents=True, exist_ok=True)
    (tokens_dir / "meta.json").write_text(
        json.dumps({"token_dtype": dtype, "vocab_size": 70_000, "eos_id": 0})
    )
    for name, tokens in shards.items():
        # datatrove's byte layout: struct "<H" / "<I", whatever the host order
        (tokens_dir / split / name).write_bytes(tokens.astype(np.dtype(dtype).newbyteorder("<")).tobytes())


def test_shards_are_read_little_endian_in_name_order_skipping_empty_ones(tmp_path):
    write_split(
        tmp_path,
        "train",
        {"b.ds": np.arange(5, 10), "a.ds": np.arange(5), "c.ds": np.array([], dtype=np.int64)},
    )
    assert load_split(tmp_path, "train").tolist() == list(range(10))
    big = np.array([1, 65_535, 65_536, 262_271])
    write_split(tmp_path, "val", {"00000.ds": big}, dtype="uint32")
    out = load_split(tmp_path, "val")
    assert out.tolist() == big.tolist() and out.dtype == np.uint32


def test_windows_are_ordered_and_disjoint_without_a_seed_and_labels_shift_by_one(tmp_path):
    write_split(tmp_path, "val", {"0.ds": np.arange(35)})
    ds = PackedDataset(load_split(tmp_path, "val"), seq_len=8)
    assert len(ds) == 4  # (35 - 1) // 8: the tail that cannot fill a window is left out
    for i in range(len(ds)):
        item = ds[i]
        assert item["input_ids"].tolist() == list(range(8 * i, 8 * i + 8))
        assert item["labels"].tolist() == list(range(8 * i + 1, 8 * i + 9))


def test_a_seed_gives_a_fixed_permutation_of_the_same_windows(tmp_path):
    write_split(tmp_path, "train", {"0.ds": np.arange(1001)})
    tokens = load_split(tmp_path, "train")
    a, b, c = (PackedDataset(tokens, seq_len=10, seed=s) for s in (7, 7, 8))
    starts = [[int(ds[i]["input_ids"][0]) for i in range(len(ds))] for ds in (a, b, c)]
    assert starts[0] == starts[1] != starts[2]
    assert sorted(starts[0]) == sorted(starts[2]) == list(range(0, 1000, 10))
    assert starts[0] != sorted(starts[0])


def test_truncated_shard_missing_meta_or_too_few_tokens_are_data_errors(tmp_path):
    with pytest.raises(DataError, match=r"meta\.json is missing"):
        read_token_meta(tmp_path)
    write_split(tmp_path, "train", {"0.ds": np.arange(10)})
    with (tmp_path / "train" / "0.ds").open("ab") as f:
        f.write(b"\x01")  # half a uint16
    with pytest.raises(DataError, match=r"0\.ds.*truncated"):
        load_split(tmp_path, "train")
    with pytest.raises(DataError, match=r"no token shards"):
        load_split(tmp_path, "val")
    write_split(tmp_path, "val", {"0.ds": np.arange(5)})
    with pytest.raises(DataError, match=r"only 5 tokens"):
        PackedDataset(load_split(tmp_path, "val"), seq_len=8)


def test_many_shards_are_one_memory_mapped_sequence_without_a_copy(tmp_path):
    parts = {"0.ds": np.arange(0, 7), "1.ds": np.arange(7, 10), "2.ds": np.arange(10, 25)}
    write_split(tmp_path, "train", parts)
    tokens, flat = load_split(tmp_path, "train"), np.arange(25)
    assert isinstance(tokens, ShardedTokens) and len(tokens) == 25 and tokens.max() == 24
    assert all(isinstance(s, np.memmap) for s in tokens.shards)
    for a in range(26):
        for b in range(a, 27):
            assert tokens[a:b].tolist() == flat[a:b].tolist(), (a, b)
    assert [int(tokens[i]) for i in (0, 6, 7, 9, 10, 24, -1, -25)] == [0, 6, 7, 9, 10, 24, 24, 0]
    assert isinstance(tokens[2:5], np.memmap), "a slice inside one shard is a view of its memmap"
    with pytest.raises(IndexError):
        tokens[25]
    with pytest.raises(IndexError, match="contiguous"):
        tokens[::2]
    packed, ref = PackedDataset(tokens, seq_len=4, seed=3), PackedDataset(flat, seq_len=4, seed=3)
    assert all(torch.equal(packed[i]["input_ids"], ref[i]["input_ids"]) for i in range(len(ref)))
    assert token_counts(tokens, 30, chunk=4).tolist() == np.bincount(flat, minlength=30).tolist()
    starts = np.array([0, 3, 5, 6, 7, 9, 18, 4, 6])  # inside one shard, across one, across two
    assert tokens.gather(starts, 7).tolist() == [flat[a : a + 7].tolist() for a in starts]


def test_boundary_fields_restart_positions_and_number_documents_after_each_eos():
    ids = torch.tensor([[5, 6, 0, 7, 8, 9, 0, 0, 4], [0, 1, 2, 3, 4, 5, 6, 7, 8]])
    reset = boundary_fields(ids, 0, "reset_positions")
    assert list(reset) == ["position_ids"]
    assert reset["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 0, 0], [0, 0, 1, 2, 3, 4, 5, 6, 7]]
    mask = boundary_fields(ids, 0, "mask")
    assert mask["position_ids"].tolist() == reset["position_ids"].tolist()
    assert mask["doc_ids"].tolist() == [[0, 0, 0, 1, 1, 1, 1, 2, 3], [0, 1, 1, 1, 1, 1, 1, 1, 1]]
    assert boundary_fields(ids, 0, "none") == {}
    with pytest.raises(ConfigError, match=r"train\.data\.doc_boundaries.*'masked'"):
        boundary_fields(ids, 0, "masked")
    with pytest.raises(DataError, match=r"doc_boundaries=mask needs the eos_id"):
        boundary_fields(ids, None, "mask")


def test_packed_items_carry_the_boundary_fields_of_their_window(tmp_path):
    tokens = np.array([3, 4, 0, 5, 6, 7, 0, 8, 9, 1, 0, 2, 3])
    ds = PackedDataset(tokens, seq_len=6, eos_id=0, doc_boundaries="mask")
    item = ds[1]
    assert item["input_ids"].tolist() == [0, 8, 9, 1, 0, 2]
    assert item["position_ids"].tolist() == [0, 0, 1, 2, 3, 0] and item["doc_ids"].tolist() == [
        0,
        1,
        1,
        1,
        1,
        2,
    ]
    assert set(PackedDataset(tokens, seq_len=6)[1]) == {"input_ids", "labels"}
