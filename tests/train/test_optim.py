from __future__ import annotations

import pytest
import torch

from zaya_pipeline.config import AttentionConfig, ModelConfig, MoEConfig, OptimConfig
from zaya_pipeline.errors import ConfigError
from zaya_pipeline.model import ZayaLM
from zaya_pipeline.train.optim import build_optimizer, build_scheduler, param_groups, warmup_cosine


def test_decay_only_on_matrices_that_are_not_embeddings_or_norms():
    for tie in (True, False):
        cfg = ModelConfig(
            vocab_size=30,
            d_model=16,
            n_layers=1,
            attention=AttentionConfig(n_heads=2),
            tie_embeddings=tie,
            moe=MoEConfig(4, 2, 8),
        )
        model = ZayaLM(cfg)
        decay, keep = param_groups(model, 0.1)
        names = {id(p): n for n, p in model.named_parameters()}
        decayed = {names[id(p)] for p in decay["params"]}
        kept = {names[id(p)] for p in keep["params"]}
        assert "embed.weight" in kept and "final_norm.weight" in kept and "blocks.0.attn_norm.weight" in kept
        assert {
            "blocks.0.moe.w_gate_up_EDF2",
            "blocks.0.moe.w_down_EFD",
            "blocks.0.attn.qkv.weight",
        } <= decayed
        assert ("lm_head.weight" in decayed) == (not tie)
        assert len(decayed) + len(kept) == len(names)
        assert decay["weight_decay"] == 0.1 and keep["weight_decay"] == 0.0


def test_warmup_then_cosine_to_the_floor():
    lrs = [warmup_cosine(s, warmup_steps=10, max_steps=110, min_lr_ratio=0.1) for s in range(130)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a < b for a, b in zip(lrs[:10], lrs[1:10], strict=False))
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:], strict=False))
    assert lrs[60] == pytest.approx(0.55)  # halfway through the cosine
    assert lrs[110] == pytest.approx(0.1) and lrs[129] == pytest.approx(0.1)


def test_scheduler_steps_the_optimizer_lr():
    model = torch.nn.Linear(2, 2)
    cfg = OptimConfig(lr=1e-2, warmup_steps=2, min_lr_ratio=0.0)
    opt = build_optimizer(model, cfg)
    sched = build_scheduler(opt, cfg, max_steps=4)
    seen = []
    for _ in range(4):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([5e-3, 1e-2, 1e-2, 5e-3])


def test_unknown_optimizer_names_the_key():
    with pytest.raises(ConfigError, match="train.optim.name"):
        build_optimizer(torch.nn.Linear(2, 2), OptimConfig(name="sgd"))
