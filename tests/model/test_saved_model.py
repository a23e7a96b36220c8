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


def _as_format_1(path, cfg_dict: dict, state: dict) -> None:
    """A model.pt as zaya_pipeline wrote it before format 2: no format key, one conv_kernel."""
    attention = {k: v for k, v in cfg_dict["attention"].items() if not k.startswith("conv_kernel_")}
    cfg_dict = {**cfg_dict, "attention": {**attention, "conv_kernel": 2}}
    torch.save({"model_config": cfg_dict, "state_dict": state}, path)


def test_a_format_1_gqa_model_still_loads_with_its_logits(tmp_path):
    """GQA attention and the linear router did not change: their older files load as they were."""
    from dataclasses import asdict

    cfg = small_config()
    torch.manual_seed(0)
    model = ZayaLM(cfg).eval()
    _as_format_1(tmp_path / "model.pt", asdict(cfg), model.state_dict())
    loaded, loaded_cfg = load_model(tmp_path / "model.pt")
    ids = torch.randint(0, cfg.vocab_size, (2, 9))
    torch.testing.assert_close(loaded(ids).logits, model(ids).logits)
    assert loaded_cfg == cfg


@pytest.mark.parametrize(
    "change, key",
    [
        ({"attention": {"type": "cca"}}, "model.attention.type=cca"),
        ({"moe": {"router": {"type": "zaya1"}}}, "model.moe.router.type=zaya1"),
        ({"residual_scaling": True}, "model.residual_scaling=true"),
    ],
)
def test_a_format_1_model_whose_meaning_changed_is_refused_in_one_line(tmp_path, change, key):
    from dataclasses import asdict

    cfg_dict = asdict(small_config())
    for name, value in change.items():
        if isinstance(value, dict):
            sub = dict(cfg_dict[name])
            for k, v in value.items():
                sub[k] = {**sub[k], **v} if isinstance(v, dict) else v
            cfg_dict[name] = sub
        else:
            cfg_dict[name] = value
    _as_format_1(tmp_path / "model.pt", cfg_dict, {})
    with pytest.raises(DataError, match=rf"model.pt: saved by zaya_pipeline before its {key}") as info:
        load_model(tmp_path / "model.pt")
    assert "\n" not in str(info.value) and "retrain" in str(info.value)
