"""Training-recipe behaviour through the real train stage: exact resume (WSD decay from a stable-phase
checkpoint), gradient accumulation and the batch ramp, multi-phase mixtures, skipped updates."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from test_train_stage import debug_config
from token_shards import write_shards

from zaya_pipeline.config import PhaseConfig
from zaya_pipeline.errors import ConfigError, TrainingError
from zaya_pipeline.model import load_model
from zaya_pipeline.train.run import train

SHORT = ("train.log_every=1", "train.val_every=1000", "train.val_batches=1", "train.schedule.warmup_steps=2")


def weights(path: Path) -> dict[str, torch.Tensor]:
    model, _ = load_model(path / "train" / "model.pt")
    return {**model.state_dict()}


def metric_history(root: Path, run_id: str, key: str) -> dict[int, float]:
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{root}/mlflow.db")
    return {m.step: m.value for m in client.get_metric_history(run_id, key)}


def test_wsd_decay_resumed_from_a_stable_checkpoint_equals_the_uninterrupted_run(tmp_path, token_dir):
    recipe = (
        *SHORT,
        "train/optim=muon",
        "train/schedule=wsd",
        "train.schedule.decay_steps=4",
        "train.max_steps=12",
        "train.micro_batch=8",
        "train.global_batch=16",
        "train.batch_ramp.start=8",
        "train.batch_ramp.increment=8",
        "train.batch_ramp.steps=4",
        "train.stability.spike_zscore=3",
        "train.stability.spike_skip=true",
        "model.moe.router.type=zaya1",
        "model.moe.router.dim=16",
        "train.checkpoint_every=4",
    )
    a, b = tmp_path / "a", tmp_path / "b"
    train(debug_config(a, token_dir, *recipe, f"paths.checkpoints={a}/ckpt"))
    assert sorted(p.name for p in (a / "ckpt").iterdir()) == [f"step{s:07d}" for s in (4, 8, 12)]
    # Step 4 is in the stable phase (decay starts at step 8): resume there in a fresh output folder.
    shutil.copytree(a / "ckpt" / "step0000004", b / "ckpt" / "step0000004")
    summary = train(debug_config(b, token_dir, *recipe, f"paths.checkpoints={b}/ckpt", "train.resume=auto"))
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for key in wa:
        torch.testing.assert_close(wb[key], wa[key], rtol=0, atol=1e-6, msg=key)
    # The resumed run logged only its own steps, with the LR of the uninterrupted schedule.
    lrs = metric_history(b, summary["run_id"], "train/lr/hidden")
    assert sorted(lrs) == list(range(5, 13))
    assert lrs[12] < lrs[9] < lrs[8] == pytest.approx(lrs[5])


def test_a_fresh_run_refuses_old_checkpoints_and_a_missing_resume_path(tmp_path, token_dir):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    old = ckpt / "step0000004"
    old.mkdir()
    (old / ".metadata").write_bytes(b"")
    (old / "trainer.pt").write_bytes(b"")
    (ckpt / ".step0000006.partial").mkdir()  # a save that never finished is not a checkpoint
    cfg = (f"paths.checkpoints={ckpt}", "train.checkpoint_every=2", "train.max_steps=4")
    with pytest.raises(ConfigError, match="train.resume=auto"):
        train(debug_config(tmp_path, token_dir, *cfg))
    with pytest.raises(ConfigError, match="train.resume: checkpoint .*nowhere does not exist"):
        train(debug_config(tmp_path, token_dir, *cfg, f"train.resume={tmp_path}/nowhere"))
    with pytest.raises(ConfigError, match="partial is not a complete checkpoint directory"):
        train(debug_config(tmp_path, token_dir, *cfg, f"train.resume={ckpt}/.step0000006.partial"))


def test_micro_batches_accumulate_to_the_same_step_as_one_big_batch(tmp_path, token_dir):
    # The load-balancing loss is computed per micro-batch (its load fractions are not linear in the tokens),
    # so it is off here: then 4 micro-batches of 8 are one batch of 32 up to float rounding.
    common = (*SHORT, "train.max_steps=3", "train.global_batch=32", "train.optim.grad_clip=0.5")
    common = (*common, "model.moe.router.aux_loss_coef=0")
    train(debug_config(tmp_path / "one", token_dir, *common, "train.micro_batch=32"))
    train(debug_config(tmp_path / "four", token_dir, *common, "train.micro_batch=8"))
    wa, wb = weights(tmp_path / "one"), weights(tmp_path / "four")
    for key in wa:
        torch.testing.assert_close(wb[key], wa[key], rtol=0, atol=2e-5, msg=key)


def test_the_batch_ramp_sets_tokens_per_step_and_tokens_seen(tmp_path, token_dir):
    ramp = ("train.batch_ramp.start=4", "train.batch_ramp.increment=4", "train.batch_ramp.steps=6")
    batch = ("train.global_batch=12", "train.micro_batch=8")  # 12 sequences = micro-batches of 8 and 4
    summary = train(debug_config(tmp_path, token_dir, *SHORT, *ramp, *batch, "train.max_steps=8"))
    seq = 64  # train=debug
    per_step = metric_history(tmp_path, summary["run_id"], "train/tokens_per_step")
    # 4 -> 12 sequences in 2 increments over 6 steps: 3 steps of 4, 3 of 8, then the full 12.
    assert [per_step[s] for s in range(1, 9)] == [4 * seq] * 3 + [8 * seq] * 3 + [12 * seq] * 2
    metrics = json.loads((tmp_path / "reports" / "train.json").read_text())
    assert metrics["tokens_seen"] == (3 * 4 + 3 * 8 + 2 * 12) * seq
    schedule = (tmp_path / "reports" / "plots" / "schedule.csv").read_text().splitlines()
    assert schedule[0] == "step,lr_multiplier,tokens_per_step" and len(schedule) == 9
    assert (tmp_path / "train" / "schedule.png").stat().st_size > 1000


@pytest.fixture(scope="module")
def two_sources(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("sources")
    return {"web": str(write_shards(root / "web")), "code": str(write_shards(root / "code"))}


def _phase_cfg(root: Path, token_dir: Path, sources: dict[str, str], *overrides: str):
    cfg = debug_config(root, token_dir, *SHORT, "train.micro_batch=4", *overrides)
    cfg.train.data.sources = sources
    cfg.train.data.phases = [
        PhaseConfig("web_heavy", tokens=5 * 4 * 64 - 10, weights={"web": 1.0}),  # 20 sequences minus a bit
        PhaseConfig("code_heavy", tokens=0, weights={"web": 0.25, "code": 0.75}),
    ]
    return cfg


def test_phase_switch_happens_at_the_configured_step_and_survives_resume(tmp_path, token_dir, two_sources):
    # Budget 1270 tokens = 19 sequences of 64: batches of 4 switch at batch ceil(19 / 4) = 5, i.e. the batch
    # of optimizer step 6 (steps count from 1) is the first of phase 1.
    ckpt = ("train.max_steps=10", "train.checkpoint_every=3")
    a = _phase_cfg(tmp_path / "a", token_dir, two_sources, *ckpt, f"paths.checkpoints={tmp_path}/a/ckpt")
    summary = train(a)
    phase = metric_history(tmp_path / "a", summary["run_id"], "data/phase")
    assert [phase[s] for s in range(1, 11)] == [0.0] * 5 + [1.0] * 5
    web = metric_history(tmp_path / "a", summary["run_id"], "data/frac/web")
    assert all(web[s] == 1.0 for s in range(1, 6)) and sum(web[s] for s in range(6, 11)) < 5.0
    # Resume inside phase 0 (step 3): the switch still comes at step 6 and the weights match.
    shutil.copytree(tmp_path / "a" / "ckpt" / "step0000003", tmp_path / "b" / "ckpt" / "step0000003")
    b = _phase_cfg(tmp_path / "b", token_dir, two_sources, *ckpt, f"paths.checkpoints={tmp_path}/b/ckpt")
    b.train.resume = "auto"
    resumed = train(b)
    phase_b = metric_history(tmp_path / "b", resumed["run_id"], "data/phase")
    assert [phase_b[s] for s in range(4, 11)] == [0.0] * 2 + [1.0] * 5
    wa, wb = weights(tmp_path / "a"), weights(tmp_path / "b")
    for key in wa:
        torch.testing.assert_close(wb[key], wa[key], rtol=0, atol=1e-6, msg=key)


def test_a_nan_loss_skips_the_update_and_too_many_in_a_row_stop_training(tmp_path, token_dir, monkeypatch):
    import zaya_pipeline.train.module as module

    calls = {"n": 0}
    real = module.lm_loss

    def flaky(logits, labels, bad=frozenset({3})):
        calls["n"] += 1
        loss = real(logits, labels)
        return loss * math.nan if calls["n"] in bad else loss

    monkeypatch.setattr(module, "lm_loss", flaky)
    train(debug_config(tmp_path / "one", token_dir, *SHORT, "train.max_steps=6"))
    metrics = json.loads((tmp_path / "one" / "reports" / "train.json").read_text())
    # a step is a batch: 6 steps, of which 5 updated the weights (ADR 0007)
    assert metrics["steps"] == 6 and metrics["skipped_steps"] == 1 and math.isfinite(metrics["val_loss"])
    assert metrics["tokens_seen"] == 6 * 16 * 64

    calls["n"] = 0
    monkeypatch.setattr(module, "lm_loss", lambda lo, la: real(lo, la) * math.nan)
    with pytest.raises(TrainingError, match="3 updates in a row skipped by step 3"):
        train(debug_config(tmp_path / "all", token_dir, *SHORT, "train.stability.max_skips_in_row=3"))


def test_deterministic_mode_trains_and_repeats_bit_for_bit(tmp_path, token_dir):
    det = (*SHORT, "train.max_steps=3", "train.deterministic=true", "train/optim=muon")
    train(debug_config(tmp_path / "a", token_dir, *det))
    train(debug_config(tmp_path / "b", token_dir, *det))
    wa, wb = weights(tmp_path / "a"), weights(tmp_path / "b")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
