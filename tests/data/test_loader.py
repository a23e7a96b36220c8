"""The token-shard reader and the packed dataset the trainer and evaluator use."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from zaya_pipeline.data.loader import PackedDataset, load_split, read_token_meta
from zaya_pipeline.errors import DataError


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
