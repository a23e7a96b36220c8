from __future__ import annotations

import pytest
import torch
from model_cfgs import small_config

from zaya_pipeline.errors import DataError
from zaya_pipeline.model import ZayaLM, load_model, save_model


@pytest.mark.parametrize("tie", [True, False])
def test_round_trip_gives_identical_logits(tmp_path, tie):
    cfg = small_config(tie_embeddings=tie)
    torch.manual_seed(0)
    model = ZayaLM(cfg)
    path = save_model(tmp_path / "out" / "model.pt", model, cfg)
    loaded, loaded_cfg = load_model(path)
    assert loaded_cfg == cfg
    assert not loaded.training
    ids = torch.randint(0, cfg.vocab_size, (2, 9))
    assert torch.equal(loaded(ids).logits, model(ids).logits)
    assert [p.name for p in tmp_path.joinpath("out").iterdir()] == ["model.pt"]  # no temp file left behind


def test_missing_checkpoint_says_to_train(tmp_path):
    with pytest.raises(DataError, match="train stage"):
        load_model(tmp_path / "model.pt")


def test_foreign_file_is_a_data_error(tmp_path):
    torch.save({"something": 1}, tmp_path / "model.pt")
    with pytest.raises(DataError, match="not a zaya model checkpoint"):
        load_model(tmp_path / "model.pt")
