from __future__ import annotations

import math

import pytest
import torch

from zaya_pipeline.config import MoEConfig, RouterConfig
from zaya_pipeline.errors import ConfigError
from zaya_pipeline.model.router import LinearRouter, build_router, load_balancing_loss, router_z_loss


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
