from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from model_cfgs import small_config

from zaya_pipeline.config import AttentionConfig, MoEConfig, RouterConfig
from zaya_pipeline.errors import ConfigError
from zaya_pipeline.model import ZayaLM


def test_output_shapes_and_router_telemetry(cfg):
    torch.manual_seed(0)
    model = ZayaLM(cfg)
    ids = torch.randint(0, cfg.vocab_size, (3, 10))
    out = model(ids)
    assert out.logits.shape == (3, 10, cfg.vocab_size)
    assert out.aux_loss.ndim == 0 and out.aux_loss.requires_grad
    assert out.expert_counts_LE.shape == (cfg.n_layers, cfg.moe.num_experts)
    assert not out.expert_counts_LE.requires_grad
    assert (out.expert_counts_LE.sum(dim=1) == 3 * 10 * cfg.moe.top_k).all()


def test_aux_loss_is_the_weighted_sum_over_layers(cfg):
    torch.manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (2, 8))
    model = ZayaLM(cfg)
    zero = dataclasses.replace(
        cfg.moe, router=dataclasses.replace(cfg.moe.router, aux_loss_coef=0.0, z_loss_coef=0.0)
    )
    model_zero = ZayaLM(dataclasses.replace(cfg, moe=zero))
    model_zero.load_state_dict(model.state_dict())
    assert model_zero(ids).aux_loss.item() == 0.0
    # Balanced routing gives aux ~ 1 per layer, so the total is at least n_layers * aux_loss_coef.
    assert model(ids).aux_loss.item() >= cfg.n_layers * cfg.moe.router.aux_loss_coef * 0.99


def test_causal_changing_a_token_never_changes_earlier_logits(cfg):
    torch.manual_seed(0)
    model = ZayaLM(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 16))
    base = model(ids).logits
    for t in (0, 5, 15):
        changed = ids.clone()
        changed[:, t] = (changed[:, t] + 1) % cfg.vocab_size
        logits = model(changed).logits
        torch.testing.assert_close(logits[:, :t], base[:, :t], rtol=0, atol=1e-6)
        assert not torch.allclose(logits[:, t], base[:, t])


def test_vocab_size_zero_is_a_config_error(cfg):
    with pytest.raises(ConfigError, match="model.vocab_size"):
        ZayaLM(dataclasses.replace(cfg, vocab_size=0))


def test_bad_head_count_and_overlong_input_are_errors(cfg):
    with pytest.raises(ConfigError, match="model.attention.n_heads"):
        ZayaLM(dataclasses.replace(cfg, attention=dataclasses.replace(cfg.attention, n_heads=3)))
    with pytest.raises(ConfigError, match="model.attention.type"):
        ZayaLM(dataclasses.replace(cfg, attention=dataclasses.replace(cfg.attention, type="mla")))
    with pytest.raises(ConfigError, match="model.max_seq_len"):
        ZayaLM(cfg)(torch.zeros(1, cfg.max_seq_len + 1, dtype=torch.long))


def test_unknown_expert_backend_fails_at_build(cfg):
    with pytest.raises(ConfigError, match="model.moe.expert_backend"):
        ZayaLM(dataclasses.replace(cfg, moe=dataclasses.replace(cfg.moe, expert_backend="nope")))


def test_depth_scaled_init_of_residual_projections():
    cfg = small_config(
        n_layers=8,
        d_model=64,
        attention=AttentionConfig(n_heads=4),
        moe=MoEConfig(num_experts=4, top_k=2, expert_hidden=64),
    )
    torch.manual_seed(0)
    model = ZayaLM(cfg)
    block = model.blocks[0]
    assert block.attn.qkv.weight.std().item() == pytest.approx(cfg.init_std, rel=0.1)
    assert block.attn.out.weight.std().item() == pytest.approx(cfg.init_std / 4, rel=0.1)  # / sqrt(2 * 8)
    assert block.moe.experts.w_down_EFD.std().item() == pytest.approx(cfg.init_std / 4, rel=0.1)
    assert torch.equal(block.attn_norm.weight, torch.ones(cfg.d_model))


OVERFIT_CONFIGS = {
    "gqa-linear": small_config(
        vocab_size=64, d_model=64, max_seq_len=64, moe=MoEConfig(num_experts=4, top_k=2, expert_hidden=128)
    ),
    "zaya1": small_config(  # CCA, ZAYA1 router with skip expert, top-1, residual scaling
        vocab_size=64,
        d_model=64,
        max_seq_len=64,
        residual_scaling=True,
        attention=AttentionConfig("cca", n_heads=4, n_kv_heads=2, head_dim=16, rope_fraction=0.5),
        moe=MoEConfig(
            num_experts=4,
            top_k=1,
            expert_hidden=128,
            skip_expert=True,
            router=RouterConfig("zaya1", aux_loss_coef=0.0, dim=32),
        ),
    ),
}


@pytest.mark.parametrize("name", OVERFIT_CONFIGS)
def test_debug_model_overfits_one_batch(name):
    cfg = OVERFIT_CONFIGS[name]
    torch.manual_seed(0)
    model = ZayaLM(cfg)
    ids = torch.randint(0, cfg.vocab_size, (4, 33))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    # Memorizing 128 random tokens takes ~200 steps; how many exactly depends on the CPU's float path (AMD
    # hosts got there by 200, Intel Xeon hosts were at 0.097), so the budget is a cap, not the claim: the
    # loss must fall from ln(64) = 4.16 to under 0.05 (memorized) before the cap.
    step = 0
    for step in range(600):  # noqa: B007 (the message below names it)
        out = model(ids[:, :-1])
        loss = F.cross_entropy(out.logits.flatten(0, 1), ids[:, 1:].flatten())
        if loss.item() < 0.05:
            break
        opt.zero_grad()
        (loss + out.aux_loss).backward()
        opt.step()
        model.update_router_biases()
    assert loss.item() < 0.05, f"loss {loss.item():.3f} after {step + 1} steps"


def test_residual_scaling_starts_as_the_plain_residual_and_learns(cfg):
    torch.manual_seed(0)
    plain = ZayaLM(cfg)
    torch.manual_seed(0)
    scaled = ZayaLM(dataclasses.replace(cfg, residual_scaling=True, moe_out_scale_init=1.0))
    ids = torch.randint(0, cfg.vocab_size, (2, 8))
    torch.testing.assert_close(scaled(ids).logits, plain(ids).logits)  # scales 1, biases 0 at init
    torch.manual_seed(0)  # the tiny default's MoE output scale (5) is the only difference
    boosted = ZayaLM(dataclasses.replace(cfg, residual_scaling=True, moe_out_scale_init=5.0))
    with torch.no_grad():
        for block in boosted.blocks:
            block.moe_add.out_scale_D.fill_(1.0)
    torch.testing.assert_close(boosted(ids).logits, plain(ids).logits)
    scaled(ids).logits.square().mean().backward()
    block = scaled.blocks[0]
    for p in (block.attn_add.res_scale_D, block.attn_add.out_bias_D, block.moe_add.out_scale_D):
        assert p.grad is not None and p.grad.abs().sum() > 0
    with torch.no_grad():
        block.moe_add.res_scale_D.fill_(0.5)
    assert not torch.allclose(scaled(ids).logits, plain(ids).logits)
