"""Loading a checkpoint never runs code: a payload planted in any pickle-format part of a real checkpoint
(DCP's ``.metadata``, a tensor record inside a shard, a bytes entry declared in the metadata, an older
version's ``trainer.pt``) is refused with an error naming the file, and the payload does not run."""

from __future__ import annotations

import dataclasses
import math
import os
import pickle

import numpy as np
import pytest
import torch
from test_checkpoint import global_batches, optimizer, train_steps
from test_parallelize import fresh_model

from zaya_pipeline.distributed.checkpoint import (
    TRAINER_FILE,
    checkpoint_name,
    load_checkpoint,
    save_checkpoint,
)
from zaya_pipeline.distributed.safe_load import (
    UnsafeCheckpointFile,
    dump_state,
    load_state,
    read_dcp_metadata,
)
from zaya_pipeline.errors import ConfigError


class Payload:
    """Unpickling this runs a shell command that creates ``marker``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture
def saved(tmp_path):
    """(checkpoint dir, model, optimizer) after one AdamW step of the test model."""
    model = fresh_model()
    opt = optimizer(model)
    train_steps(model, opt, global_batches()[:1], 0, 1)
    path = save_checkpoint(tmp_path / checkpoint_name(1), model, [opt], {"step": 1}, {})
    return path, model, opt


def _fresh():
    model = fresh_model()
    return model, optimizer(model)


def test_the_payload_runs_under_plain_pickle(tmp_path):
    """The check below is meaningful: the same bytes do run code when unpickled without restriction."""
    marker = tmp_path / "ran"
    pickle.loads(pickle.dumps(Payload(marker)))
    assert marker.exists()


def test_a_checkpoint_holds_no_pickle_but_metadata_and_resumes_param_groups(saved):
    path, _, opt = saved
    assert sorted(p.name for p in path.iterdir()) == [".metadata", "__0_0.distcp", TRAINER_FILE]
    meta = read_dcp_metadata(path / ".metadata")
    kinds = {type(md).__name__ for md in meta.state_dict_metadata.values()}
    assert kinds == {"TensorStorageMetadata"}  # no bytes entries: DCP would unpickle those freely
    model, opt2 = _fresh()
    state = load_checkpoint(path, model, [opt2])
    assert state["step"] == 1
    assert [g["lr"] for g in opt2.param_groups] == [g["lr"] for g in opt.param_groups]
    assert [g["betas"] for g in opt2.param_groups] == [g["betas"] for g in opt.param_groups]


def test_planted_metadata_is_refused_before_it_runs(saved, tmp_path):
    path, _, _ = saved
    marker = tmp_path / "ran"
    (path / ".metadata").write_bytes(pickle.dumps(Payload(marker)))
    model, opt = _fresh()
    with pytest.raises(UnsafeCheckpointFile, match=r"\.metadata: refused to load: it names posix\.system"):
        load_checkpoint(path, model, [opt])
    assert not marker.exists()


def test_a_planted_tensor_record_in_a_shard_is_refused_before_it_runs(saved, tmp_path):
    """A shard's tensor record replaced by a ``torch.save`` of a payload (the metadata, itself legitimate,
    pointing at it): DCP's ``torch.load(weights_only=True)`` refuses it and we say so in one line."""
    import io

    path, _, _ = saved
    marker = tmp_path / "ran"
    blob = io.BytesIO()
    torch.save(Payload(marker), blob)
    shard = path / "__0_0.distcp"
    offset = shard.stat().st_size
    with shard.open("ab") as f:
        f.write(blob.getvalue())
    with (path / ".metadata").open("rb") as f:
        meta = pickle.load(f)  # our own file, read to rewrite it
    index = next(i for i in meta.storage_data if i.fqn == "final_norm.weight")
    meta.storage_data[index] = dataclasses.replace(
        meta.storage_data[index], offset=offset, length=len(blob.getvalue())
    )
    with (path / ".metadata").open("wb") as f:
        pickle.dump(meta, f)
    model, opt = _fresh()
    with pytest.raises(UnsafeCheckpointFile, match="a shard holds a pickled object, not a tensor: refused"):
        load_checkpoint(path, model, [opt])
    assert not marker.exists()


def test_a_bytes_entry_declared_in_the_metadata_is_refused(saved, tmp_path):
    """Metadata that turns a tensor entry into a pickled-object entry (which DCP would ``torch.load`` with
    ``weights_only=False``) is refused before any shard is read."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    path, _, _ = saved
    with (path / ".metadata").open("rb") as f:
        meta = pickle.load(f)
    meta.state_dict_metadata["final_norm.weight"] = BytesStorageMetadata()
    with (path / ".metadata").open("wb") as f:
        pickle.dump(meta, f)
    model, opt = _fresh()
    with pytest.raises(UnsafeCheckpointFile, match="stores final_norm.weight as a pickled object"):
        load_checkpoint(path, model, [opt])


def test_an_older_versions_pickled_trainer_state_is_refused_before_it_runs(saved, tmp_path):
    path, _, _ = saved
    marker = tmp_path / "ran"
    (path / TRAINER_FILE).unlink()
    torch.save(Payload(marker), path / "trainer.pt")
    model, opt = _fresh()
    with pytest.raises(ConfigError, match=r"saved by an older version as a pickle \(trainer.pt\)"):
        load_checkpoint(path, model, [opt])
    assert not marker.exists()


def test_a_trainer_state_that_is_not_ours_names_the_file(saved):
    path, _, _ = saved
    (path / TRAINER_FILE).write_text('{"zaya_rng": {"__tensor__": {"dtype": "os.system"}}}')
    model, opt = _fresh()
    with pytest.raises(ConfigError, match=f"{TRAINER_FILE} is not a trainer state"):
        load_checkpoint(path, model, [opt])


def test_trainer_state_round_trips_through_json(tmp_path):
    state = {
        "step": 3,
        "ratio": 0.25,
        "odd": [math.inf, -math.inf],
        "betas": (0.9, 0.95),
        "rng": {
            "torch": torch.arange(7, dtype=torch.uint8),
            "numpy": ("MT19937", np.arange(5, dtype=np.uint32), 624, 0, 0.0),
            "python": (3, tuple(range(5)), None),
        },
        "by_id": {0: "a", 1: "b"},
        "__tuple__": "a key that looks like a tag",
        "bf16": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
        "empty": torch.empty(0, 3),
    }
    dump_state(state, tmp_path / "s.json")
    back = load_state(tmp_path / "s.json")
    assert back.keys() == state.keys()
    assert back["betas"] == (0.9, 0.95) and back["by_id"] == {0: "a", 1: "b"}
    assert back["odd"] == [math.inf, -math.inf] and back["__tuple__"] == state["__tuple__"]
    assert back["rng"]["python"] == state["rng"]["python"]
    np.testing.assert_array_equal(back["rng"]["numpy"][1], state["rng"]["numpy"][1])
    assert back["rng"]["numpy"][1].dtype == np.uint32
    for key in ("bf16", "empty"):
        torch.testing.assert_close(back[key], state[key], rtol=0, atol=0)
    assert torch.equal(back["rng"]["torch"], state["rng"]["torch"])
    with pytest.raises(TypeError, match=r"trainer state \.fn: cannot store a builtin_function_or_method"):
        dump_state({"fn": len}, tmp_path / "bad.json")
