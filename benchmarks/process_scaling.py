"""Training throughput of 1 process against 2 processes (FSDP2, and FSDP2 x EP=2), side by side.

Each arm is a real ``zaya train`` run (the CLI, Lightning, gloo on CPU) on the same token shards with the
same global batch; its figure is ``tokens_per_s`` from reports/train.json (the median over log intervals,
validation excluded). Rounds run the arms in turn (A, B, C, A, B, C, ...), so machine noise hits all of
them, and the script reports medians and the ratio to the one-process arm. Threads are split so that every
arm uses all ``--cores``: one process gets all of them, each of 2 processes half::

    python benchmarks/process_scaling.py --tokens data/tokens --rounds 3 \
        --out benchmarks/results/process_scaling_cpu.json

On a 2-core CPU this measures the cost of the parallel machinery (gloo collectives, FSDP all-gathers and
reduce-scatters, the expert all-to-all) against intra-op threading, not a speed-up: 2 processes cannot
beat 1 process using both cores. On GPUs, the same arms with ``--accelerator gpu`` compare 1 and 2 devices.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_env import git_commit  # a sibling module (benchmarks/ is sys.path[0] when run as a script)

REPO = Path(__file__).resolve().parents[1]

ARMS = {  # name: (processes, overrides)
    "1proc": (1, []),
    "2proc_fsdp2": (2, ["parallel=fsdp2_ep2", "parallel.ep=1"]),
    "2proc_fsdp2_ep2": (2, ["parallel=fsdp2_ep2"]),
}


def run_arm(name: str, args, root: Path) -> float:
    world, overrides = ARMS[name]
    threads = max(1, args.cores // world)
    cmd = [
        sys.executable, "-m", "zaya_pipeline.cli", "train",
        f"model={args.model}", "train=debug",
        f"train.max_steps={args.steps}", f"train.seq_len={args.seq_len}",
        f"train.global_batch={args.global_batch}", f"train.micro_batch={args.global_batch // world}",
        f"train.log_every={args.log_every}", f"train.val_every={args.steps}", "train.val_batches=1",
        f"train.num_threads={threads}", f"parallel.accelerator={args.accelerator}",
        f"paths.tokens={Path(args.tokens).resolve()}", f"paths.train={root}/train",
        f"paths.reports={root}/reports", f"registry.tracking_uri=sqlite:///{root}/mlflow.db",
        *overrides,
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=root, env=env, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
    return json.loads((root / "reports" / "train.json").read_text())["tokens_per_s"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", default="data/tokens", help="token shards (the tokenize stage's output)")
    p.add_argument("--model", default="tiny")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--log-every", type=int, default=5)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--global-batch", type=int, default=32, help="sequences per step (>= 8k tokens)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {list(ARMS)}")
    p.add_argument("--out", default="benchmarks/results/process_scaling_cpu.json")
    args = p.parse_args()
    arms = args.arms.split(",")
    if unknown := set(arms) - set(ARMS):
        p.error(f"--arms: unknown {sorted(unknown)}; choose from {list(ARMS)}")
    if not (Path(args.tokens) / "meta.json").is_file():
        p.error(f"--tokens {args.tokens}: no meta.json (run `dvc repro tokenize` or point at token shards)")

    results: dict[str, list[float]] = {name: [] for name in arms}
    for r in range(args.rounds):
        for name in arms:
            with tempfile.TemporaryDirectory() as tmp:
                results[name].append(run_arm(name, args, Path(tmp)))
            print(f"round {r + 1}/{args.rounds}  {name:<16} {results[name][-1]:>9.0f} tokens/s", flush=True)
    medians = {name: statistics.median(v) for name, v in results.items()}
    base = medians.get("1proc")
    report = {
        "benchmark": "process_scaling",
        "date": dt.date.today().isoformat(),
        "commit": git_commit(),
        "command": shlex.join([sys.executable, *sys.argv]),
        "cores": args.cores,
        "model": args.model,
        "tokens_per_step": args.global_batch * args.seq_len,
        "tokens_per_s": results,
        "median_tokens_per_s": medians,
        "ratio_to_1proc": {n: m / base for n, m in medians.items()} if base else None,
    }
    out = REPO / args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    for name, m in medians.items():
        ratio = f"  {m / base:.2f}x 1proc" if base else ""
        print(f"{name:<16} median {m:>9.0f} tokens/s{ratio}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
