"""zaya plan (train/memory_plan.py): the closed-form per-device memory and communication plan.

* The per-layer activation formulas equal the bytes autograd saves for backward
  (``testing.memory.saved_activation_bytes``) for every attention, router and expert-backend variant.
* The planned peak is within 15% of the peak measured in real training steps on CPU: one process (fp32,
  bf16 autocast, AdamW and Muon, AC none and full) and 2 gloo processes with FSDP2 x EP=2.
* Sharding degrees, the order of the AC modes, a sensible verdict for zaya1_base on 8 x MI300X, and
  ConfigErrors that name the key.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from support.distributed import run_distributed
from zaya_pipeline.config import AttentionConfig, ModelConfig, MoEConfig, RouterConfig, load_config
from zaya_pipeline.errors import ConfigError
from zaya_pipeline.model.sizing import num_params
from zaya_pipeline.model.transformer import Block, ZayaLM
from zaya_pipeline.ops.expert_mlp import triton_available
from zaya_pipeline.profiling import saved_activation_bytes
from zaya_pipeline.train.memory_plan import AC_MODES, DEVICES, GB, activations, block_saved, memory_plan

TOLERANCE = 0.15  # the bar for planned vs measured peak memory

# --- activation formulas vs the tensors autograd saves -----------------------------------------------------

BASE = ModelConfig(
    name="t", vocab_size=96, d_model=64, n_layers=3, max_seq_len=64, attention=AttentionConfig(n_heads=4),
    moe=MoEConfig(num_experts=4, top_k=2, expert_hidden=64, expert_backend="grouped_mm"),
)  # fmt: skip
CCA = AttentionConfig("cca", n_heads=4, n_kv_heads=2, head_dim=16, rope_fraction=0.5)
ZAYA1_ROUTER = RouterConfig("zaya1", dim=32)
VARIANTS = {
    "gqa top2": BASE,
    "gqa top1": dataclasses.replace(BASE, moe=dataclasses.replace(BASE.moe, top_k=1)),
    "gqa kv2 partial rope": dataclasses.replace(
        BASE, attention=AttentionConfig(n_heads=4, n_kv_heads=2, rope_fraction=0.5)
    ),
    "gqa no rope": dataclasses.replace(BASE, attention=AttentionConfig(n_heads=4, rope_fraction=0.0)),
    "cca": dataclasses.replace(BASE, attention=CCA),
    "cca zaya1 router residual scaling": dataclasses.replace(
        BASE,
        attention=CCA,
        residual_scaling=True,
        moe=dataclasses.replace(BASE.moe, top_k=1, router=ZAYA1_ROUTER),
    ),
    "shared expert": dataclasses.replace(BASE, moe=dataclasses.replace(BASE.moe, shared_expert_hidden=32)),
    "loop backend": dataclasses.replace(BASE, moe=dataclasses.replace(BASE.moe, expert_backend="loop")),
    "triton backend": dataclasses.replace(BASE, moe=dataclasses.replace(BASE.moe, expert_backend="triton")),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_block_formula_equals_saved_tensors(name):
    m = VARIANTS[name]
    if m.moe.expert_backend == "triton" and not triton_available():
        pytest.skip("Triton is not installed")
    B, T = 2, 32
    torch.manual_seed(0)
    block = Block(m)
    block.attn.reset_parameters(0.02, 0.01)
    block.moe.reset_parameters(0.02, 0.01)
    x = torch.randn(B, T, m.d_model, requires_grad=True)  # the block input is counted (the first norm's)
    zaya1 = m.moe.router.type == "zaya1"
    state = torch.randn(B * T, m.moe.router.dim, requires_grad=True) if zaya1 else None
    weights = [*block.parameters(), *block.buffers()] + (
        [state] if zaya1 else []
    )  # state: the previous layer's
    _, nbytes = saved_activation_bytes(lambda: block(x, state), weights)
    planned = block_saved(m, B, T, 4, backend=m.moe.expert_backend)
    assert planned == pytest.approx(nbytes, rel=0.005), (planned, nbytes)


@pytest.mark.parametrize("name", ["gqa top2", "cca zaya1 router residual scaling"])
def test_model_formula_equals_saved_tensors(name):
    """The whole forward without checkpointing: every block, the final norm and the logits' input."""
    m = VARIANTS[name]
    B, T = 2, 32
    torch.manual_seed(0)
    model = ZayaLM(m)
    ids = torch.randint(0, m.vocab_size, (B, T))
    _, nbytes = saved_activation_bytes(lambda: model(ids), [*model.parameters(), *model.buffers(), ids])
    planned, recompute = activations(m, B, T, 4, "none", backend=m.moe.expert_backend)
    assert recompute == 0
    assert planned == pytest.approx(nbytes, rel=0.005), (planned, nbytes)


# --- planned vs measured peak memory -----------------------------------------------------------------------

TINY = ["model=tiny", "train.micro_batch=4", "train.seq_len=128"]
SINGLE = {
    "debug, V=512, AC none": ["model=debug", "tokenizer=debug", "train.micro_batch=8", "train.seq_len=64"],
    "tiny, AC none": TINY,
    "tiny, AC full": [*TINY, "parallel.activation_checkpointing=full"],
    "tiny, bf16-mixed": [*TINY, "train.precision=bf16-mixed"],
    "tiny, Muon, 2 x 64 tokens": [
        "model=tiny",
        "train.micro_batch=2",
        "train.seq_len=64",
        "train/optim=muon",
    ],
}
FSDP = {
    "tiny, FSDP2 x EP=2, AC none": [*TINY, "parallel=fsdp2_ep2"],
    "tiny, FSDP2 x EP=2, AC full, bf16 params": [
        *TINY,
        "parallel=fsdp2_ep2",
        "parallel.activation_checkpointing=full",
        "parallel.param_dtype=bfloat16",
    ],
}


def _peak_allocated(prof) -> int:
    """The peak of the running sum of the CPU allocator's allocations (+) and frees (-), in time order."""
    events = sorted(
        (e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
        key=lambda e: e.start_ns(),
    )
    current = peak = 0
    for event in events:
        current += event.nbytes()
        peak = max(peak, current)
    return peak


def _train_steps(cfg, world: int, steps: int = 2) -> None:
    """Build the model and optimizer as the trainer does and run ``steps`` training steps of one
    micro-batch: forward, loss + router losses, backward, grad-norm clipping, optimizer step, zero_grad."""
    from zaya_pipeline.distributed.grad_norm import clip_grad_norm_
    from zaya_pipeline.distributed.mesh import build_mesh, mesh_sizes
    from zaya_pipeline.distributed.parallelize import _checkpoint_blocks, parallelize_zaya
    from zaya_pipeline.model.sizing import with_resolved_vocab
    from zaya_pipeline.train.module import lm_loss
    from zaya_pipeline.train.optim import build_optimizer

    m = with_resolved_vocab(cfg)
    B, T = cfg.train.micro_batch, cfg.train.seq_len
    rank = torch.distributed.get_rank()
    ids = torch.randint(0, m.vocab_size, (steps, B, T + 1), generator=torch.Generator().manual_seed(rank))
    torch.manual_seed(0)
    model = ZayaLM(m).train()
    fsdp = cfg.parallel.strategy == "fsdp2"
    if fsdp:
        parallelize_zaya(model, build_mesh(mesh_sizes(cfg.parallel, world, m.moe.num_experts)), cfg.parallel)
    elif cfg.parallel.activation_checkpointing != "none":
        _checkpoint_blocks(model, cfg.parallel.activation_checkpointing)
    optimizer = build_optimizer(model, cfg.train.optim)
    autocast = cfg.train.precision == "bf16-mixed"
    for s in range(steps):
        # Lightning's bf16-mixed runs the whole (manually optimized) training step under autocast
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = model(ids[s, :, :-1])
            loss = lm_loss(out.logits, ids[s, :, 1:])
            (loss + out.aux_loss).backward()
            if fsdp:
                clip_grad_norm_(model.parameters(), 1.0, cfg.parallel.dp_replicate)
            else:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del out, loss


def measure_worker(rank: int, world: int, configs: dict[str, list[str]], out_dir: str) -> None:
    """Measure the peak memory of real training steps, one config after the other, in a fresh process.

    The measurement is ``torch.profiler`` with ``profile_memory=True``: it records every allocation and
    free of torch's CPU allocator, so the peak of their running sum is the peak of the memory tensors held:
    weights, gradients, optimizer states, activations, FSDP and all-to-all buffers, autograd's and the
    kernels' temporaries, whatever made them. It is exact and repeatable on a busy 2-core machine, and knows
    nothing of the planner's formulas. RSS (``ru_maxrss``) was not used: for models of a few MB it is
    dominated by torch's own footprint, and glibc keeps freed blocks mapped (see
    ``utils.keep_freed_memory``), so it neither falls after a free nor rises on reuse. The profiled window
    starts before the model is built and holds two steps: the second is the steady state, in which the
    optimizer states exist through forward and backward. ``run_distributed`` gives the run a process of
    its own, so no other test's tensors are freed inside the window."""
    from torch.profiler import ProfilerActivity, profile

    peaks = {}
    for name, overrides in configs.items():
        cfg = load_config(overrides)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            _train_steps(cfg, world)
        peaks[name] = _peak_allocated(prof)
    Path(out_dir, f"{rank}.json").write_text(json.dumps(peaks))


def _measure(configs: dict[str, list[str]], world: int, tmp_path_factory) -> dict[str, int]:
    """Per config, the largest peak over the ranks (the device that has to fit)."""
    out = tmp_path_factory.mktemp("memory")
    run_distributed(measure_worker, world, configs, str(out), timeout_s=600)
    ranks = [json.loads((out / f"{r}.json").read_text()) for r in range(world)]
    return {name: max(r[name] for r in ranks) for name in configs}


@pytest.fixture(scope="module")
def measured_single(tmp_path_factory) -> dict[str, int]:
    return _measure(SINGLE, 1, tmp_path_factory)


@pytest.fixture(scope="module")
def measured_fsdp(tmp_path_factory) -> dict[str, int]:
    return _measure(FSDP, 2, tmp_path_factory)


def _check(name: str, overrides: list[str], measured: int) -> None:
    cfg = load_config(overrides)
    planned = memory_plan(cfg).peak[cfg.parallel.activation_checkpointing]
    error = planned / measured - 1
    print(f"\n{name}: measured {measured / 1e6:.2f} MB, planned {planned / 1e6:.2f} MB ({error:+.1%})")
    assert abs(error) <= TOLERANCE, f"{name}: planned {planned} B vs measured {measured} B ({error:+.1%})"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SINGLE))
def test_measured_peak_one_process(name, measured_single):
    _check(name, SINGLE[name], measured_single[name])


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("name", list(FSDP))
def test_measured_peak_fsdp2_ep2(name, measured_fsdp):
    _check(name, FSDP[name], measured_fsdp[name])


# --- layout, ordering, verdicts, errors --------------------------------------------------------------------


def plan_of(*overrides: str):
    return memory_plan(load_config(list(overrides)))


def test_sharding_divides_params_grads_and_optimizer_states():
    one = plan_of("model=small", "parallel=fsdp2_ep2", "parallel.devices=1", "parallel.ep=1")
    two = plan_of("model=small", "parallel=fsdp2_ep2")  # 2 devices, ep=2: experts split, the rest sharded
    hsdp = plan_of("model=small", "parallel=fsdp2_ep2", "parallel.devices=4", "parallel.dp_replicate=2")
    ddp = plan_of("model=small", "parallel.devices=2")  # strategy auto: a full replica per device
    for row in ("parameters", "gradients", "optimizer states"):
        full = one.memory[row]["none"]
        assert two.memory[row]["none"] == pytest.approx(full / 2, rel=1e-6)
        assert hsdp.memory[row]["none"] == pytest.approx(full / 2, rel=1e-6)  # 2 replicas of 2 shards
        assert ddp.memory[row]["none"] == full


def test_params_per_device_are_the_model_over_dp_shard():
    cfg = load_config(["model=zaya1_base", "parallel=fsdp2_ep2", "parallel.devices=8", "parallel.ep=8"])
    p = memory_plan(cfg)
    assert p.memory["parameters"]["none"] == num_params(cfg.model) * 4 // 8
    assert p.memory["optimizer states"]["none"] == 2 * num_params(cfg.model) * 4 // 8  # AdamW: 2 states


def test_expert_parallel_shrinks_the_unsharded_experts_and_adds_all_to_all():
    ep1 = plan_of("model=small", "parallel=fsdp2_ep2", "parallel.ep=1")
    ep2 = plan_of("model=small", "parallel=fsdp2_ep2")
    key = "FSDP unsharded weights + grads"
    assert ep2.memory[key]["none"] < ep1.memory[key]["none"]
    assert not any(name.startswith("EP") for name in ep1.comm)
    recompute = ep2.comm["EP all-to-all, recompute"]
    assert recompute["none"] == 0 < recompute["selective"] < recompute["full"]
    assert ep2.comm["EP all-to-all, forward"]["none"] > 0


def test_muon_keeps_fewer_states_than_adamw():
    adamw = plan_of("model=small")
    muon = plan_of("model=small", "train/optim=muon")
    n = adamw.memory["parameters"]["none"]
    assert adamw.memory["optimizer states"]["none"] == 2 * n
    assert n < muon.memory["optimizer states"]["none"] < 2 * n  # 1 state for the hidden matrices


@pytest.mark.parametrize("model", ["tiny", "zaya1_base"])
def test_activation_checkpointing_full_below_selective_below_none(model):
    p = plan_of(f"model={model}", "train.micro_batch=2", "train.seq_len=256")
    acts = p.memory["activations"]
    assert acts["full"] < acts["selective"] < acts["none"]
    assert p.peak["full"] <= p.peak["selective"] <= p.peak["none"]


def test_zaya1_base_on_8_mi300x():
    p = plan_of(
        "model=zaya1_base", "parallel=fsdp2_ep2", "parallel.devices=8", "parallel.ep=8",
        "parallel.accelerator=gpu", "parallel.param_dtype=bfloat16", "train.micro_batch=1",
        "train.seq_len=4096",
    )  # fmt: skip
    peak = p.peak["none"]
    # 8.8B parameters: 16 bytes each (fp32 weights, grads, 2 AdamW states) over 8 devices = 17.7 GB, plus
    # activations and the 262k-vocabulary logits
    assert 20 * GB < peak < DEVICES["MI300X"]
    assert p.peak["full"] < peak
    assert all(name.startswith(("FSDP", "EP")) for name in p.comm)
    one = plan_of("model=zaya1_base", "train.micro_batch=1", "train.seq_len=4096")  # one device
    assert DEVICES["H200"] < one.peak["full"] < DEVICES["MI300X"]  # 141 GB of weights and AdamW states


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["parallel=fsdp2_ep2", "parallel.ep=3"], "parallel.ep=3 must divide parallel.dp_shard=2"),
        (["parallel=fsdp2_ep2", "parallel.devices=4", "parallel.dp_replicate=3"], "parallel.dp_replicate=3"),
        (
            ["model=tiny", "parallel=fsdp2_ep2", "parallel.devices=16", "parallel.ep=16"],
            "model.moe.num_experts",
        ),
        (["parallel.ep=2"], "parallel.strategy=fsdp2"),
        (["parallel.devices=0"], "parallel.devices"),
        (["train.micro_batch=0"], "train.micro_batch"),
        (["model=debug", "train.seq_len=4096"], "train.seq_len=4096"),
        (["train.precision=fp8"], "train.precision"),
        (["parallel.activation_checkpointing=half"], "parallel.activation_checkpointing"),
        (["parallel=fsdp2_ep2", "train.global_batch=3"], "train.global_batch=3"),
    ],
)
def test_bad_sizes_raise_config_errors_naming_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        plan_of(*overrides)


def test_cli_prints_the_plan(repo_root):
    run = lambda *args: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "zaya_pipeline.cli", "plan", *args],
        capture_output=True, text=True, cwd=repo_root, timeout=120,
    )  # fmt: skip
    out = run("model=debug", "parallel=fsdp2_ep2", "train.micro_batch=4")
    assert out.returncode == 0, out.stderr
    for text in ("total at peak", "activations", "EP all-to-all, forward", "MI300X (192 GB)", "1 GB = 1e9"):
        assert text in out.stdout
    assert all(mode in out.stdout for mode in AC_MODES)
    bad = run("parallel=fsdp2_ep2", "parallel.ep=3")
    assert bad.returncode == 2 and "parallel.ep=3" in bad.stderr and "Traceback" not in bad.stderr
