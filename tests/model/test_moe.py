"""The MoE layer's options: skip expert, capacity factor, shared expert."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zaya_pipeline.config import MoEConfig, RouterConfig
from zaya_pipeline.errors import ConfigError
from zaya_pipeline.model.moe import MoE, within_capacity
from zaya_pipeline.ops import sort_by_expert

D = 16


def moe(**kw) -> MoE:
    torch.manual_seed(0)
    cfg = MoEConfig(**{"num_experts": 4, "top_k": 1, "expert_hidden": 8, **kw})
    layer = MoE(D, cfg)
    layer.reset_parameters(std=0.3, out_std=0.3)
    return layer


def swiglu(x_TD, w_gate_up_DF2, w_down_FD):
    gate, up = (x_TD @ w_gate_up_DF2).chunk(2, dim=-1)
    return (F.silu(gate) * up) @ w_down_FD


def test_skip_expert_really_skips():
    layer = moe(skip_expert=True, router=RouterConfig("zaya1", dim=8))
    E = layer.num_experts
    assert layer.router.expert_bias_E.tolist() == [0.0] * E + [-1.0]  # skipping starts disfavoured
    x = torch.randn(64, 1, D)
    r = layer.router
    with torch.no_grad():  # a skip bias that lets about half of the tokens skip
        probs = r.mlp(r.norm(r.down(x.view(64, D)))).softmax(-1)
        r.expert_bias_E[-1] = (probs[:, :E].max(dim=1).values - probs[:, E]).median() + 1e-4
    calls = []
    original = layer._experts
    layer._experts = lambda x_TD, ids_TK, w_TK: calls.append((ids_TK, w_TK)) or original(x_TD, ids_TK, w_TK)
    out = layer(x)
    skipped = out.num_tokens_per_expert_E[-1].item()
    assert 0 < skipped < 64 and out.num_tokens_per_expert_E.shape == (E + 1,)
    # the skipped slots reach the expert op as "no expert" (id E, weight 0): sorted past the experts' rows,
    # they are never computed (sort_by_expert counts only the others)
    ((ids_TK, w_TK),) = calls
    assert int((ids_TK == E).sum()) == skipped and torch.all(w_TK[ids_TK == E] == 0)
    assert int(sort_by_expert(ids_TK, E)[2].sum()) == 64 - skipped
    routed = layer.router(x.view(64, D))
    for t in range(64):
        e = int(routed.topk_ids_TK[t, 0])
        y_t = out.y_BTD[t, 0]
        if e == E:
            assert torch.equal(y_t, torch.zeros(D))
        else:
            expected = routed.topk_weights_TK[t, 0] * swiglu(
                x[t], layer.experts.w_gate_up_EDF2[e], layer.experts.w_down_EFD[e]
            )
            torch.testing.assert_close(y_t, expected[0])


def test_skip_bias_is_balanced_by_the_controller_like_the_experts():
    layer = moe(skip_expert=True, router=RouterConfig("zaya1", dim=8, bias_p_gain=0.01))
    x = torch.randn(256, D)
    skipped = []
    for _ in range(150):
        skipped.append(int(layer(x[:, None]).num_tokens_per_expert_E[-1]))
        layer.router.update_bias()
    assert sum(skipped[:50]) == 0  # starting at -1, the skip expert is not chosen early on
    assert layer.router.expert_bias_E[-1] > -0.5  # under-loaded, so its bias rose
    assert sum(skipped[-50:]) > 0  # until it takes tokens


def test_within_capacity_admits_first_choices_first_then_token_order():
    ids = torch.tensor([[0, 1], [0, 1], [0, 1], [1, 0]])  # T = 4, K = 2, E = 2
    assert within_capacity(ids, num_experts=2, capacity_factor=1.0).all()  # capacity 4: each is asked 4 times
    # capacity ceil(0.75 * 4 * 2 / 2) = 3: each expert's 4th request (a second choice) loses
    keep = within_capacity(ids, num_experts=2, capacity_factor=0.75)
    assert keep.tolist() == [[True, True], [True, True], [True, False], [True, False]]
    keep = within_capacity(ids, num_experts=2, capacity_factor=0.5)  # capacity 2
    assert keep.tolist() == [[True, True], [True, False], [False, False], [True, False]]


def test_capacity_factor_drops_in_training_only():
    layer = moe(capacity_factor=1.0)
    with torch.no_grad():  # make expert 0 take every token
        layer.router.proj.weight.zero_()
        layer.router.proj.weight[0] = 1.0
    x = torch.rand(32, 1, D) + 0.5
    train = layer.train()(x)
    assert train.num_tokens_per_expert_E.tolist() == [32, 0, 0, 0]
    assert train.dropped_slots.item() == 32 - 8  # capacity ceil(1.0 * 32 / 4) = 8
    assert (train.y_BTD[8:] == 0).all() and (train.y_BTD[:8] != 0).any()
    evaluated = layer.eval()(x)
    assert evaluated.dropped_slots.item() == 0 and (evaluated.y_BTD[8:] != 0).any()


def test_shared_expert_is_added_for_every_token():
    layer = moe(shared_expert_hidden=12)
    x = torch.randn(10, 1, D)
    with_shared = layer(x).y_BTD
    shared = layer.shared(x.view(10, D))
    with torch.no_grad():
        layer.shared.down.weight.zero_()
    torch.testing.assert_close(with_shared - layer(x).y_BTD, shared.view(10, 1, D))


@pytest.mark.parametrize(
    ("kw", "key"), [({"capacity_factor": -1.0}, "capacity_factor"), ({"shared_expert_hidden": -2}, "shared")]
)
def test_bad_moe_options_name_the_key(kw, key):
    with pytest.raises(ConfigError, match=f"model.moe.{key}"):
        moe(**kw)


@pytest.mark.parametrize("backend", ["triton", "grouped_mm", "auto"])
@pytest.mark.parametrize("options", [{}, {"skip_expert": True, "router": RouterConfig("zaya1", dim=8)}])
def test_expert_backend_is_chosen_by_config_and_matches_loop(backend, options):
    pytest.importorskip("triton")
    x = torch.randn(2, 24, D, generator=torch.Generator().manual_seed(5))
    results = {}
    for name in ("loop", backend):
        layer = moe(expert_backend=name, top_k=2, **options)
        out = layer(x)
        grads = torch.autograd.grad(out.y_BTD.square().sum(), layer.experts.weights())
        results[name] = (out.y_BTD, *grads)
    for got, want in zip(results[backend], results["loop"], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)  # fp32, other summation order


def test_checkpoints_from_before_the_experts_submodule_still_load():
    layer, old = moe(), moe()
    state = {k.replace("experts.", ""): v.clone() + 1 for k, v in old.state_dict().items()}
    assert "w_down_EFD" in state
    layer.load_state_dict(state)  # strict
    torch.testing.assert_close(layer.experts.w_down_EFD, old.experts.w_down_EFD + 1)
