"""The ``triton`` and ``grouped_mm`` backends against ``loop``: forward and all four gradients over a grid of
shapes and routings (CPU: Triton runs under its interpreter, with big blocks to stay fast)."""

from __future__ import annotations

import pytest
import torch

from zaya_pipeline.ops import available_backends, expert_mlp, pick_backend
from zaya_pipeline.ops.expert_mlp import grouped_mm_aligned

pytest.importorskip("triton")

# (T, D, F, E, K, routing): sizes straddle the interpreter's 64-wide blocks (not multiples, several tiles)
CASES = [
    (1, 16, 16, 4, 1, "random"),
    (37, 72, 40, 5, 2, "random"),
    (130, 40, 70, 8, 1, "random"),
    (64, 64, 64, 4, 4, "random"),
    (50, 130, 24, 3, 2, "random"),
    (45, 24, 16, 6, 2, "skewed"),  # experts 0 and 1 get no tokens
    (70, 48, 32, 4, 1, "one_expert"),  # every token on expert 2
    (33, 32, 40, 1, 1, "random"),  # a single expert
    (20, 16, 24, 4, 4, "random"),  # K = E: every expert gets every token
]


def make_inputs(T, D, F, E, K, routing, dtype, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    scores = torch.rand(T, E, generator=g)
    if routing == "skewed":
        scores[:, :2] = -1.0
    if routing == "one_expert":
        scores[:, 2] = 2.0
    ids = scores.topk(K, dim=1).indices
    w = torch.rand(T, K, generator=g).softmax(dim=1)
    x = torch.randn(T, D, generator=g)
    wgu = torch.randn(E, D, 2 * F, generator=g) / D**0.5
    wd = torch.randn(E, F, D, generator=g) / F**0.5
    leaves = [t.to(device=device, dtype=dtype).requires_grad_() for t in (x, w, wgu, wd)]
    return leaves[0], ids.to(device), leaves[1], leaves[2], leaves[3]


def rel_err(a, b, norm=False):
    """max |a - b| / max |b|, or with ``norm`` ||a - b|| / ||b|| (bf16: one rounding of 2^-9 already moves
    single elements by ~1% of the largest one, so bf16 results are compared as whole tensors)."""
    a, b = a.double(), b.double()
    if norm:
        return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def forward_and_grads(backend, inputs, cot):
    x, ids, w, wgu, wd = inputs
    y = expert_mlp(x, ids, w, wgu, wd, backend=backend)
    grads = torch.autograd.grad((y * cot).sum(), (x, w, wgu, wd))
    return (y, *grads)


def check_parity(backend, case, dtype, tol, device="cpu"):
    if backend == "grouped_mm" and not grouped_mm_aligned(case[1], case[2], dtype):
        pytest.skip(f"grouped_mm needs 16-byte strides: D={case[1]}, F={case[2]}")
    inputs = make_inputs(*case, dtype=dtype, seed=sum(case[:5]), device=device)
    cot = torch.randn(case[0], case[1], generator=torch.Generator().manual_seed(1)).to(device, dtype)
    got = forward_and_grads(backend, inputs, cot)
    want = forward_and_grads("loop", inputs, cot)
    for name, a, b in zip(("y", "dx", "dw_route", "dw_gate_up", "dw_down"), got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape, name
        err = rel_err(a, b, norm=dtype != torch.float32)
        assert err < tol, f"{backend} {case} {dtype}: {name} rel err {err:.2e}"
    return got


CASE_IDS = [f"T{c[0]}-D{c[1]}-F{c[2]}-E{c[3]}-K{c[4]}-{c[5]}" for c in CASES]


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
@pytest.mark.parametrize("backend", ["triton", "grouped_mm"])
def test_fp32_parity_with_loop(backend, case):
    got = check_parity(backend, case, torch.float32, tol=1e-5)
    if case[5] == "skewed":  # experts with no tokens get exactly zero weight gradients
        assert torch.count_nonzero(got[3][:2]) == 0 and torch.count_nonzero(got[4][:2]) == 0


@pytest.mark.parametrize("case", CASES[1:6], ids=[f"T{c[0]}-E{c[3]}-K{c[4]}-{c[5]}" for c in CASES[1:6]])
@pytest.mark.parametrize("backend", ["triton", "grouped_mm"])
def test_bf16_parity_with_loop(backend, case):
    check_parity(backend, case, torch.bfloat16, tol=1e-2)


@pytest.mark.parametrize("tokens,top_k", [(300, 3), (10_000, 2)])  # 15 blocks; 313, over one scan chunk
def test_triton_permutation_is_a_stable_sort(tokens, top_k):
    from zaya_pipeline.ops.triton_expert_mlp import permute

    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 7, (tokens, top_k), generator=g)
    ids[:, 0] = torch.where(ids[:, 0] == 5, 4, ids[:, 0])  # expert 5 only in later slots
    counts, offsets, sorted_pair, pair_pos = permute(ids, 9)  # experts 7 and 8 get nothing
    flat = ids.reshape(-1)
    assert counts.tolist() == torch.bincount(flat, minlength=9).tolist()
    assert offsets.tolist() == [0, *torch.bincount(flat, minlength=9).cumsum(0).tolist()]
    assert sorted_pair.long().tolist() == torch.argsort(flat, stable=True).tolist()
    assert torch.equal(sorted_pair.long()[pair_pos.long()], torch.arange(flat.numel()))


def test_triton_backward_saves_less_than_loop():
    from zaya_pipeline.profiling import saved_activation_bytes

    x, ids, w, wgu, wd = make_inputs(256, 64, 64, 4, 2, "random", torch.float32)
    saved = {}
    for backend in ("loop", "triton"):
        y, saved[backend] = saved_activation_bytes(
            lambda b=backend: expert_mlp(x, ids, w, wgu, wd, backend=b), [x, ids, w, wgu, wd]
        )
        y.sum().backward()  # the saved tensors are usable
    S, F = 256 * 2, 64
    assert saved["triton"] <= saved["loop"]
    assert saved["triton"] < S * 2 * F * 4 * 1.1  # gu (S, 2F) plus int32 maps, nothing of size S x D more


def test_empty_batch_gives_zeros():
    x, ids, w, wgu, wd = make_inputs(0, 16, 16, 4, 2, "random", torch.float32)
    for backend in ("triton", "grouped_mm", "loop"):
        y = expert_mlp(x, ids, w, wgu, wd, backend=backend)
        assert y.shape == (0, 16)


def test_grouped_mm_names_the_stride_rule():
    x, ids, w, wgu, wd = make_inputs(8, 18, 16, 4, 2, "random", torch.float32)
    with pytest.raises(ValueError, match="D=18 and F=16 must be multiples of 4"):
        expert_mlp(x, ids, w, wgu, wd, backend="grouped_mm")
    assert pick_backend("cpu", torch.float32, (18, 16)) == "loop"


def test_triton_rejects_mixed_dtypes():
    x, ids, w, wgu, wd = make_inputs(8, 16, 16, 4, 2, "random", torch.float32)
    with pytest.raises(ValueError, match="share a dtype"):
        expert_mlp(x.bfloat16(), ids, w, wgu, wd, backend="triton")


def test_auto_picks_a_fast_backend():
    assert pick_backend("cpu") == "grouped_mm" and "triton" in available_backends("cpu")
    assert pick_backend("cpu", torch.float64) == "loop"
    assert pick_backend("cuda", torch.bfloat16) == "grouped_mm" and pick_backend("cuda") == "triton"
    assert pick_backend("cuda", torch.bfloat16, (18, 16)) == "triton"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
@pytest.mark.parametrize("case", CASES, ids=[f"T{c[0]}-D{c[1]}-E{c[3]}-K{c[4]}-{c[5]}" for c in CASES])
def test_gpu_parity_with_loop(case):
    check_parity("triton", case, torch.float32, tol=1e-5, device="cuda")
    check_parity("triton", case, torch.bfloat16, tol=1e-2, device="cuda")
    check_parity("grouped_mm", case, torch.bfloat16, tol=1e-2, device="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
def test_gpu_zaya1_shape_bf16():
    case = (16384, 2048, 2048, 16, 1, "random")
    check_parity("triton", case, torch.bfloat16, tol=1e-2, device="cuda")


@pytest.mark.parametrize("backend", ["auto", "loop", "grouped_mm", "triton"])
def test_autocast_runs_the_gemms_in_the_autocast_dtype(backend):
    """bf16-mixed training: fp32 params and activations in, bf16 GEMMs, fp32 grads on the fp32 leaves, and
    the same result as casting by hand."""
    inputs = make_inputs(40, 32, 32, 4, 2, "random", torch.float32)
    x, ids, w, wgu, wd = inputs
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = expert_mlp(x, ids, w, wgu, wd, backend=backend)
    assert y.dtype == torch.bfloat16
    grads = torch.autograd.grad(y.float().sum(), (x, w, wgu, wd))
    assert all(g.dtype == torch.float32 for g in grads)
    by_hand = expert_mlp(x.bfloat16(), ids, w, wgu.bfloat16(), wd.bfloat16(), backend=backend)
    torch.testing.assert_close(y, by_hand, rtol=0, atol=0)


def test_triton_parity_with_64_bit_offsets(monkeypatch):
    """The WIDE path (int64 row offsets, taken when a tensor has 2^31 elements or more) against loop."""
    from zaya_pipeline.ops import triton_expert_mlp

    monkeypatch.setattr(triton_expert_mlp, "_wide", lambda *sizes: True)
    check_parity("triton", CASES[2], torch.float32, tol=1e-5)


@pytest.mark.parametrize("backend", ["loop", "grouped_mm", "triton"])
@pytest.mark.parametrize("top_k", [1, 2])
def test_slots_with_no_expert_contribute_nothing(backend, top_k):
    """Id E marks a slot with no expert (the MoE's skip expert and capacity drops): no output, no gradient
    to its routing weight, and the same result as giving that slot weight 0 on a real expert."""
    x, ids, w, wgu, wd = make_inputs(37, 72, 40, 5, top_k, "random", torch.float32, seed=7)
    none_TK = torch.rand(ids.shape, generator=torch.Generator().manual_seed(2)) < 0.35
    none_TK[:3] = True  # a few tokens with no expert at all
    cot = torch.randn(37, 72, generator=torch.Generator().manual_seed(1))

    def run(ids_TK, w_TK, name):
        y = expert_mlp(x, ids_TK, w_TK, wgu, wd, backend=name)
        return (y, *torch.autograd.grad((y * cot).sum(), (x, w, wgu, wd)))

    got = run(ids.masked_fill(none_TK, 5), w, backend)
    want = run(ids.masked_fill(none_TK, 0), w * ~none_TK, "loop")  # weight 0 on expert 0 instead
    for name, a, b in zip(
        ("y", "dx", "dw_gate_up", "dw_down"),
        (got[0], got[1], got[3], got[4]),
        (want[0], want[1], want[3], want[4]),
        strict=True,
    ):
        assert rel_err(a, b) < 1e-5, f"{backend}: {name}"
    assert torch.count_nonzero(got[2][none_TK]) == 0
    assert rel_err(got[2][~none_TK], want[2][~none_TK]) < 1e-5
    assert torch.count_nonzero(got[0][:3]) == 0
