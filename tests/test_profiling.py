"""saved_activation_bytes counts what a forward saves for backward, once per storage, without the inputs."""

from __future__ import annotations

import torch

from zaya_pipeline.profiling import saved_activation_bytes


def test_counts_a_saved_output():
    x = torch.randn(64, 32, requires_grad=True)
    y, nbytes = saved_activation_bytes(lambda: torch.exp(x), [x])
    assert nbytes == x.numel() * 4  # exp saves its result (fp32)
    y.sum().backward()  # the graph is intact
    torch.testing.assert_close(x.grad, torch.exp(x.detach()))


def test_excludes_inputs():
    x = torch.randn(64, 32, requires_grad=True)
    w = torch.randn(64, 32, requires_grad=True)
    _, nbytes = saved_activation_bytes(lambda: x * w, [x, w])  # mul saves x and w only
    assert nbytes == 0
    _, nbytes = saved_activation_bytes(lambda: x * w, [x])  # w is no longer an input: it counts
    assert nbytes == w.numel() * 4


def test_excludes_views_of_inputs():
    x = torch.randn(16, 8, requires_grad=True)
    w = torch.randn(8, 4, requires_grad=True)
    _, nbytes = saved_activation_bytes(lambda: x.t().t() @ w, [x, w])
    assert nbytes == 0


def test_a_storage_saved_twice_counts_once():
    x = torch.randn(100, requires_grad=True)

    def fn():
        e = torch.exp(x)  # saves e
        return e * e  # saves e twice more

    out, nbytes = saved_activation_bytes(fn, [x])
    assert nbytes == 100 * 4
    out.sum().backward()
    torch.testing.assert_close(x.grad, 2 * torch.exp(2 * x.detach()))


def test_counts_intermediates_by_dtype_and_nothing_without_grad():
    x = torch.randn(10, 6, dtype=torch.float64, requires_grad=True)
    # tanh saves its output (10x6 fp64); sum saves nothing
    _, nbytes = saved_activation_bytes(lambda: torch.tanh(x).sum(), [x])
    assert nbytes == 10 * 6 * 8
    with torch.no_grad():
        _, nbytes = saved_activation_bytes(lambda: torch.tanh(x), [x])
    assert nbytes == 0
