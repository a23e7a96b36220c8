"""distributed/checkpoint.py: a checkpoint saved by any layout (1 process, FSDP2, FSDP2 x EP over 2 or 4 gloo
processes) resumes in any other, and the continued run equals an uninterrupted one-process run (weights,
AdamW moments and step counts all restored)."""

from __future__ import annotations

import pytest
import torch
from test_parallelize import B_LOCAL, batches, fresh_model, lm_loss

from support.distributed import run_distributed
from zaya_pipeline.config import ParallelConfig
from zaya_pipeline.distributed.checkpoint import (
    EXPERT_SEP,
    checkpoint_name,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from zaya_pipeline.errors import ConfigError

SPLIT, STEPS, GLOBAL = 3, 8, 4  # steps before the checkpoint, steps in all, sequences per step


def global_batches() -> list[torch.Tensor]:
    return [ids[:GLOBAL] for ids in batches(GLOBAL // B_LOCAL)][:STEPS]


def optimizer(model):
    return torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=False)


def train_steps(model, opt, steps, rank, world):
    """AdamW steps on this rank's share of each global batch; returns the all-rank mean losses."""
    import torch.distributed as dist

    rows = GLOBAL // world
    losses = []
    for ids in steps:
        loss = lm_loss(model, ids[rank * rows : (rank + 1) * rows])
        opt.zero_grad()
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        if world > 1:
            dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        losses.append(mean.item())
    return losses


def run_part(rank, world, parallel_kw, ckpt, part, out):
    """Steps [0, SPLIT) then save (part "save"), or load then steps [SPLIT, STEPS) (part "load"); one
    process without any parallelism when ``parallel_kw`` is None."""
    model = fresh_model()
    ep_group = None
    if parallel_kw is not None:
        from zaya_pipeline.distributed.mesh import build_mesh, mesh_sizes
        from zaya_pipeline.distributed.parallelize import parallelize_zaya

        cfg = ParallelConfig(**parallel_kw)
        mesh = build_mesh(mesh_sizes(cfg, world, model.blocks[0].moe.num_experts))
        parallelize_zaya(model, mesh, cfg)
        ep_group = mesh["ep"].get_group()
    opt = optimizer(model)
    if part == "load":
        meta = load_checkpoint(ckpt, model, [opt])
        assert meta["step"] == SPLIT and meta["zaya_layout"]["world_size"] != world
    steps = global_batches()[:SPLIT] if part == "save" else global_batches()[SPLIT:]
    losses = train_steps(model, opt, steps, rank, world)
    if part == "save":
        save_checkpoint(ckpt, model, [opt], {"step": SPLIT}, {"test": parallel_kw})
    if parallel_kw is None:
        params = {k: v.detach().clone() for k, v in model.state_dict().items()}
    else:
        from zaya_pipeline.distributed.state import full_state_dict

        params = full_state_dict(model, ep_group)
    if rank == 0:
        torch.save({"losses": losses, "params": params}, out)


def run_layout(layout, ckpt, part, out):
    world, parallel_kw = layout
    if world == 1:
        run_part(0, 1, None, ckpt, part, out)
    else:
        run_distributed(run_part, world, parallel_kw, ckpt, part, out, timeout_s=240)
    return torch.load(out)


ONE = (1, None)
TWO_EP = (2, {"ep": 2})
TWO_FSDP = (2, {"ep": 1})
FOUR_EP = (4, {"ep": 2})


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize(
    ("saved_by", "resumed_by"),
    [(TWO_EP, ONE), (ONE, TWO_EP), (FOUR_EP, TWO_FSDP)],
    ids=["2proc-ep2-to-1proc", "1proc-to-2proc-ep2", "4proc-fsdp2x2-ep2-to-2proc-fsdp2"],
)
def test_a_checkpoint_resumes_in_another_layout_like_an_uninterrupted_run(tmp_path, saved_by, resumed_by):
    ref_model = fresh_model()
    ref_losses = train_steps(ref_model, optimizer(ref_model), global_batches(), 0, 1)
    ckpt = tmp_path / "ckpt" / checkpoint_name(SPLIT)
    a = run_layout(saved_by, ckpt, "save", tmp_path / "a.pt")
    assert latest_checkpoint(tmp_path / "ckpt") == ckpt
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == [ckpt.name]  # no partial directory left
    b = run_layout(resumed_by, ckpt, "load", tmp_path / "b.pt")
    for got, want in zip(a["losses"] + b["losses"], ref_losses, strict=True):
        assert abs(got - want) / want < 1e-4
    for name, want in ref_model.state_dict().items():
        torch.testing.assert_close(b["params"][name], want, rtol=1e-4, atol=1e-5, msg=name)


def test_experts_are_stored_one_entry_per_expert_and_a_partial_save_is_no_checkpoint(tmp_path):
    import torch.distributed.checkpoint as dcp

    model = fresh_model()
    opt = optimizer(model)
    train_steps(model, opt, global_batches()[:1], 0, 1)
    path = save_checkpoint(tmp_path / checkpoint_name(1), model, [opt], {"step": 1}, {})
    keys = set(dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata)
    name = "blocks.0.moe.experts.w_gate_up_EDF2"
    assert name not in keys
    assert {f"{name}{EXPERT_SEP}{e}" for e in range(4)} <= keys
    assert {f"{name}/optim0.exp_avg{EXPERT_SEP}{e}" for e in range(4)} <= keys
    (tmp_path / ".step0000002.partial").mkdir()
    (tmp_path / "step0000003").mkdir()  # a name alone does not make a checkpoint
    assert list_checkpoints(tmp_path) == [path]
    with pytest.raises(ConfigError, match="step0000003 is not a complete checkpoint"):
        load_checkpoint(tmp_path / "step0000003", model, [opt])


def test_a_checkpoint_of_another_model_names_the_problem(tmp_path):
    import dataclasses

    from test_parallelize import model_config

    from zaya_pipeline.model.transformer import ZayaLM

    model = fresh_model()
    opt = optimizer(model)
    train_steps(model, opt, global_batches()[:1], 0, 1)
    path = save_checkpoint(tmp_path / checkpoint_name(1), model, [opt], {"step": 1}, {})
    other = ZayaLM(dataclasses.replace(model_config(), n_layers=3))
    with pytest.raises(ConfigError, match="does not fit this model: it lacks .*blocks.2"):
        load_checkpoint(path, other, [optimizer(other)])
