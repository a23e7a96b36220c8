"""Expert parallelism on CPU (gloo): 2 processes with EP=2 equal one process on the same global batch."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from support.distributed import run_distributed
from zaya_pipeline.config import MoEConfig, ParallelConfig
from zaya_pipeline.distributed.expert_parallel import apply_expert_parallel, expert_parallel_mlp
from zaya_pipeline.distributed.mesh import MESH_DIMS, build_mesh, mesh_sizes
from zaya_pipeline.errors import ConfigError
from zaya_pipeline.model.moe import MoE
from zaya_pipeline.ops import expert_mlp

WORLD, T_LOCAL, D, F, E, K = 2, 24, 16, 8, 4, 2


def tensors(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "x": torch.randn(WORLD * T_LOCAL, D, generator=g),
        "cot": torch.randn(WORLD * T_LOCAL, D, generator=g),
        "w": torch.rand(WORLD * T_LOCAL, K, generator=g),
        "wgu": torch.randn(E, D, 2 * F, generator=g) / D**0.5,
        "wd": torch.randn(E, F, D, generator=g) / F**0.5,
    }


def routed_ids(skewed: bool | str):
    g = torch.Generator().manual_seed(1)
    scores = torch.rand(WORLD * T_LOCAL, E, generator=g)
    if skewed is True:  # every token picks experts 0 and 1: rank 1 (experts 2, 3) receives nothing
        scores[:, :2] += 2.0
    ids = scores.topk(K, dim=1).indices
    if skewed == "no_expert":  # a third of the slots have no expert (id E: skipped or dropped), sent nowhere
        ids = ids.masked_fill(torch.rand(ids.shape, generator=g) < 0.33, E)
    return ids


def mean_loss(y, cot):
    return (y * cot).sum(-1).mean()


def function_worker(rank, world, skewed, out):
    t, ids = tensors(), routed_ids(skewed)
    rows = slice(rank * T_LOCAL, (rank + 1) * T_LOCAL)
    experts = slice(rank * E // world, (rank + 1) * E // world)
    x = t["x"][rows].clone().requires_grad_()
    w = t["w"][rows].clone().requires_grad_()
    wgu = t["wgu"][experts].clone().requires_grad_()
    wd = t["wd"][experts].clone().requires_grad_()
    y = expert_parallel_mlp(x, ids[rows], w, wgu, wd, group=dist.group.WORLD)
    mean_loss(y, t["cot"][rows]).backward()
    torch.save(
        {"y": y.detach(), "x": x.grad, "w": w.grad, "wgu": wgu.grad / world, "wd": wd.grad / world},
        out % rank,
    )


@pytest.mark.distributed
@pytest.mark.parametrize(
    "skewed", [False, True, "no_expert"], ids=["balanced", "one_rank_gets_nothing", "slots_with_no_expert"]
)
def test_expert_parallel_op_matches_one_process(tmp_path, skewed):
    out = str(tmp_path / "rank%d.pt")
    run_distributed(function_worker, WORLD, skewed, out)
    t, ids = tensors(), routed_ids(skewed)
    leaves = [t[k].clone().requires_grad_() for k in ("x", "w", "wgu", "wd")]
    y = expert_mlp(leaves[0], ids, leaves[1], leaves[2], leaves[3], backend="loop")
    # the global mean loss = the mean of the per-rank mean losses (equal tokens per rank)
    mean_loss(y, t["cot"]).backward()
    got = [torch.load(out % r) for r in range(WORLD)]
    torch.testing.assert_close(torch.cat([g["y"] for g in got]), y.detach(), rtol=1e-5, atol=1e-6)
    for key, leaf in zip(("x", "w"), leaves[:2], strict=True):
        torch.testing.assert_close(torch.cat([g[key] for g in got]) / WORLD, leaf.grad, rtol=1e-5, atol=1e-6)
    for key, leaf in zip(("wgu", "wd"), leaves[2:], strict=True):
        torch.testing.assert_close(torch.cat([g[key] for g in got]), leaf.grad, rtol=1e-5, atol=1e-6)
    if skewed is True:
        assert torch.count_nonzero(got[1]["wgu"]) == 0  # rank 1's experts saw no token: zero, not None


def moe_layer():
    torch.manual_seed(0)
    layer = MoE(D, MoEConfig(num_experts=E, top_k=K, expert_hidden=F, expert_backend="loop"))
    layer.reset_parameters(std=0.3, out_std=0.3)
    return layer


def layer_worker(rank, world, out):
    t = tensors()
    layer = moe_layer()
    mesh = build_mesh(mesh_sizes(ParallelConfig(ep=world), world, E))  # (1, 1, 2): all ranks in one EP group
    assert mesh.mesh_dim_names == MESH_DIMS and mesh["ep"].size() == world
    apply_expert_parallel(layer, mesh["ep"].get_group())
    assert layer.experts.w_gate_up_EDF2.shape[0] == E // world
    x = t["x"][rank * T_LOCAL : (rank + 1) * T_LOCAL]
    result = layer(x[None])
    (mean_loss(result.y_BTD[0], t["cot"][rank * T_LOCAL : (rank + 1) * T_LOCAL]) + result.aux_loss).backward()
    grads = {}
    for name, p in layer.named_parameters():
        if ".w_" not in f".{name}":  # replicated: the data-parallel average (what FSDP/DDP do)
            dist.all_reduce(p.grad)
            p.grad /= world
        grads[name] = p.grad
    torch.save({"y": result.y_BTD[0].detach(), "grads": grads}, out % rank)


@pytest.mark.distributed
def test_expert_parallel_moe_layer_matches_one_process(tmp_path):
    """The model's own MoE layer (router included) under apply_expert_parallel: outputs and every gradient."""
    out = str(tmp_path / "rank%d.pt")
    run_distributed(layer_worker, WORLD, out)
    t = tensors()
    layer = moe_layer()
    # the router's aux loss is per rank (a mean over its tokens): the reference averages two halves too
    halves = [layer(t["x"][r * T_LOCAL : (r + 1) * T_LOCAL][None]) for r in range(WORLD)]
    loss = sum(
        mean_loss(h.y_BTD[0], t["cot"][r * T_LOCAL : (r + 1) * T_LOCAL]) + h.aux_loss
        for r, h in enumerate(halves)
    )
    (loss / WORLD).backward()
    got = [torch.load(out % r) for r in range(WORLD)]
    torch.testing.assert_close(
        torch.cat([g["y"] for g in got]),
        torch.cat([h.y_BTD[0] for h in halves]).detach(),
        rtol=1e-5,
        atol=1e-6,
    )
    for name, p in layer.named_parameters():
        if ".w_" in f".{name}":
            torch.testing.assert_close(
                torch.cat([g["grads"][name] for g in got]), p.grad, rtol=1e-5, atol=1e-6
            )
        else:
            torch.testing.assert_close(got[0]["grads"][name], p.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("kw", "world", "experts", "message"),
    [
        ({"ep": 3}, 4, 6, "parallel.ep=3 must divide parallel.dp_shard=4"),
        ({"ep": 4}, 4, 6, "model.moe.num_experts=6 is not divisible by parallel.ep=4"),
        ({"dp_replicate": 2, "dp_shard": 3}, 4, 8, "2 × 3 = 6, but the world size is 4"),
        ({"dp_replicate": 3}, 4, 8, "parallel.dp_replicate=3 does not divide the world size 4"),
        ({"ep": 0}, 4, 8, "parallel.ep must be >= 1"),
    ],
)
def test_bad_mesh_sizes_name_the_keys(kw, world, experts, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        mesh_sizes(ParallelConfig(**kw), world, experts)


def test_mesh_sizes_take_ep_from_the_sharding_dimension():
    sizes = mesh_sizes(ParallelConfig(dp_replicate=2, ep=2), 8, 16)
    assert (sizes.dp_shard, sizes.shape) == (4, (2, 2, 2))
