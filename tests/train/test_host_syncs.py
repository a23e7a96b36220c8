"""No host sync in a training step (profiling.HostSyncs: the aten ops and Tensor methods that make the host
wait for the device, caught on CPU as on a GPU).

* The model's forward and backward, for every MoE variant: none at all.
* The train stage: a training step makes none (the spike guard decides and the optimizer skips on the
  device); the telemetry callbacks and the guard's streak check read the device only on logging steps. A
  test fails when a sync is added anywhere else."""

from __future__ import annotations

import collections
import itertools

import pytest
import torch
from test_train_stage import debug_config

from zaya_pipeline.config import AttentionConfig, ModelConfig, MoEConfig, RouterConfig
from zaya_pipeline.model.transformer import ZayaLM
from zaya_pipeline.profiling import HostSyncs
from zaya_pipeline.train import module as lit_module
from zaya_pipeline.train.run import train


def small_config(**overrides) -> ModelConfig:
    return ModelConfig(name="t", vocab_size=50, d_model=16, n_layers=2, max_seq_len=32, **overrides)


def cca_config(**overrides) -> ModelConfig:
    attention = AttentionConfig("cca", n_heads=4, n_kv_heads=2, head_dim=8, rope_fraction=0.5)
    return small_config(attention=attention, **overrides)


VARIANTS = list(itertools.product(["gqa", "cca"], ["linear", "zaya1"], [False, True], [0.0, 1.0]))


def test_the_detector_sees_item_tolist_and_data_dependent_shapes():
    x = torch.randn(8)
    with HostSyncs() as syncs:
        float(x.sum()), x.tolist(), torch.nonzero(x > 0), torch.bincount(x.long().abs()), x * 2
    assert [what for what, _ in syncs.calls] == [
        "aten::_local_scalar_dense", "Tensor.tolist", "aten::nonzero", "aten::bincount"
    ]  # fmt: skip


@pytest.mark.parametrize("backend", ["grouped_mm", "triton"])
def test_model_forward_and_backward_make_no_host_sync(backend):
    if backend == "triton":
        pytest.importorskip("triton")
    variants = VARIANTS if backend == "grouped_mm" else VARIANTS[-1:]
    for attention, router, skip, capacity in variants:
        moe = MoEConfig(
            num_experts=4, top_k=2, expert_hidden=16, expert_backend=backend, skip_expert=skip,
            capacity_factor=capacity, router=RouterConfig(type=router, dim=16), skip_bias_init=0.0,
        )  # fmt: skip
        if attention == "gqa":
            model = small_config(attention=AttentionConfig(n_heads=2), moe=moe, residual_scaling=True)
        else:
            model = cca_config(moe=moe, residual_scaling=True)
        model = ZayaLM(model).train()
        ids = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(0))
        with HostSyncs() as syncs:
            out = model(ids)
            (out.logits.float().square().mean() + out.aux_loss).backward()
            model.update_router_biases()
        assert syncs.calls == [], (attention, router, skip, capacity, syncs.calls)


@pytest.mark.slow
@pytest.mark.parametrize("optim", ["adamw", "muon"])
def test_a_training_step_never_reads_the_device(tmp_path, token_dir, monkeypatch, optim):
    calls: dict[tuple[str, int], list] = collections.defaultdict(list)
    step = lit_module.ZayaLitModule.training_step

    def training_step(self, batch, batch_idx):
        with HostSyncs() as syncs:
            out = step(self, batch, batch_idx)
        calls[("step", self.global_step)] += syncs.calls
        return out

    from lightning.pytorch.trainer import call

    hooks, module_hook = call._call_callback_hooks, call._call_lightning_module_hook
    watched = ("on_train_batch_start", "on_train_batch_end", "on_before_optimizer_step")

    def watch(real):
        def hook(trainer, hook_name, *args, **kwargs):
            if hook_name not in watched:
                return real(trainer, hook_name, *args, **kwargs)
            with HostSyncs() as syncs:
                result = real(trainer, hook_name, *args, **kwargs)
            calls[(hook_name, trainer.global_step)] += syncs.calls
            return result

        return hook

    monkeypatch.setattr(lit_module.ZayaLitModule, "training_step", training_step)
    monkeypatch.setattr(call, "_call_callback_hooks", watch(hooks))
    monkeypatch.setattr(call, "_call_lightning_module_hook", watch(module_hook))
    cfg = debug_config(
        tmp_path, token_dir, "train.max_steps=6", "train.log_every=3", "train.val_every=100",
        f"train/optim={optim}", "train.stability.spike_zscore=3", "train.stability.spike_skip=true",
    )  # fmt: skip
    train(cfg)
    steps = sorted(s for kind, s in calls if kind == "step")
    assert steps == [1, 2, 3, 4, 5, 6]
    for s in steps:
        assert calls[("step", s)] == [], calls[("step", s)]
        if s % cfg.train.log_every:  # not a logging step: callbacks add to device-side sums, the guard waits
            for hook in watched:
                assert calls[(hook, s)] == [], (hook, s, calls[(hook, s)])
    assert calls[("on_train_batch_end", 3)], "the logging step reads the interval's sums"
