"""config_reads: the keys a stage reads, which tests/test_e2e.py compares with dvc.yaml's params."""

from __future__ import annotations

import dataclasses
import json

from zaya_pipeline.config import ZayaConfig, as_dict
from zaya_pipeline.config_reads import ENV, reads_to_env_folder, recording_reads


def test_field_reads_are_recorded_by_dotted_key():
    cfg = ZayaConfig()
    with recording_reads(cfg) as reads:
        _ = cfg.train.max_steps, cfg.train.optim.lr, cfg.data.curate.steps
    assert reads == {"train.max_steps", "train.optim.lr", "data.curate.steps"}
    _ = cfg.model.d_model  # after the block: nothing recorded, the classes are restored
    assert "model.d_model" not in reads and "__getattribute__" not in vars(type(cfg.model))


def test_a_whole_config_dump_is_not_a_read_but_a_copy_reads_every_field():
    cfg = ZayaConfig()
    with recording_reads(cfg) as reads:
        as_dict(cfg)
        assert reads == set()
        dataclasses.replace(cfg.model.moe, top_k=2)
    assert "model.moe.num_experts" in reads and not any(k.startswith("train.") for k in reads)


def test_env_folder_gets_one_file_per_stage(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(tmp_path))
    cfg = ZayaConfig()
    with reads_to_env_folder("train", cfg):
        _ = cfg.train.seed
    assert json.loads((tmp_path / "train.json").read_text()) == ["train.seed"]
