"""``train.precision=bf16-master``: bf16 weights for forward and backward, fp32 masters for the optimizer.
50 steps of the debug model stay within the tolerance docs/training.md states of the fp32 run; outside the
step the parameters are the fp32 masters (what checkpoints and the saved model hold)."""

from __future__ import annotations

import pytest
import torch
from test_train_stage import debug_config, logged_losses

from zaya_pipeline.config import ModelConfig, MoEConfig
from zaya_pipeline.errors import ConfigError
from zaya_pipeline.model import load_model
from zaya_pipeline.model.transformer import ZayaLM
from zaya_pipeline.train.precision import Bf16Weights
from zaya_pipeline.train.run import train

STEPS = 50
TOL = 0.02  # |bf16-master - fp32| / fp32 of each logged train loss (measured max 0.0058: docs/training.md)


def test_bf16_weights_swap_in_and_out():
    model = ZayaLM(ModelConfig(name="t", vocab_size=50, d_model=16, n_layers=1, max_seq_len=16,
                               moe=MoEConfig(num_experts=4, top_k=2, expert_hidden=16)))  # fmt: skip
    weights = Bf16Weights(model)
    masters = {name: p.data for name, p in model.named_parameters()}
    with weights:
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
        out = model(torch.randint(0, 50, (2, 8)))
        assert out.logits.dtype == torch.bfloat16
        (out.logits.float().square().mean() + out.aux_loss).backward()
    for name, p in model.named_parameters():
        assert p.data_ptr() == masters[name].data_ptr() and p.dtype == torch.float32, name  # the masters
        assert p.grad is None or p.grad.dtype == torch.float32, name
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


@pytest.mark.slow
def test_bf16_master_trains_like_fp32(tmp_path, token_dir):
    common = (f"train.max_steps={STEPS}", "train.log_every=5")
    fp32 = logged_losses(tmp_path / "fp32", token_dir, *common)
    bf16 = logged_losses(tmp_path / "bf16", token_dir, *common, "train.precision=bf16-master")
    assert len(fp32) == len(bf16) == STEPS // 5
    assert bf16[-1] < bf16[0]  # it learns
    worst = max(abs(a - b) / a for a, b in zip(fp32, bf16, strict=True))
    print(f"bf16-master vs fp32, {STEPS} steps: max relative loss difference {worst:.4f}")
    assert worst < TOL, (fp32, bf16)
    model, _ = load_model(tmp_path / "bf16" / "train" / "model.pt")
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # the masters are what is saved


def test_bf16_master_is_refused_with_fsdp2(tmp_path, token_dir):
    cfg = debug_config(tmp_path, token_dir, "train.precision=bf16-master", "parallel.strategy=fsdp2")
    with pytest.raises(ConfigError, match="parallel.param_dtype=bfloat16"):
        train(cfg)
