"""Optimizer step time on CPU: fused ``torch.optim.AdamW`` vs ``MuonAdamW`` on one ``small`` block.

One transformer block of the ``small`` preset (the whole 1.05B model with optimizer state does not fit
comfortably in 24 GiB) gets random gradients. Both arms are the train stage's ``build_optimizer`` with the
default parameter-group rules: ``adamw`` (fused AdamW everywhere) and ``muon`` (Muon on the attention
projections and expert matrices, fused AdamW on the rest). After warm-up steps the arms are timed
interleaved (A, B, A, B, ...) so that machine noise hits both; the JSON holds the median seconds per step,
the ratio muon / adamw and the parameter counts::

    python benchmarks/optimizer_step.py --steps 7 --out benchmarks/results/optimizer_step.json
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

from bench_env import git_commit  # a sibling module (benchmarks/ is sys.path[0] when run as a script)

REPO = Path(__file__).resolve().parents[1]
LR, WD, BETAS = 3e-4, 0.1, (0.9, 0.95)


def build_block(preset: str) -> torch.nn.Module:
    from zaya_pipeline.config import load_config
    from zaya_pipeline.model.transformer import Block

    return Block(load_config([f"model={preset}"]).model)


def random_grads(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen) * 1e-3


def ns_flops(shape: list[int], steps: int) -> int:
    """Matmul FLOPs of Newton–Schulz on a (..., A, B) stack: per step X X^T, A A and B X (m <= n)."""
    m, n = sorted(shape[-2:])
    batch = 1
    for size in shape[:-2]:
        batch *= size
    return batch * steps * (4 * m * m * n + 2 * m**3)


def timed_step(opt: torch.optim.Optimizer) -> float:
    t0 = time.perf_counter()
    opt.step()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=7, help="timed steps per arm (default 7)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per arm first (default 2)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--preset", default="small", help="model preset whose block is used (default small)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/optimizer_step.json")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from zaya_pipeline.config import OptimConfig
    from zaya_pipeline.train.optim import build_optimizer

    load_before = os.getloadavg()
    torch.manual_seed(0)
    block_a = build_block(args.preset)
    block_b = copy.deepcopy(block_a)
    for seed, block in enumerate((block_a, block_b)):
        random_grads(block, seed)
    # The train stage's own optimizers and default parameter-group rules (train/optim.py).
    hp = {"lr": LR, "weight_decay": WD, "beta1": BETAS[0], "beta2": BETAS[1]}
    arms = {
        "adamw": build_optimizer(block_a, OptimConfig(name="adamw", **hp)),
        "muon": build_optimizer(block_b, OptimConfig(name="muon", **hp)),
    }
    groups = arms["muon"].param_groups
    muon_ids = {id(p) for g in groups if g["optimizer"] == "muon" for p in g["params"]}
    counts = {
        "muon": sum(p.numel() for p in block_b.parameters() if id(p) in muon_ids),
        "adamw": sum(p.numel() for p in block_b.parameters() if id(p) not in muon_ids),
    }
    muon_shapes = {n: list(p.shape) for n, p in block_b.named_parameters() if id(p) in muon_ids}
    print(f"block of {args.preset}: {sum(counts.values()):,} params; muon {counts['muon']:,}, "
          f"adamw {counts['adamw']:,}; {torch.get_num_threads()} threads", flush=True)  # fmt: skip

    for name, opt in arms.items():
        for i in range(args.warmup):
            print(f"warm-up {name} {i + 1}/{args.warmup}: {timed_step(opt):.3f} s", flush=True)
    times: dict[str, list[float]] = {name: [] for name in arms}
    for i in range(args.steps):
        for name, opt in arms.items():
            times[name].append(timed_step(opt))
            print(f"step {i + 1}/{args.steps} {name}: {times[name][-1]:.3f} s", flush=True)

    median = {name: statistics.median(ts) for name, ts in times.items()}
    command = ["python", "benchmarks/optimizer_step.py", *(sys.argv[1:] if argv is None else argv)]
    muon_group = next(g for g in groups if g["optimizer"] == "muon")
    ns_gflop = sum(ns_flops(shape, muon_group["ns_steps"]) for shape in muon_shapes.values()) / 1e9
    result = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "command": shlex.join(command),
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "loadavg_1_5_15min": {"before": load_before, "after": os.getloadavg()},
        "preset": args.preset,
        "what": "one transformer block, random grads; adamw = torch.optim.AdamW(fused=True) over all params, "
        "muon = MuonAdamW (Muon on hidden matrices, fused AdamW on the rest); fp32 on CPU",
        "params": {"total": sum(counts.values()), **counts},
        "muon_param_shapes": muon_shapes,
        "hyperparameters": {
            "lr": LR,
            "weight_decay": WD,
            "betas": list(BETAS),
            **{key: muon_group[key] for key in ("momentum", "nesterov", "ns_steps")},
        },
        "warmup_steps": args.warmup,
        "timed_steps": args.steps,
        "median_step_s": median,
        "step_s": times,
        "ratio_muon_over_adamw": median["muon"] / median["adamw"],
        "newton_schulz_gflop_per_step": ns_gflop,
        "muon_gflops_achieved": ns_gflop / median["muon"],
    }
    print(f"median s/step: adamw {median['adamw']:.4f}, muon {median['muon']:.4f}, "
          f"ratio {result['ratio_muon_over_adamw']:.1f}", flush=True)  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
