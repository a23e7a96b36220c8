"""Closed-form parameter counts and FLOPs per token equal the instantiated module's."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from model_cfgs import small_config

from zaya_pipeline.config import MoEConfig, RouterConfig
from zaya_pipeline.model import ZayaLM, num_active_params, num_params
from zaya_pipeline.model.params import forward_flops_per_token, model_info

CONFIGS = [
    small_config(),
    small_config(tie_embeddings=False),
    small_config(d_model=24, n_heads=3, n_layers=3, moe=MoEConfig(num_experts=8, top_k=1, expert_hidden=40)),
    small_config(
        vocab_size=257, tie_embeddings=False, moe=MoEConfig(num_experts=2, top_k=2, expert_hidden=8)
    ),
    small_config(
        moe=MoEConfig(num_experts=4, top_k=1, expert_hidden=16, router=RouterConfig("zaya1", dim=8))
    ),
    small_config(
        moe=MoEConfig(num_experts=3, top_k=2, expert_hidden=8, router=RouterConfig("zaya1", dim=4, eda=False))
    ),
]
CONFIGS.append(dataclasses.replace(CONFIGS[-1], residual_scaling=True))


def config_id(c) -> str:
    moe = c.moe
    return (
        f"V{c.vocab_size}-tie{c.tie_embeddings}-E{moe.num_experts}-{moe.router.type}-rs{c.residual_scaling}"
    )


def measured(model: ZayaLM, include_embedding: bool) -> tuple[float, float]:
    """(total, active) counted from the module: experts' weights count top_k / num_experts when active."""
    cfg = model.cfg
    embedding = {id(model.embed.weight)} | (
        {id(model.lm_head.weight)} if model.lm_head is not None else set()
    )
    experts = {id(b.moe.w_gate_up_EDF2) for b in model.blocks} | {id(b.moe.w_down_EFD) for b in model.blocks}
    total = active = 0.0
    for p in model.parameters():
        if not include_embedding and id(p) in embedding:
            continue
        total += p.numel()
        active += p.numel() * (cfg.moe.top_k / cfg.moe.num_experts if id(p) in experts else 1)
    return total, active


@pytest.mark.parametrize("cfg", CONFIGS, ids=config_id)
@pytest.mark.parametrize("include_embedding", [True, False])
def test_closed_form_matches_module(cfg, include_embedding):
    model = ZayaLM(cfg)
    total, active = measured(model, include_embedding)
    assert num_params(cfg, include_embedding=include_embedding) == total
    assert num_active_params(cfg, include_embedding=include_embedding) == pytest.approx(active)


def test_untied_head_adds_one_embedding_matrix():
    tied, untied = small_config(), small_config(tie_embeddings=False)
    assert num_params(untied) - num_params(tied) == tied.vocab_size * tied.d_model
    assert num_params(untied, include_embedding=False) == num_params(tied, include_embedding=False)


@pytest.mark.parametrize("cfg", CONFIGS, ids=config_id)
def test_closed_form_forward_flops_match_torch_flop_counter(cfg):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    model, B, T = ZayaLM(cfg), 3, cfg.max_seq_len
    ids = torch.randint(0, cfg.vocab_size, (B, T))
    # the math backend runs attention as matmuls the counter sees (the fused CPU kernel is not counted)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(ids)
    assert counter.get_total_flops() == B * T * forward_flops_per_token(cfg, seq_len=T)


def test_model_info_prints_json_for_a_preset_without_building_it(capsys):
    from zaya_pipeline.config import load_config

    cfg = load_config(["model=tiny"])
    model_info(cfg)
    info = json.loads(capsys.readouterr().out)
    assert info["vocab_size"] % cfg.tokenizer.pad_to_multiple == 0 and info["vocab_size"] >= 4096
    assert info["params_active"] < info["params_total"]
    assert info["train_flops_per_token"] == 3 * info["forward_flops_per_token"]
