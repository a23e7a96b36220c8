"""parallelize_zaya on CPU (gloo): FSDP2 x EP over 2 and 4 processes trains like one process on the global
batch."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from support.distributed import run_distributed
from zaya_pipeline.config import AttentionConfig, ModelConfig, MoEConfig, ParallelConfig, RouterConfig
from zaya_pipeline.errors import ConfigError
from zaya_pipeline.model.transformer import ZayaLM

STEPS, B_LOCAL, SEQ = 10, 2, 16
MAX_NORM = 0.2  # below the early grad norms: clipping is active, so the global norm must be right
LR = 1e-2
# Parameters after STEPS AdamW steps are compared by how far they moved: Adam divides each gradient by its own
# RMS, so an entry with a near-zero gradient (an embedding row of a rare token) turns float-rounding
# differences of the gradient into update differences of up to ~LR per step. Elementwise bounds then depend
# on the machine's BLAS (an AMD EPYC/MKL machine put single entries 2e-5..5e-5 off with every loss and grad
# norm within 1e-4); the update of each tensor as a whole must agree to 1e-3 of its size (measured there:
# worst 1.5e-6 with 2 processes, 1.0e-4 with 4).
UPDATE_RTOL = 1e-3


def model_config() -> ModelConfig:
    # aux and z losses off: they are per-rank means, which the global-batch reference would not reproduce
    router = RouterConfig("linear", aux_loss_coef=0.0, z_loss_coef=0.0)
    moe = MoEConfig(num_experts=4, top_k=2, expert_hidden=16, expert_backend="loop", router=router)
    return ModelConfig(
        name="test", vocab_size=64, d_model=16, n_layers=2, max_seq_len=SEQ,
        attention=AttentionConfig(n_heads=2), moe=moe,
    )  # fmt: skip


def fresh_model() -> ZayaLM:
    torch.manual_seed(0)
    return ZayaLM(model_config())


def batches(world: int) -> list[torch.Tensor]:
    """The same global batch every step, so that the loss falls (random tokens cannot be learned)."""
    g = torch.Generator().manual_seed(4)
    return [torch.randint(0, 64, (world * B_LOCAL, SEQ + 1), generator=g)] * STEPS


def lm_loss(model, ids):
    logits = model(ids[:, :-1]).logits
    return F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())


def worker(rank, world, parallel_kw, out):
    from zaya_pipeline.distributed.grad_norm import clip_grad_norm_
    from zaya_pipeline.distributed.mesh import build_mesh, mesh_sizes
    from zaya_pipeline.distributed.parallelize import parallelize_zaya

    cfg = ParallelConfig(**parallel_kw)
    model = fresh_model()
    mesh = build_mesh(mesh_sizes(cfg, world, model_config().moe.num_experts))
    parallelize_zaya(model, mesh, cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, foreach=False)
    losses, norms = [], []
    for ids in batches(world):
        loss = lm_loss(model, ids[rank * B_LOCAL : (rank + 1) * B_LOCAL])
        opt.zero_grad()
        loss.backward()
        norms.append(clip_grad_norm_(model.parameters(), MAX_NORM, cfg.dp_replicate).item())
        opt.step()
        losses.append(loss.item())
    wrapper = "._checkpoint_wrapped_module"  # activation checkpointing's wrapper module, not in the reference
    params = {name.replace(wrapper, ""): p.full_tensor() for name, p in model.named_parameters()}
    torch.save({"losses": losses, "norms": norms, "params": params}, out % rank)


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize(
    ("world", "parallel_kw"),
    [(2, {"ep": 2}), (2, {"ep": 1}), (2, {"ep": 2, "activation_checkpointing": "full"}), (4, {"ep": 2})],
    ids=["2proc-fsdp2-ep2", "2proc-fsdp2", "2proc-fsdp2-ep2-full-ac", "4proc-fsdp2x2-ep2"],
)
def test_processes_match_one_on_the_global_batch(tmp_path, world, parallel_kw):
    out = str(tmp_path / "rank%d.pt")
    run_distributed(worker, world, parallel_kw, out, timeout_s=240)
    ref = fresh_model()
    opt = torch.optim.AdamW(ref.parameters(), lr=LR, foreach=False)
    ref_losses, ref_norms = [], []
    for ids in batches(world):
        # the global mean = the mean of the equal-sized per-rank means
        loss = sum(lm_loss(ref, ids[r * B_LOCAL : (r + 1) * B_LOCAL]) for r in range(world)) / world
        opt.zero_grad()
        loss.backward()
        ref_norms.append(torch.nn.utils.clip_grad_norm_(ref.parameters(), MAX_NORM).item())
        opt.step()
        ref_losses.append(loss.item())
    got = [torch.load(out % r) for r in range(world)]
    mean_losses = [sum(g["losses"][s] for g in got) / world for s in range(STEPS)]
    for step, (a, b) in enumerate(zip(mean_losses, ref_losses, strict=True)):
        assert abs(a - b) / abs(b) < 1e-4, f"step {step}: {a} vs {b}"
    for g in got:
        torch.testing.assert_close(g["norms"], ref_norms, rtol=1e-4, atol=0)
    assert ref_norms[0] > MAX_NORM
    assert ref_losses[-1] < ref_losses[0] - 0.3  # it trained
    ep = parallel_kw["ep"]
    init = dict(fresh_model().named_parameters())
    for name, p in ref.named_parameters():
        if ".experts." in name and ep > 1:  # EP rank e holds experts e*E/ep..; ranks are ep-minor in the mesh
            mine = torch.cat([g["params"][name] for g in got[:ep]])
        else:
            mine = got[0]["params"][name]
        moved = (p - init[name]).norm()
        assert moved > 0, name
        off = (mine - p).norm() / moved
        assert off < UPDATE_RTOL, f"{name}: off by {off:.2e} of its update"


def test_bad_parallel_options_name_the_key():
    from zaya_pipeline.distributed.parallelize import parallelize_zaya

    with pytest.raises(ConfigError, match="parallel.activation_checkpointing"):
        parallelize_zaya(
            fresh_model(), None, dataclasses.replace(ParallelConfig(), activation_checkpointing="x")
        )
