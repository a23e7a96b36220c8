"""What computing transformers' ``Zaya`` function exactly costs: CPU tokens/s of a training step, before and
after (issue 31), side by side.

Two source trees of zaya_pipeline: this checkout (after) and ``--before`` (a checkout of the commit before
the change, e.g. ``git worktree add /tmp/zaya-before 03afb78``). Each arm runs in its own process with
``PYTHONPATH=<tree>/src``, builds the same ZAYA1-architecture model (CCA with 2 key/value groups, the ZAYA1
router with EDA and the skip expert, top-1, residual scaling; the config keys both trees share) and times
forward + backward + AdamW steps on random tokens. The arms alternate (before, after, before, ...)
``--rounds`` times so that machine noise hits both; the JSON holds every round's tokens/s, the medians and
the ratio after / before per model size::

    python benchmarks/zaya_exact_cost.py --before /tmp/zaya-before
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_env import git_commit  # a sibling module (benchmarks/ is sys.path[0] when run as a script)

REPO = Path(__file__).resolve().parents[1]

# name -> (d_model, layers, query heads, kv heads, head width, experts, expert width, router width)
SIZES = {
    "tiny (ablation arm)": (128, 4, 4, 2, 16, 8, 256, 32),
    "d512": (512, 4, 8, 2, 64, 8, 512, 64),
}

# One arm: build the model from keys both trees know, time `steps` training steps after `warmup`.
ARM = r"""
import json, sys, time, torch
from zaya_pipeline.config import AttentionConfig, ModelConfig, MoEConfig, RouterConfig
from zaya_pipeline.model.transformer import ZayaLM
D, L, H, G, Hd, E, F, R = json.loads(sys.argv[1])
B, T, warmup, steps = json.loads(sys.argv[2])
torch.manual_seed(0)
cfg = ModelConfig(
    vocab_size=4096, d_model=D, n_layers=L, max_seq_len=T, residual_scaling=True,
    attention=AttentionConfig("cca", n_heads=H, n_kv_heads=G, head_dim=Hd, rope_fraction=0.5),
    moe=MoEConfig(num_experts=E, top_k=1, expert_hidden=F, skip_expert=True,
                  router=RouterConfig("zaya1", dim=R, aux_loss_coef=0.0)),
)
model = ZayaLM(cfg).train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
ids = torch.randint(0, 4096, (B, T + 1))
def step():
    out = model(ids[:, :-1])
    loss = torch.nn.functional.cross_entropy(out.logits.flatten(0, 1), ids[:, 1:].flatten())
    (loss + out.aux_loss).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    model.update_router_biases()
for _ in range(warmup):
    step()
t0 = time.perf_counter()
for _ in range(steps):
    step()
print(json.dumps({"tokens_per_s": B * T * steps / (time.perf_counter() - t0),
                  "params": sum(p.numel() for p in model.parameters())}))
"""


def run_arm(tree: Path, size: tuple, shape: list[int]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    cmd = [sys.executable, "-c", ARM, json.dumps(size), json.dumps(shape)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=tree)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True, help="a checkout of zaya_pipeline before the change")
    p.add_argument("--rounds", type=int, default=5, help="alternating before/after rounds per size")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=8, help="timed steps per round (after 3 warm-up steps)")
    p.add_argument("--out", default=str(REPO / "benchmarks/results/zaya_exact_cost.json"))
    args = p.parse_args(argv)
    trees = {"before": Path(args.before).resolve(), "after": REPO}
    shape = [args.batch, args.seq_len, 3, args.steps]
    result: dict = {
        "command": "python benchmarks/zaya_exact_cost.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "commit_after": git_commit(),
        "commit_before": subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=trees["before"], capture_output=True, text=True
        ).stdout.strip(),
        "cpu_count": os.cpu_count(),
        "batch_x_seq_len": [args.batch, args.seq_len],
        "sizes": {},
    }
    for name, size in SIZES.items():
        rounds = {"before": [], "after": []}
        params = {}
        for r in range(args.rounds):
            for arm, tree in trees.items():
                row = run_arm(tree, size, shape)
                rounds[arm].append(round(row["tokens_per_s"], 1))
                params[arm] = row["params"]
                print(f"[{name}] round {r + 1} {arm}: {row['tokens_per_s']:.0f} tokens/s", flush=True)
        med = {arm: statistics.median(v) for arm, v in rounds.items()}
        result["sizes"][name] = {
            "tokens_per_s": rounds,
            "median_tokens_per_s": med,
            "after_over_before": round(med["after"] / med["before"], 3),
            "params": params,
        }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v["after_over_before"] for k, v in result["sizes"].items()}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
