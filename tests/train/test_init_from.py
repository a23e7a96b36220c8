"""``train.init_from``: continued pretraining starts from the given weights, with a fresh optimizer and
schedule, and refuses weights of another architecture with one line naming the key."""

from __future__ import annotations

import pytest
from test_train_stage import debug_config

from zaya_pipeline.errors import ConfigError
from zaya_pipeline.train.run import train

SHORT = ("train.max_steps=2", "train.val_every=2", "train.log_every=1", "train.schedule.warmup_steps=1")


def test_training_starts_from_the_weights_it_is_given(tmp_path, token_dir):
    first = train(debug_config(tmp_path / "a", token_dir, "train.max_steps=60", "train.val_every=60"))
    model_pt = tmp_path / "a" / "train" / "model.pt"
    fresh = train(debug_config(tmp_path / "fresh", token_dir, *SHORT))
    gentle = ("train.optim.lr=1e-5", f"train.init_from={model_pt}")
    continued = train(debug_config(tmp_path / "b", token_dir, *SHORT, *gentle))
    # two small steps from random weights stay near ln(vocab); from the trained ones, where training ended
    assert fresh["val_loss"] > first["val_loss"] + 1.0
    assert continued["val_loss"] == pytest.approx(first["val_loss"], abs=0.05)


def test_weights_of_another_architecture_are_refused_naming_the_key(tmp_path, token_dir):
    train(debug_config(tmp_path / "a", token_dir, *SHORT))
    model_pt = tmp_path / "a" / "train" / "model.pt"
    with pytest.raises(
        ConfigError, match=r"train.init_from: .* has model.d_model=64, the config model.d_model=32"
    ):
        train(
            debug_config(tmp_path / "b", token_dir, *SHORT, f"train.init_from={model_pt}", "model.d_model=32")
        )
    with pytest.raises(ConfigError, match="train.init_from: .*nowhere.pt does not exist"):
        train(debug_config(tmp_path / "b", token_dir, *SHORT, f"train.init_from={tmp_path}/nowhere.pt"))
    # knobs that leave the weights' meaning alone may differ
    train(
        debug_config(tmp_path / "c", token_dir, *SHORT, f"train.init_from={model_pt}", "model.init_std=0.5")
    )
