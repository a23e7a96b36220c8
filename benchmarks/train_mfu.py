"""Training throughput and MFU of one device: a ``model=<preset>`` ZayaLM trained with fused AdamW on random
tokens (the data pipeline is not what this measures), each step as the train stage's (grad clipping, the
spike guard's decision and the optimizer's skip on the device, the router-bias update): on a GPU in bf16
weights with fp32 masters (``--precision bf16-master``, the training default there; ``bf16-mixed`` =
autocast), fp32 on a CPU.
``--compile`` compiles each block as one graph (fullgraph, as ``parallel.compile``); ``--layers`` cuts the
preset's depth (a ZAYA1-width model that fits one GPU: ``--model zaya1_base --layers 4``); ``--sync-debug``
runs the timed steps under ``torch.cuda.set_sync_debug_mode("error")``: a host sync in the step fails it.

MFU counts training FLOPs as 3 × ``model.params.forward_flops_per_token`` (active parameters plus attention,
the PaLM convention) against ``train.throughput.resolve_peak`` (the datasheet table for MI300X / H100 /
H200, ``$ZAYA_PEAK_TFLOPS``, or a measured CPU peak)::

    python benchmarks/train_mfu.py --device cuda --model small --batch 8 --seq-len 2048 \
        --out benchmarks/results/train_mfu_gpu.json
    python benchmarks/train_mfu.py --device cpu --model tiny --batch 16 --seq-len 256   # a smoke run

Warm-up steps (compilation, autotuning, allocator growth) are not timed; the figure is the median step time
over ``--steps`` steps, with a device sync per step.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from bench_env import device_name, git_commit  # a sibling module (benchmarks/ is sys.path[0] as a script)

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--model", default="small", help="a conf/model preset")
    p.add_argument("--vocab", type=int, default=32_768, help="vocabulary (the presets take the tokenizer's)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=2048)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--backend", default="auto", help="model.moe.expert_backend")
    p.add_argument(
        "--compile", action="store_true", help="torch.compile each block (fullgraph), not the optimizer"
    )
    p.add_argument("--precision", choices=["auto", "bf16-master", "bf16-mixed", "32-true"], default="auto",
                   help="auto: bf16-master on a GPU, 32-true on a CPU")  # fmt: skip
    p.add_argument("--layers", type=int, default=0, help="override the preset's n_layers (0: keep)")
    p.add_argument("--sync-debug", action="store_true", help="CUDA: error on any host sync in a timed step")
    p.add_argument("--profile", default="", help="also profile one step; write its top kernels here")
    p.add_argument("--out", default="")
    args = p.parse_args()

    from zaya_pipeline.config import StabilityConfig, load_config
    from zaya_pipeline.model.sizing import forward_flops_per_token, num_active_params
    from zaya_pipeline.model.transformer import ZayaLM, compile_blocks
    from zaya_pipeline.train.optim import step_unless
    from zaya_pipeline.train.precision import Bf16Weights
    from zaya_pipeline.train.stability import SpikeGuard
    from zaya_pipeline.train.throughput import mfu, resolve_peak

    device = torch.device(args.device)
    overrides = [
        f"model={args.model}",
        f"model.vocab_size={args.vocab}",
        f"model.moe.expert_backend={args.backend}",
    ]
    if args.layers:
        overrides.append(f"model.n_layers={args.layers}")
    cfg = load_config([*overrides, f"model.max_seq_len={max(args.seq_len, 1)}"]).model
    torch.manual_seed(0)
    with device:  # initialised where it runs: a 1B-parameter init on the host alone takes ~15 s
        model = ZayaLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    guard = SpikeGuard(StabilityConfig(spike_zscore=6.0, spike_skip=True)).to(device)
    if args.compile:
        compile_blocks(model, fullgraph=True)
    precision = args.precision
    if precision == "auto":
        precision = "bf16-master" if device.type == "cuda" else "32-true"
    weights = Bf16Weights(model) if precision == "bf16-master" else contextlib.nullcontext()
    autocast = precision == "bf16-mixed"
    ids = torch.randint(0, args.vocab, (args.batch, args.seq_len + 1), device=device)

    def step() -> None:
        with weights, torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            out = model(ids[:, :-1])
            loss = F.cross_entropy(out.logits.flatten(0, 1).float(), ids[:, 1:].flatten()) + out.aux_loss
            loss.backward()
        # as ZayaLitModule.training_step: clip, the guard decides and the optimizer skips on the device
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        apply, _ = guard.decide(loss.detach(), norm)
        step_unless(opt, ~apply)
        opt.zero_grad(set_to_none=True)
        model.update_router_biases(lambda t: t, apply)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(args.warmup):
        step()
    sync()
    times = []
    for i in range(args.steps):
        t0 = time.perf_counter()
        if args.sync_debug and device.type == "cuda":
            torch.cuda.set_sync_debug_mode("error")
        try:
            step()
        finally:
            if args.sync_debug and device.type == "cuda":
                torch.cuda.set_sync_debug_mode("default")
        sync()
        times.append(time.perf_counter() - t0)
        print(f"step {i + 1}/{args.steps}: {times[-1] * 1e3:.1f} ms", flush=True)
    median = statistics.median(times)
    if args.profile:
        write_profile(step, sync, device, REPO / args.profile)
    tokens = args.batch * args.seq_len
    flops_per_token = 3 * forward_flops_per_token(cfg, args.seq_len)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    peak = resolve_peak(device.type, name, precision)
    report = {
        "benchmark": "train_mfu",
        "date": dt.date.today().isoformat(),
        "commit": git_commit(),
        "command": shlex.join([sys.executable, *sys.argv]),
        "device": device_name(device),
        "hip": torch.version.hip,
        "model": args.model,
        "expert_backend": args.backend,
        "compiled": args.compile,
        "n_layers": cfg.n_layers,
        "sync_debug": args.sync_debug and device.type == "cuda",
        "params_active": num_active_params(cfg),
        "precision": precision,
        "tokens_per_step": tokens,
        "step_ms_median": median * 1e3,
        "step_ms": [t * 1e3 for t in times],
        "tokens_per_s": tokens / median,
        "train_flops_per_token": flops_per_token,
        "tflops": tokens / median * flops_per_token / 1e12,
        "peak_tflops": peak.flops / 1e12 if peak else None,
        "peak_source": peak.source if peak else None,
        "mfu": mfu(tokens / median, flops_per_token, peak.flops) if peak else None,
        "max_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
    }
    mfu_text = f"MFU {100 * report['mfu']:.1f}% of {report['peak_tflops']:.1f} TFLOP/s" if peak else "no peak"
    print(f"{args.model}: {report['tokens_per_s']:.0f} tokens/s, {report['tflops']:.2f} TFLOP/s, {mfu_text}")
    if args.out:
        out = REPO / args.out
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {out}")


def write_profile(step, sync, device: torch.device, path: Path) -> None:
    """One more step under torch.profiler; its kernels by total device time, as a text table."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
        sync()
    sort_by = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(prof.key_averages().table(sort_by=sort_by, row_limit=40, max_name_column_width=70))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
