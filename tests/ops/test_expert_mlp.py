"""The loop expert op against a naive per-token, per-slot reference: values and gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from zaya_pipeline.errors import ConfigError
from zaya_pipeline.ops import expert_mlp


def naive_expert_mlp(x_TD, ids_TK, w_TK, w_gate_up_EDF2, w_down_EFD):
    hidden = w_down_EFD.shape[1]
    rows = []
    for t in range(x_TD.shape[0]):
        y_D = torch.zeros_like(x_TD[t])
        for k in range(ids_TK.shape[1]):
            e = int(ids_TK[t, k])
            h = x_TD[t] @ w_gate_up_EDF2[e]
            y_D = y_D + w_TK[t, k] * ((F.silu(h[:hidden]) * h[hidden:]) @ w_down_EFD[e])
        rows.append(y_D)
    return torch.stack(rows)


def make_inputs(T, D, F_, E, K, seed, unused_expert=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, D, generator=g, dtype=torch.float64, requires_grad=True)
    experts = [e for e in range(E) if e != unused_expert]
    scores = torch.rand(T, len(experts), generator=g)
    ids = torch.tensor(experts)[scores.topk(K, dim=1).indices]
    w = torch.rand(T, K, generator=g, dtype=torch.float64)
    w = (w / w.sum(1, keepdim=True)).requires_grad_()
    wgu = (0.3 * torch.randn(E, D, 2 * F_, generator=g, dtype=torch.float64)).requires_grad_()
    wd = (0.3 * torch.randn(E, F_, D, generator=g, dtype=torch.float64)).requires_grad_()
    return x, ids, w, wgu, wd


@pytest.mark.parametrize(
    ("T", "D", "F_", "E", "K", "unused"),
    [
        (13, 8, 6, 4, 1, None),
        (17, 8, 5, 4, 2, None),
        (9, 6, 4, 5, 2, 3),
        (11, 4, 3, 3, 1, 0),
        (1, 4, 3, 6, 3, None),
    ],
)
@pytest.mark.parametrize("backend", ["loop", "auto"])
def test_matches_naive_reference_forward_and_grads(T, D, F_, E, K, unused, backend):
    x, ids, w, wgu, wd = make_inputs(T, D, F_, E, K, seed=T * 31 + K, unused_expert=unused)
    if unused is not None:
        assert not (ids == unused).any()
    y = expert_mlp(x, ids, w, wgu, wd, backend=backend)
    ref = naive_expert_mlp(x, ids, w, wgu, wd)
    torch.testing.assert_close(y, ref, rtol=1e-10, atol=1e-12)
    cot = torch.randn_like(y)
    grads = torch.autograd.grad((y * cot).sum(), (x, w, wgu, wd))
    ref_grads = torch.autograd.grad((ref * cot).sum(), (x, w, wgu, wd))
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12)
    if unused is not None:  # an expert that saw no token gets an exactly-zero gradient
        assert torch.count_nonzero(grads[2][unused]) == 0 and torch.count_nonzero(grads[3][unused]) == 0


def test_float32_and_output_dtype():
    x, ids, w, wgu, wd = make_inputs(10, 8, 4, 4, 2, seed=3)
    y = expert_mlp(x.float(), ids, w.float(), wgu.float(), wd.float())
    assert y.dtype == torch.float32
    torch.testing.assert_close(y.double(), naive_expert_mlp(x, ids, w, wgu, wd), rtol=1e-4, atol=1e-5)


def test_unknown_backend_names_the_key():
    x, ids, w, wgu, wd = make_inputs(4, 4, 2, 2, 1, seed=0)
    with pytest.raises(ConfigError, match="model.moe.expert_backend"):
        expert_mlp(x, ids, w, wgu, wd, backend="cuda-magic")
