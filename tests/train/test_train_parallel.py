"""`zaya train parallel=fsdp2_ep2`: Lightning launches 2 CPU processes (gloo) that train with FSDP2 x EP=2,
and match one process on the same global batch."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest
import torch

from zaya_pipeline.model.saved_model import load_model


def run_train(root, token_dir, *overrides):
    args = [
        "train=debug",
        "model=debug",
        "train.max_steps=8",
        "train.val_every=4",
        "train.log_every=2",
        "train.global_batch=16",  # the same global batch for 1 and 2 processes
        "train.micro_batch=4",  # 2 micro-batches per rank: gradients sync once, after the last
        "model.moe.router.aux_loss_coef=0.0",  # aux and z losses are per-rank means: off for the parity
        "model.moe.router.z_loss_coef=0.0",
        f"paths.tokens={token_dir}",
        f"paths.train={root}/train",
        f"paths.reports={root}/reports",
        f"registry.tracking_uri=sqlite:///{root}/mlflow.db",
        *overrides,
    ]
    root.mkdir(exist_ok=True)
    proc = subprocess.run(
        [sys.executable, "-m", "zaya_pipeline.cli", "train", *args],
        capture_output=True, text=True, timeout=600, cwd=root,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(root / "reports" / "plots" / "train.csv") as f:
        losses = [float(row["loss"]) for row in csv.DictReader(f)]
    return json.loads((root / "reports" / "train.json").read_text()), losses, proc.stderr


@pytest.mark.slow
@pytest.mark.distributed
def test_two_process_fsdp2_ep2_training_matches_one_process(tmp_path, token_dir):
    single, single_losses, _ = run_train(tmp_path / "single", token_dir)
    multi, multi_losses, log = run_train(tmp_path / "multi", token_dir, "parallel=fsdp2_ep2")
    assert log.count("val_loss 3.") + log.count("val_loss 2.") + log.count("val_loss 4.") == 2  # rank 0 logs
    assert multi["steps"] == single["steps"] == 8
    for a, b in zip(multi_losses, single_losses, strict=True):
        assert abs(a - b) / b < 1e-4
    # (val_loss is not compared: with 2 ranks each evaluates train.val_batches batches of its own val shard)
    assert multi["val_loss"] < multi["unigram_val_nats_per_token"]
    model, cfg = load_model(tmp_path / "multi" / "train" / "model.pt")  # the full model: both ranks' experts
    reference, _ = load_model(tmp_path / "single" / "train" / "model.pt")
    assert model.blocks[0].moe.experts.w_gate_up_EDF2.shape[0] == cfg.moe.num_experts
    for (name, p), q in zip(model.state_dict().items(), reference.state_dict().values(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=name)
