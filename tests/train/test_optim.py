from __future__ import annotations

import pytest
import torch

from zaya_pipeline.config import (
    AttentionConfig,
    BatchRampConfig,
    ModelConfig,
    MoEConfig,
    OptimConfig,
    ParamGroupRule,
    RouterConfig,
    ScheduleConfig,
    TrainConfig,
)
from zaya_pipeline.errors import ConfigError
from zaya_pipeline.model import ZayaLM
from zaya_pipeline.train.optim import (
    assign_param_groups,
    batch_at,
    build_optimizer,
    build_scheduler,
    check_batch,
    check_schedule,
    lr_multiplier,
    planned_schedule,
    warmup_cosine,
)


def _model(tie: bool = True, zaya: bool = False, attention: str = "gqa") -> ZayaLM:
    router = RouterConfig(type="zaya1", dim=8) if zaya else RouterConfig()
    cfg = ModelConfig(
        vocab_size=30,
        d_model=16,
        n_layers=2,
        attention=AttentionConfig(type=attention, n_heads=2, n_kv_heads=1 if attention == "cca" else 0),
        tie_embeddings=tie,
        residual_scaling=zaya,
        moe=MoEConfig(4, 2, 8, shared_expert_hidden=8 if zaya else 0, router=router),
    )
    return ZayaLM(cfg)


@pytest.mark.parametrize("name", ["adamw", "muon"])
@pytest.mark.parametrize("variant", [(True, False, "gqa"), (False, True, "cca")])
def test_every_parameter_lands_in_exactly_one_group(name, variant):
    model = _model(*variant)
    groups = assign_param_groups(model, OptimConfig(name=name))
    assigned = [n for g in groups for n in g.names]
    assert sorted(assigned) == sorted(n for n, _ in model.named_parameters())
    assert len(assigned) == len(set(assigned))
    by_name = {n: g for g in groups for n in g.names}
    # The default rules: no decay for embeddings / norms / scales; Muon only for hidden matrices.
    assert by_name["embed.weight"].weight_decay == 0.0 and by_name["embed.weight"].optimizer == "adamw"
    assert by_name["final_norm.weight"].name == "no_decay"
    for hidden in (
        "blocks.0.moe.experts.w_gate_up_EDF2",
        "blocks.1.moe.experts.w_down_EFD",
        "blocks.0.attn.out.weight",
    ):
        assert by_name[hidden].name == "hidden" and by_name[hidden].optimizer == name
        assert by_name[hidden].weight_decay == 0.1
    router = [n for n in by_name if ".router." in n and n.endswith("weight") and "norm" not in n]
    assert router and all(by_name[n].name == "router" and by_name[n].optimizer == "adamw" for n in router)
    if not variant[0]:
        assert by_name["lm_head.weight"].name == "head"
    if variant[2] == "cca":
        assert by_name["blocks.0.attn.conv_grouped.weight"].name == "conv"
        assert by_name["blocks.0.attn.temperature_G"].name == "no_decay"


def test_first_matching_rule_wins_and_unmatched_parameters_are_an_error():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    rules = [
        ParamGroupRule(name="first", match=["0.*"], lr_scale=0.5),
        ParamGroupRule(name="second", match=["0.weight", "1.*"], weight_decay=0.0),
    ]
    groups = assign_param_groups(model, OptimConfig(param_groups=rules))
    assert [(g.name, g.names) for g in groups] == [
        ("first", ["0.weight", "0.bias"]),
        ("second", ["1.weight", "1.bias"]),
    ]
    opt = build_optimizer(model, OptimConfig(lr=0.1, param_groups=rules))
    assert [g["lr"] for g in opt.param_groups] == [0.05, 0.1]
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    with pytest.raises(ConfigError, match=r"'1.weight'.*matches no rule of train.optim.param_groups"):
        assign_param_groups(model, OptimConfig(param_groups=rules[:1]))
    with pytest.raises(ConfigError, match=r"param_groups\[0\].*'sgd'"):
        assign_param_groups(model, OptimConfig(param_groups=[ParamGroupRule(optimizer="sgd")]))
    with pytest.raises(ConfigError, match="no parameter matches a rule with optimizer: muon"):
        assign_param_groups(model, OptimConfig(name="muon", param_groups=[ParamGroupRule()]))


def test_adamw_is_fused_and_muon_builds_the_hybrid():
    model = _model()
    adamw = build_optimizer(model, OptimConfig())
    assert isinstance(adamw, torch.optim.AdamW) and adamw.defaults["fused"]
    muon = build_optimizer(model, OptimConfig(name="muon"))
    kinds = {g["name"]: g["optimizer"] for g in muon.param_groups}
    assert kinds["hidden"] == "muon" and kinds["no_decay"] == "adamw"
    hidden = next(g for g in muon.param_groups if g["name"] == "hidden")
    assert hidden["lr"] == OptimConfig().muon.lr and hidden["momentum"] == 0.95


def test_unknown_optimizer_names_the_key():
    with pytest.raises(ConfigError, match="train.optim.name"):
        build_optimizer(torch.nn.Linear(2, 2), OptimConfig(name="sgd"))


def test_warmup_then_cosine_to_the_floor():
    lrs = [warmup_cosine(s, warmup_steps=10, max_steps=110, min_lr_ratio=0.1) for s in range(130)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a < b for a, b in zip(lrs[:10], lrs[1:10], strict=False))
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:], strict=False))
    assert lrs[60] == pytest.approx(0.55)  # halfway through the cosine
    assert lrs[110] == pytest.approx(0.1) and lrs[129] == pytest.approx(0.1)


@pytest.mark.parametrize("shape", ["linear", "sqrt"])
def test_wsd_is_warmup_then_flat_then_decay_over_the_last_steps(shape):
    cfg = ScheduleConfig(name="wsd", warmup_steps=10, min_lr_ratio=0.0, decay_fraction=0.2, decay_shape=shape)
    lrs = [lr_multiplier(s, cfg, 100) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == 1.0
    assert all(x == 1.0 for x in lrs[10:80])
    assert all(a > b for a, b in zip(lrs[80:], lrs[81:], strict=False))
    expected = 0.5 if shape == "linear" else 1 - 0.5**0.5
    assert lrs[90] == pytest.approx(expected)
    assert lr_multiplier(100, cfg, 100) == 0.0
    # A decay branched from a stable-phase checkpoint: only max_steps and decay_steps change.
    branch = ScheduleConfig(name="wsd", warmup_steps=10, min_lr_ratio=0.0, decay_steps=20, decay_shape=shape)
    assert [lr_multiplier(s, branch, 60) for s in range(40)] == lrs[:40]
    assert lr_multiplier(50, branch, 60) == pytest.approx(expected)


def test_schedule_config_errors_name_the_key():
    with pytest.raises(ConfigError, match="train.schedule.name"):
        check_schedule(ScheduleConfig(name="step"), 100)
    with pytest.raises(ConfigError, match="WSD decay of 0 steps"):
        check_schedule(ScheduleConfig(name="wsd", decay_fraction=0.0), 100)
    with pytest.raises(ConfigError, match="decay_shape"):
        check_schedule(ScheduleConfig(name="wsd", decay_shape="cubic"), 100)


def test_batch_ramp_yields_the_configured_tokens_per_step():
    ramp = BatchRampConfig(start=4, increment=4, steps=30, lr_scaling="sqrt")
    train = TrainConfig(max_steps=40, micro_batch=4, global_batch=16, seq_len=8, batch_ramp=ramp)
    check_batch(train, world_size=2)
    # 3 stages of 10 steps: 4, 8, 12 sequences, then the full 16.
    assert [batch_at(s, ramp, 16) for s in (0, 9, 10, 19, 20, 29, 30, 39)] == [4, 4, 8, 8, 12, 12, 16, 16]
    rows = planned_schedule(train, world_size=2)
    assert [r[2] for r in rows[::10]] == [32, 64, 96, 128]  # tokens per step = sequences x seq_len
    cosine = [lr_multiplier(s, train.schedule, 40) for s in range(40)]
    assert rows[5][1] == pytest.approx(cosine[5] * 0.5)  # sqrt(4 / 16)
    assert rows[35][1] == pytest.approx(cosine[35])
    with pytest.raises(ConfigError, match="train.batch_ramp"):
        check_batch(TrainConfig(global_batch=16, batch_ramp=BatchRampConfig(4, 5, 30)), 1)
    with pytest.raises(ConfigError, match="divisible by the 3 data-parallel ranks"):
        check_batch(TrainConfig(global_batch=16), 3)


def test_scheduler_steps_every_group_lr():
    model = torch.nn.Linear(2, 2)
    train = TrainConfig(
        max_steps=4, optim=OptimConfig(lr=1e-2), schedule=ScheduleConfig(warmup_steps=2, min_lr_ratio=0.0)
    )
    opt = build_optimizer(model, train.optim)
    sched = build_scheduler(opt, train)
    seen = []
    for _ in range(4):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([5e-3, 1e-2, 1e-2, 5e-3])


@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_a_skipped_step_changes_nothing_on_the_device_and_an_applied_one_matches_a_plain_step(name):
    """``step_unless``: torch's ``found_inf`` protocol. A skipped step (NaN gradients) leaves weights and
    every state tensor bit-identical and makes no host read; an applied one equals ``optimizer.step()``."""
    from zaya_pipeline.profiling import HostSyncs
    from zaya_pipeline.train.optim import skips_on_device, step_unless

    def run(gate: bool):
        torch.manual_seed(0)
        model = _model(zaya=True)
        opt = build_optimizer(model, OptimConfig(name=name, weight_decay=0.1))
        assert skips_on_device(opt)
        for step in range(3):
            for i, p in enumerate(model.parameters()):
                p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(step * 1000 + i))
            step_unless(opt, torch.tensor(False)) if gate else opt.step()
        return model, opt

    gated, opt = run(True)
    plain, _ = run(False)
    for (key, a), b in zip(gated.state_dict().items(), plain.state_dict().values(), strict=True):
        assert torch.equal(a, b), key

    def snapshot():
        state = [t.clone() for s in opt.state.values() for t in s.values() if torch.is_tensor(t)]
        return [p.detach().clone() for p in gated.parameters()] + state

    before = snapshot()
    for p in gated.parameters():
        p.grad = torch.full_like(p, float("nan"))
    with HostSyncs() as syncs:
        step_unless(opt, torch.tensor(True))
    assert syncs.calls == []
    assert all(torch.equal(a, b) for a, b in zip(before, snapshot(), strict=True))
