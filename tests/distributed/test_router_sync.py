"""Under data parallelism the balancing-bias controller steps on the loads of all ranks (gloo, 2 procs)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from support.distributed import run_distributed
from zaya_pipeline.config import MoEConfig, RouterConfig
from zaya_pipeline.model.router import build_router

D, E = 16, 4


def router():
    torch.manual_seed(0)
    r = build_router(
        D, MoEConfig(num_experts=E, top_k=1, router=RouterConfig("zaya1", dim=8, bias_p_gain=0.1))
    )
    r.reset_parameters(0.3)
    return r


def batches():
    g = torch.Generator().manual_seed(2)
    return [torch.randn(32, D, generator=g) for _ in range(2)]  # rank r routes batch r


def all_reduce_sum(t):
    dist.all_reduce(t)
    return t


def worker(rank, world, out):
    r = router()
    with torch.no_grad():
        r(batches()[rank])
    r.update_bias(all_reduce_sum)
    torch.save(r.expert_bias_E.clone(), out % rank)


@pytest.mark.distributed
def test_bias_update_uses_the_loads_of_all_ranks(tmp_path):
    out = str(tmp_path / "bias%d.pt")
    run_distributed(worker, 2, out)
    reference = router()
    with torch.no_grad():
        for x in batches():
            reference(x)  # one process routing both batches: the global load
    reference.update_bias()
    local = router()
    with torch.no_grad():
        local(batches()[0])
    local.update_bias()  # rank 0's load alone: what an unsynchronised rank would do
    got = [torch.load(out % r) for r in range(2)]
    torch.testing.assert_close(got[0], reference.expert_bias_E)
    torch.testing.assert_close(got[1], reference.expert_bias_E)
    assert not torch.allclose(local.expert_bias_E, reference.expert_bias_E)
