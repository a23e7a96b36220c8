"""Closed-form parameter counts and FLOPs per token equal the instantiated module's."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from model_cfgs import cca_config, small_config

from zaya_pipeline.config import AttentionConfig, MoEConfig, RouterConfig, load_config
from zaya_pipeline.model import ZayaLM, num_active_params, num_params
from zaya_pipeline.model.attention import head_dims
from zaya_pipeline.model.sizing import forward_flops_per_token, model_info, with_resolved_vocab

CONFIGS = [
    small_config(),
    small_config(tie_embeddings=False),
    small_config(
        d_model=24,
        n_layers=3,
        attention=AttentionConfig(n_heads=3),
        moe=MoEConfig(num_experts=8, top_k=1, expert_hidden=40),
    ),
    small_config(attention=AttentionConfig(n_heads=4, n_kv_heads=2, head_dim=6, rope_fraction=0.5)),
    cca_config(),
    cca_config(
        attention=AttentionConfig(
            "cca", n_heads=2, n_kv_heads=2, head_dim=4, conv_kernel_depthwise=3, conv_kernel_grouped=4
        ),
        moe=MoEConfig(num_experts=4, top_k=1, expert_hidden=8, skip_expert=True, shared_expert_hidden=12),
    ),
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
CONFIGS.append(
    cca_config(
        moe=MoEConfig(
            num_experts=4, top_k=1, expert_hidden=8, skip_expert=True, router=RouterConfig("zaya1", dim=4)
        )
    )
)
PRESETS = ["debug", "tiny", "small", "zaya1_base"]


def config_id(c) -> str:
    moe, a = c.moe, c.attention
    return (
        f"V{c.vocab_size}-tie{c.tie_embeddings}-{a.type}{a.n_heads}x{a.n_kv_heads}-E{moe.num_experts}"
        f"{'s' if moe.skip_expert else ''}-{moe.router.type}-rs{c.residual_scaling}"
        f"-sh{moe.shared_expert_hidden}"
    )


def measured(model: ZayaLM, include_embedding: bool) -> tuple[float, float]:
    """(total, active) counted from the module: experts' weights count top_k / num_experts when active."""
    cfg = model.cfg
    embedding = {id(model.embed.weight)} | (
        {id(model.lm_head.weight)} if model.lm_head is not None else set()
    )
    experts = {id(w) for b in model.blocks for w in b.moe.experts.weights()}
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


def preset(name: str):
    """A preset's model config with the vocabulary resolved as ``model-info`` resolves it."""
    return with_resolved_vocab(load_config([f"model={name}"]))


@pytest.mark.parametrize("name", PRESETS)
def test_closed_form_matches_module_for_every_preset(name):
    cfg = preset(name)
    with torch.device("meta"):  # no memory: ZAYA1-base has 8.8B parameters
        model = ZayaLM(cfg)
    for include_embedding in (True, False):
        total, active = measured(model, include_embedding)
        assert num_params(cfg, include_embedding=include_embedding) == total
        assert num_active_params(cfg, include_embedding=include_embedding) == pytest.approx(active)


def test_zaya1_base_matches_the_published_sizes():
    """8.3B total and 760M active: both are non-embedding counts (see ZAYA1.md)."""
    cfg = preset("zaya1_base")
    assert num_params(cfg, include_embedding=False) == pytest.approx(8.3e9, rel=0.03)
    assert num_active_params(cfg, include_embedding=False) == pytest.approx(760e6, rel=0.03)
    assert cfg.vocab_size == 262_272 and cfg.n_layers == 40 and cfg.d_model == 2048


def test_small_preset_is_about_one_billion_parameters():
    assert num_params(preset("small")) == pytest.approx(1e9, rel=0.1)


def test_untied_head_adds_one_embedding_matrix():
    tied, untied = small_config(), small_config(tie_embeddings=False)
    assert num_params(untied) - num_params(tied) == tied.vocab_size * tied.d_model
    assert num_params(untied, include_embedding=False) == num_params(tied, include_embedding=False)


@pytest.mark.parametrize("cfg", CONFIGS, ids=config_id)
def test_closed_form_forward_flops_match_torch_flop_counter(cfg):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    # loop: the counter sees its matmuls (it does not count grouped_mm or Triton launches)
    cfg = dataclasses.replace(cfg, moe=dataclasses.replace(cfg.moe, expert_backend="loop"))
    model, B, T = ZayaLM(cfg), 3, cfg.max_seq_len
    ids = torch.randint(0, cfg.vocab_size, (B, T))
    # the math backend runs attention as matmuls the counter sees (the fused CPU kernel is not counted)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        out = model(ids)
    # Slots routed to the skip expert are not computed (the closed form does not discount them; k = 1 here).
    skipped = int(out.expert_counts_LE[:, -1].sum()) if cfg.moe.skip_expert else 0
    expert_flops = 2 * 3 * cfg.d_model * cfg.moe.expert_hidden
    # CCA's depthwise convolution also runs on the K1 - 1 padding positions in front of each sequence (the
    # closed form, per token, leaves out this per-sequence term)
    padding_flops = 0
    if cfg.attention.type == "cca":
        H, G, Hd = head_dims(cfg)
        a = cfg.attention
        padding_flops = (
            2 * (H + G) * Hd * a.conv_kernel_depthwise * (a.conv_kernel_grouped - 1) * B * cfg.n_layers
        )
    assert (
        counter.get_total_flops()
        == B * T * forward_flops_per_token(cfg, seq_len=T) - skipped * expert_flops + padding_flops
    )


def test_model_info_prints_json_for_a_preset_without_building_it(capsys):
    from zaya_pipeline.config import load_config

    cfg = load_config(["model=tiny"])
    model_info(cfg)
    info = json.loads(capsys.readouterr().out)
    assert info["vocab_size"] % cfg.tokenizer.pad_to_multiple == 0 and info["vocab_size"] >= 4096
    assert info["params_active"] < info["params_total"]
    assert info["train_flops_per_token"] == 3 * info["forward_flops_per_token"]
