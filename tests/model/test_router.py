from __future__ import annotations

import math

import pytest
import torch

from zaya_pipeline.config import MoEConfig, RouterConfig
from zaya_pipeline.errors import ConfigError
from zaya_pipeline.model.router import (
    LinearRouter,
    Zaya1Router,
    build_router,
    load_balancing_loss,
    router_z_loss,
)


def test_balanced_routing_gives_the_minimum_of_one():
    E, T = 4, 8
    probs = torch.full((T, E), 1.0 / E)
    ids = torch.arange(T).remainder(E)[:, None]  # every expert gets T / E tokens
    assert load_balancing_loss(probs, ids).item() == pytest.approx(1.0)


def test_skewed_routing_costs_more():
    E, T = 4, 8
    uniform = load_balancing_loss(torch.full((T, E), 1.0 / E), torch.arange(T).remainder(E)[:, None])
    probs = torch.tensor([[0.7, 0.1, 0.1, 0.1]]).repeat(T, 1)
    collapsed = load_balancing_loss(probs, torch.zeros(T, 1, dtype=torch.long))
    assert collapsed.item() == pytest.approx(E * 0.7)
    assert collapsed > uniform
    half = load_balancing_loss(
        torch.tensor([[0.4, 0.4, 0.1, 0.1]]).repeat(T, 1), torch.arange(T).remainder(2)[:, None]
    )
    assert uniform < half < collapsed


def test_z_loss_is_the_squared_log_partition():
    logits = torch.tensor([[0.0, 0.0], [math.log(3.0), 0.0]])
    expected = (math.log(2.0) ** 2 + math.log(4.0) ** 2) / 2
    assert router_z_loss(logits).item() == pytest.approx(expected)


def route(num_experts: int, top_k: int, tokens: int):
    """A seeded linear router on random tokens: (router, its output, the reference softmax probabilities)."""
    torch.manual_seed(0)
    router = LinearRouter(d_model=8, num_experts=num_experts, top_k=top_k)
    x = torch.randn(tokens, 8)
    return router, router(x), (x @ router.proj.weight.t()).softmax(-1)


def test_linear_router_top_k_and_renormalized_weights():
    _, out, probs = route(num_experts=5, top_k=2, tokens=30)
    assert torch.equal(out.topk_ids_TK, probs.topk(2, dim=-1).indices)
    torch.testing.assert_close(out.topk_weights_TK.sum(-1), torch.ones(30))
    chosen = probs.gather(1, out.topk_ids_TK)
    torch.testing.assert_close(out.topk_weights_TK, chosen / chosen.sum(-1, keepdim=True))
    assert out.num_tokens_per_expert_E.sum().item() == 60
    assert out.aux_loss.requires_grad and out.z_loss.requires_grad


def test_unknown_router_type_names_the_key():
    with pytest.raises(ConfigError, match="model.moe.router.type"):
        build_router(8, MoEConfig(router=RouterConfig(type="zaya-mlp-someday")))


def test_top1_keeps_the_raw_probability_so_the_router_learns_from_the_lm_loss():
    router, out, probs = route(num_experts=4, top_k=1, tokens=20)
    torch.testing.assert_close(out.topk_weights_TK[:, 0], probs.max(-1).values)
    out.topk_weights_TK.sum().backward()
    assert router.proj.weight.grad.abs().sum() > 0


def zaya1(
    num_experts: int = 4, top_k: int = 1, d_model: int = 16, layer_idx: int = 1, **router
) -> Zaya1Router:
    """The router of a layer past the first (which has no EDA scale)."""
    torch.manual_seed(0)
    cfg = RouterConfig(type="zaya1", dim=32, **router)
    r = Zaya1Router(d_model, num_experts, top_k, cfg, layer_idx=layer_idx)
    r.reset_parameters(std=0.2)
    return r


def test_zaya1_selects_with_the_bias_but_gates_without_it():
    router = zaya1()
    x = torch.randn(50, 16)
    free = router(x)
    with torch.no_grad():
        router.expert_bias_E[2] = 10.0  # no probability can beat this: every token picks expert 2
    biased = router(x)
    assert (biased.topk_ids_TK == 2).all() and not (free.topk_ids_TK == 2).all()
    probs = router.mlp(router.norm(router.down(x))).softmax(-1)
    torch.testing.assert_close(biased.topk_weights_TK[:, 0], probs[:, 2])  # the unbiased probability
    biased.topk_weights_TK.sum().backward()
    assert router.mlp[4].weight.grad.abs().sum() > 0 and router.expert_bias_E.grad is None


def test_zaya1_bias_controller_drives_a_skewed_load_toward_uniform():
    router = zaya1(num_experts=4, bias_p_gain=0.05, bias_i_gain=0.001)
    with torch.no_grad():  # GELU outputs are mostly positive: a positive row makes expert 0 win almost always
        router.mlp[4].weight[0] = 0.3
    x = torch.randn(256, 16)
    ratios = []
    for _ in range(150):
        counts = router(x).num_tokens_per_expert_E.float()
        ratios.append((counts.max() / counts.mean()).item())
        router.update_bias()
    assert ratios[0] > 3.0, "the synthetic load should start skewed"
    assert max(ratios[-10:]) < 1.5 and ratios[-1] < ratios[0] / 2
    assert router.expert_bias_E[0] < 0 < router.expert_bias_E[1:].min()


def test_zaya1_bias_update_uses_only_training_loads_and_lives_in_the_state_dict():
    router = zaya1()
    router.eval()
    router(torch.randn(20, 16))
    router.update_bias()  # nothing routed in training mode: no change
    assert torch.equal(router.expert_bias_E, torch.zeros(4))
    router.train()
    router(torch.randn(20, 16))
    router.update_bias()
    assert router.expert_bias_E.abs().sum() > 0 and router.pending_counts_E.sum() == 0
    keys = set(router.state_dict())
    assert {"expert_bias_E", "load_error_integral_E"} <= keys and "pending_counts_E" not in keys


def test_zaya1_eda_adds_the_previous_layers_state():
    x, prev = torch.randn(10, 16), torch.randn(10, 32)
    with_eda, without = zaya1(), zaya1(eda=False)
    torch.testing.assert_close(with_eda(x, prev).state_TR, with_eda(x).state_TR)  # the scale starts at 0
    with torch.no_grad():
        with_eda.eda_scale_R.fill_(0.5)
    torch.testing.assert_close(with_eda(x, prev).state_TR, with_eda(x).state_TR + 0.5 * prev)
    torch.testing.assert_close(without(x, prev).state_TR, without(x).state_TR)
    assert zaya1(layer_idx=0).eda_scale_R is None  # the first layer has no previous state to scale


def test_zaya1_router_state_flows_from_layer_to_layer_in_the_model():
    from model_cfgs import small_config

    from zaya_pipeline.model import ZayaLM

    cfg = small_config(
        n_layers=3,
        moe=MoEConfig(num_experts=4, top_k=1, expert_hidden=16, router=RouterConfig(type="zaya1", dim=8)),
    )
    model = ZayaLM(cfg)
    seen = []
    for block in model.blocks:
        block.moe.router.register_forward_hook(lambda mod, args, out: seen.append((args[1], out.state_TR)))
    model(torch.randint(0, cfg.vocab_size, (2, 5)))
    assert seen[0][0] is None
    assert seen[1][0] is seen[0][1] and seen[2][0] is seen[1][1]


def test_zaya1_bias_step_skipped_on_the_device_keeps_the_loads_for_the_next_one():
    """``update_bias(apply=False)`` (the spike guard skipped the update) is the same as not calling it."""
    a, b = zaya1(), zaya1()
    b.load_state_dict(a.state_dict())
    x1, x2 = torch.randn(20, 16), torch.randn(30, 16)
    a(x1)
    a.update_bias(apply=torch.tensor(False))
    assert torch.equal(a.expert_bias_E, torch.zeros(4)) and a.pending_counts_E.sum() == 20 * a.top_k
    a(x2)
    a.update_bias(apply=torch.tensor(True))
    b(x1)
    b(x2)
    b.update_bias()
    for key in ("expert_bias_E", "load_error_integral_E", "pending_counts_E"):
        assert torch.equal(getattr(a, key), getattr(b, key)), key


def test_the_tiny_defaults_init_knobs_reach_the_router_mlp_and_the_moe_output_scale():
    """``model.moe.router.mlp_init_std`` sets the router MLP's init (its down-projection keeps init_std) and
    ``model.moe_out_scale_init`` the MoE sub-blocks' output scales (the attention's stay 1)."""
    from zaya_pipeline.config import load_config
    from zaya_pipeline.model import ZayaLM

    cfg = load_config(["model=tiny", "model.vocab_size=512"]).model
    assert (cfg.moe.router.mlp_init_std, cfg.moe_out_scale_init) == (0.18, 5.0)
    torch.manual_seed(0)
    model = ZayaLM(cfg)
    for block in model.blocks:
        router = block.moe.router
        assert abs(router.down.weight.std().item() - cfg.init_std) < 0.1 * cfg.init_std
        for i in (0, 2):  # R x R: enough samples for a 10% bound
            assert abs(router.mlp[i].weight.std().item() - 0.18) < 0.018
        assert torch.equal(block.moe_add.out_scale_D, torch.full_like(block.moe_add.out_scale_D, 5.0))
        assert torch.equal(block.attn_add.out_scale_D, torch.ones_like(block.attn_add.out_scale_D))
    plain = ZayaLM(
        load_config(
            [
                "model=zaya1_base",
                "model.d_model=64",
                "model.n_layers=1",
                "model.vocab_size=512",
                "model.moe.expert_hidden=32",
                "model.attention.head_dim=16",
                "model.moe.router.dim=32",
            ]
        ).model
    )
    assert abs(plain.blocks[0].moe.router.mlp[0].weight.std().item() - 0.02) < 0.004  # transformers' init
    assert torch.equal(plain.blocks[0].moe_add.out_scale_D, torch.ones(64))
