"""One block of every MoE variant compiles as ONE graph (``fullgraph=True``: a graph break raises) and is
not recompiled over 5 training steps whose routings differ; compiled and eager losses and gradients agree.

Variants: attention gqa / cca x router linear / zaya1 x skip expert off / on x dropless / capacity, with the
``grouped_mm`` expert backend (and a few with ``triton``, which runs under the interpreter on CPU). The
expert op is a torch custom op, so dynamo traces through it as one node; ``aot_eager`` traces forward and
backward without generating code, so the test checks the graph, not the compiler."""

from __future__ import annotations

import itertools

import pytest
import torch
from model_cfgs import cca_config, small_config

from zaya_pipeline.config import MoEConfig, RouterConfig
from zaya_pipeline.model.transformer import ZayaLM

VARIANTS = list(itertools.product(["gqa", "cca"], ["linear", "zaya1"], [False, True], [0.0, 1.0]))
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}  # relative error norm, compiled vs eager


def variant_id(v) -> str:
    attention, router, skip, capacity = v
    return f"{attention}-{router}-{'skip' if skip else 'noskip'}-{'capacity' if capacity else 'dropless'}"


def block_of(variant, backend: str, dtype: torch.dtype, seed: int = 0):
    attention, router, skip, capacity = variant
    moe = MoEConfig(
        num_experts=4, top_k=2, expert_hidden=16, expert_backend=backend, skip_expert=skip,
        capacity_factor=capacity, router=RouterConfig(type=router, dim=16), skip_bias_init=0.0,
    )  # fmt: skip
    cfg = (small_config if attention == "gqa" else cca_config)(moe=moe, n_layers=1, residual_scaling=True)
    torch.manual_seed(seed)
    return ZayaLM(cfg).blocks[0].to(dtype).train()


def steps(block, inputs):
    """Forward + backward of each input: (loss, routing ids, gradients) per step."""
    out = []
    for x in inputs:
        y, moe = block(x)
        loss = y.float().square().mean() + moe.aux_loss
        grads = torch.autograd.grad(
            loss, [p for p in block.parameters() if p.requires_grad], allow_unused=True
        )
        out.append((loss.detach(), moe.num_tokens_per_expert_E.clone(), grads))
    return out


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def check(variant, backend, dtype):
    inputs = [torch.randn(2, 16, 16, generator=torch.Generator().manual_seed(s)).to(dtype) for s in range(5)]
    eager = steps(block_of(variant, backend, dtype), inputs)
    torch._dynamo.reset()
    compiled_block = torch.compile(block_of(variant, backend, dtype), fullgraph=True, backend="aot_eager")
    compiled = steps(compiled_block, inputs[:1])  # compiles
    with torch._dynamo.config.patch(error_on_recompile=True):  # a recompile (new guards) raises
        compiled += steps(compiled_block, inputs[1:])
    assert len({tuple(c.tolist()) for _, c, _ in eager}) > 1, "the inputs should route differently"
    for (loss_e, counts_e, grads_e), (loss_c, counts_c, grads_c) in zip(eager, compiled, strict=True):
        assert torch.equal(counts_e, counts_c)  # same routing
        assert rel(loss_c, loss_e) < TOL[dtype]
        for ge, gc in zip(grads_e, grads_c, strict=True):
            assert (ge is None) == (gc is None)
            if ge is not None:
                assert rel(gc, ge) < TOL[dtype] * 10


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS, ids=[variant_id(v) for v in VARIANTS])
def test_block_compiles_as_one_graph_grouped_mm(variant):
    check(variant, "grouped_mm", torch.float32)


@pytest.mark.slow
@pytest.mark.parametrize(
    "variant", [VARIANTS[0], VARIANTS[-1]], ids=[variant_id(VARIANTS[0]), variant_id(VARIANTS[-1])]
)
def test_block_compiles_as_one_graph_triton(variant):
    pytest.importorskip("triton")
    check(variant, "triton", torch.float32)


def test_block_compiles_as_one_graph_bf16():
    check(VARIANTS[-1], "grouped_mm", torch.bfloat16)
