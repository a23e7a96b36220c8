"""Newton–Schulz orthogonalization and the MuonAdamW optimizer (single process and FSDP2 over gloo)."""

from __future__ import annotations

import io
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from support.distributed import run_distributed
from zaya_pipeline.train.muon import MuonAdamW, muon_scale, newton_schulz
from zaya_pipeline.train.optim import step_unless


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny ops: one thread is as fast, and an OpenMP team of 2 stalls badly when another process holds
    a core (measured: the learning test 0.03 s alone, 16 s beside a busy process)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def polar(G: torch.Tensor) -> torch.Tensor:
    U, _, Vh = torch.linalg.svd(G.double(), full_matrices=False)
    return (U @ Vh).float()


@pytest.mark.parametrize("shape", [(64, 64), (96, 48), (48, 96), (5, 40, 24)])
def test_newton_schulz_is_orthogonal_to_tolerance(shape):
    gen = torch.Generator().manual_seed(sum(shape))
    for _ in range(5):
        G = torch.randn(*shape, generator=gen)
        Q = newton_schulz(G)
        assert Q.shape == G.shape and Q.dtype == G.dtype
        assert torch.linalg.svdvals(Q).max() <= 1.3
        if shape[-1] != shape[-2]:
            assert torch.linalg.svdvals(Q).min() >= 0.6
        else:
            # A square Gaussian matrix has singular values near 0 that 5 steps cannot lift to ~1
            # (each step multiplies a tiny one by ~3.4): check those above 2e-3 of the Frobenius norm,
            # which a scalar run of the polynomial sends into [0.68, 1.21].
            U, S, Vh = torch.linalg.svd(G.double())
            gain = torch.diagonal(U.mT @ Q.double() @ Vh.mT)
            floor = 2e-3 * torch.linalg.matrix_norm(G.double())
            kept = S / floor >= 1
            assert kept.sum() >= shape[-1] - 2
            assert gain[kept].min() >= 0.6 and gain.max() <= 1.3
        rel_err = torch.linalg.matrix_norm(Q - polar(G)) / torch.linalg.matrix_norm(polar(G))
        assert rel_err.max() < 0.3  # measured <= 0.25 over 20 seeds per shape


def test_newton_schulz_batches_per_matrix_and_rejects_vectors():
    G = torch.randn(4, 24, 40, generator=torch.Generator().manual_seed(0))
    stacked = newton_schulz(G)
    for e in range(4):
        torch.testing.assert_close(stacked[e], newton_schulz(G[e]), rtol=1e-5, atol=1e-6)
    assert newton_schulz(G.double()).dtype == torch.float64
    with pytest.raises(ValueError, match="matrix"):
        newton_schulz(torch.randn(8))


def small_mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def muon_groups(model: nn.Module, lr: float = 0.02, wd: float = 0.1) -> list[dict]:
    mats = [p for p in model.parameters() if p.ndim >= 2]
    rest = [p for p in model.parameters() if p.ndim < 2]
    return [
        {"name": "hidden", "optimizer": "muon", "params": mats, "lr": lr, "weight_decay": wd},
        {"name": "rest", "optimizer": "adamw", "params": rest, "lr": lr, "betas": (0.9, 0.95),
         "eps": 1e-8, "weight_decay": wd},
    ]  # fmt: skip


def train_steps(model: nn.Module, opt: torch.optim.Optimizer, steps: range) -> None:
    for i in steps:
        gen = torch.Generator().manual_seed(100 + i)
        x, y = torch.randn(32, 8, generator=gen), torch.randn(32, 4, generator=gen)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()


def test_adamw_groups_match_torch_adamw():
    ours, ref = small_mlp(), small_mlp()

    def groups(model, **extra):
        w, b = [model[0].weight, model[2].weight], [model[0].bias, model[2].bias]
        return [
            {"params": w, "lr": 3e-3, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1, **extra},
            {"params": b, "lr": 1e-2, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.0, **extra},
        ]

    opt = MuonAdamW(groups(ours, optimizer="adamw", name="g"))
    opt_ref = torch.optim.AdamW(groups(ref))
    train_steps(ours, opt, range(5))
    train_steps(ref, opt_ref, range(5))
    for p, q in zip(ours.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
        s, t = opt.state[p], opt_ref.state[q]
        assert s.keys() == t.keys() == {"step", "exp_avg", "exp_avg_sq"}
        assert s["step"].dtype == torch.float32 and s["step"].item() == t["step"].item() == 5
        torch.testing.assert_close(s["exp_avg_sq"], t["exp_avg_sq"], rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("shape", [(24, 40), (3, 16, 8)])
def test_muon_step_matches_reference_formula(nesterov, shape):
    gen = torch.Generator().manual_seed(1)
    W0 = torch.randn(*shape, generator=gen)
    grads = [torch.randn(*shape, generator=gen) for _ in range(2)]
    lr, wd, m = 0.05, 0.1, 0.9
    p = nn.Parameter(W0.clone())
    opt = MuonAdamW([{"name": "w", "optimizer": "muon", "params": [p], "lr": lr, "weight_decay": wd,
                      "momentum": m, "nesterov": nesterov}])  # fmt: skip
    W, buf = W0.clone(), torch.zeros(shape)
    scale = 0.2 * math.sqrt(max(shape[-2:]))
    for g in grads:
        p.grad = g.clone()
        opt.step()
        buf = m * buf + g
        update = g + m * buf if nesterov else buf
        W = W * (1 - lr * wd) - lr * scale * newton_schulz(update)
        torch.testing.assert_close(p.detach(), W, rtol=1e-5, atol=1e-6)
    assert muon_scale(torch.Size(shape)) == pytest.approx(scale)


@pytest.mark.parametrize("shape", [(64, 128), (128, 64), (4, 32, 16)])
def test_muon_update_rms_matches_adamw_scale(shape):
    lr = 0.01
    p = nn.Parameter(torch.zeros(*shape))
    opt = MuonAdamW([{"name": "w", "optimizer": "muon", "params": [p], "lr": lr}])
    p.grad = torch.randn(*shape, generator=torch.Generator().manual_seed(2))
    opt.step()
    rms = p.detach().pow(2).mean().sqrt().item()
    assert 0.2 * 0.7 * lr < rms < 0.2 * 1.0 * lr  # measured ~0.174 lr: NS singular values RMS ~0.87


def test_state_dict_round_trip_resumes_exactly():
    model = small_mlp()
    opt = MuonAdamW(muon_groups(model))
    train_steps(model, opt, range(2))
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buffer)
    train_steps(model, opt, range(2, 4))

    buffer.seek(0)
    saved = torch.load(buffer)
    resumed = small_mlp(seed=7)
    resumed.load_state_dict(saved["model"])
    opt2 = MuonAdamW(muon_groups(resumed, lr=0.5, wd=0.0))  # hyperparameters come from the state dict
    opt2.load_state_dict(saved["opt"])
    assert [g["lr"] for g in opt2.param_groups] == [0.02, 0.02]
    train_steps(resumed, opt2, range(2, 4))
    for p, q in zip(model.parameters(), resumed.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6)
    assert opt2.state[resumed[0].bias]["step"].item() == 4


def test_group_errors_name_the_group():
    w, b = nn.Parameter(torch.zeros(4, 4)), nn.Parameter(torch.zeros(4))
    with pytest.raises(ValueError, match="'blocks'.*optimizer"):
        MuonAdamW([{"name": "blocks", "params": [w], "lr": 1e-3}])
    with pytest.raises(ValueError, match="'blocks'.*'sgd'"):
        MuonAdamW([{"name": "blocks", "optimizer": "sgd", "params": [w], "lr": 1e-3}])
    with pytest.raises(ValueError, match=r"'norms'.*\(4,\)"):
        MuonAdamW([{"name": "norms", "optimizer": "muon", "params": [w, b], "lr": 1e-3}])
    with pytest.raises(ValueError, match="'blocks'.*'lr'"):
        MuonAdamW([{"name": "blocks", "optimizer": "adamw", "params": [w]}])


def test_muon_learns_and_skips_params_without_grad():
    torch.manual_seed(0)
    x = torch.randn(256, 16)
    y = torch.tanh(x @ torch.randn(16, 8) / 4) @ torch.randn(8, 4)
    y = y / y.std()
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    frozen = nn.Parameter(torch.ones(3, 3))  # never gets a grad
    groups = muon_groups(model, lr=0.05, wd=0.0)
    groups[0]["params"].append(frozen)
    opt = MuonAdamW(groups)

    def closure():
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        return loss

    losses = [opt.step(closure).item() for _ in range(50)]
    assert losses[-1] < losses[0] / 10, losses[::10]  # measured: / 30
    assert frozen not in opt.state and torch.equal(frozen, torch.ones(3, 3))


# --- FSDP2 (DTensor params) over gloo, 2 processes ---------------------------------------------------

WORLD = 2
FSDP_STEPS = 3


def fsdp_model() -> nn.Module:
    torch.manual_seed(0)  # rows 32 / 15 / 3: even and uneven Shard(0) splits
    return nn.Sequential(nn.Linear(16, 32, bias=False), nn.Tanh(), nn.Linear(32, 15, bias=False),
                         nn.Tanh(), nn.Linear(15, 3))  # fmt: skip


def fsdp_batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per step, one global batch; rank r takes rows r::WORLD."""
    gen = torch.Generator().manual_seed(3)
    return [(torch.randn(8, 16, generator=gen), torch.randn(8, 3, generator=gen)) for _ in range(FSDP_STEPS)]


def fsdp_worker(rank: int, world: int, out_path: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, Shard

    mesh = init_device_mesh("cpu", (world,))
    model = fsdp_model()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = MuonAdamW(muon_groups(model))
    for i, (x, y) in enumerate(fsdp_batches()):
        opt.zero_grad()
        (F.mse_loss(model(x[rank::world]), y[rank::world]) * poison(i)).backward()
        step_unless(opt, torch.tensor(i == SKIPPED))  # DTensor weights, a plain 0-dim flag
    bufs = [opt.state[p]["momentum_buffer"] for p in opt.param_groups[0]["params"]]
    assert all(isinstance(b, DTensor) and b.placements == (Shard(0),) for b in bufs)
    assert [b.to_local().shape[0] for b in bufs] == [16, 8 - rank, 2 - rank]
    full = {name: p.full_tensor() for name, p in model.named_parameters()}
    if rank == 0:
        torch.save(full, out_path)


SKIPPED = 1  # the sharded run's step that the spike guard would skip: NaN gradients, dropped on the device


def poison(i: int) -> float:
    return math.nan if i == SKIPPED else 1.0


@pytest.mark.distributed
def test_fsdp2_muon_matches_single_process(tmp_path):
    out = tmp_path / "fsdp.pt"
    run_distributed(fsdp_worker, WORLD, str(out))

    ref = fsdp_model()
    opt = MuonAdamW(muon_groups(ref))
    for i, (x, y) in enumerate(fsdp_batches()):  # FSDP averages the per-rank grads: one mean over the batch
        opt.zero_grad()
        if i == SKIPPED:  # the sharded run's NaN step changed nothing
            continue
        F.mse_loss(ref(torch.cat([x[r::WORLD] for r in range(WORLD)])),
                   torch.cat([y[r::WORLD] for r in range(WORLD)])).backward()  # fmt: skip
        opt.step()
    sharded = torch.load(out)
    initial = fsdp_model().state_dict()
    for name, p in ref.named_parameters():
        assert not torch.allclose(p, initial[name])  # it did train
        torch.testing.assert_close(sharded[name], p.detach(), rtol=1e-5, atol=1e-5)
