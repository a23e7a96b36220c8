"""Training throughput of the MoE against a dense model with equal active parameters, side by side.

The MoE is a ``model=<preset>`` ZayaLM (default ``tiny``: 8 experts, top-2, F=256). The dense baseline is
the same model with every MoE layer replaced by one SwiGLU MLP of width top_k * F: the same active FFN
parameters per token and the same attention, embeddings and norms, minus the router. Each arm does
forward + backward (next-token CE plus the routers' aux losses) on the same batch, and then the full step
with fused AdamW. Rounds run the arms alternately (A, B, A, B, ...), so machine noise hits both, and the
script reports medians::

    python benchmarks/moe_vs_dense.py --batch 32 --seq-len 256 --out benchmarks/results/moe_vs_dense_cpu.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from bench_env import (  # a sibling module (benchmarks/ is sys.path[0] when run as a script)
    device_name,
    git_commit,
)

REPO = Path(__file__).resolve().parents[1]


class DenseFFN(nn.Module):
    """A SwiGLU MLP in the MoE layer's place, returning what the block expects from it."""

    def __init__(self, d_model: int, hidden: int, num_experts: int):
        super().__init__()
        self.gate_up = nn.Linear(d_model, 2 * hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)
        self.num_experts = num_experts

    def forward(self, x_BTD, router_state_TR=None):
        from zaya_pipeline.model.moe import MoEOutput

        gate, up = self.gate_up(x_BTD).chunk(2, dim=-1)
        zero = x_BTD.new_zeros(())
        counts = torch.zeros(self.num_experts, device=x_BTD.device)
        return MoEOutput(self.down(F.silu(gate) * up), zero, counts, zero, None, zero)


def build_models(preset: str, vocab: int, backend: str):
    from zaya_pipeline.config import load_config
    from zaya_pipeline.model.transformer import ZayaLM

    cfg = load_config([f"model={preset}", f"model.vocab_size={vocab}", f"model.moe.expert_backend={backend}"])
    torch.manual_seed(0)
    moe = ZayaLM(cfg.model)
    torch.manual_seed(0)
    dense = ZayaLM(cfg.model)
    m = cfg.model.moe
    for block in dense.blocks:
        block.moe = DenseFFN(cfg.model.d_model, m.top_k * m.expert_hidden, m.num_experts)
        nn.init.normal_(block.moe.gate_up.weight, std=cfg.model.init_std)
        nn.init.normal_(block.moe.down.weight, std=cfg.model.init_std / (2 * cfg.model.n_layers) ** 0.5)
    return cfg, moe, dense


def active_params(model: nn.Module, cfg) -> int:
    """Parameters a token uses: everything except the routed experts it does not visit."""
    total = sum(p.numel() for p in model.parameters())
    m = cfg.model.moe
    experts = sum(
        p.numel() for name, p in model.named_parameters() if ".experts." in name
    )  # only in the MoE model
    return total - experts + experts * m.top_k // m.num_experts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="tiny", help="model preset (default: %(default)s)")
    parser.add_argument("--backend", default="auto", help="model.moe.expert_backend (default: %(default)s)")
    parser.add_argument("--batch", type=int, default=32, help="sequences per step (default: %(default)s)")
    parser.add_argument("--seq-len", type=int, default=256, help="tokens per sequence (default: %(default)s)")
    parser.add_argument("--vocab", type=int, default=4096, help="vocabulary size (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=7, help="timed rounds per arm (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks/results/moe_vs_dense_cpu.json")
    args = parser.parse_args(argv)
    from zaya_pipeline.utils import keep_freed_memory

    keep_freed_memory()  # as zaya train does
    cfg, moe, dense = build_models(args.preset, args.vocab, args.backend)
    ids = torch.randint(
        0, args.vocab, (args.batch, args.seq_len + 1), generator=torch.Generator().manual_seed(1)
    )
    arms = {"moe": moe, "dense": dense}
    opts = {name: torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True) for name, m in arms.items()}

    def fwd_bwd(model):
        out = model(ids[:, :-1])
        loss = F.cross_entropy(out.logits.flatten(0, 1).float(), ids[:, 1:].flatten()) + out.aux_loss
        loss.backward()

    times = {f"{n}/{kind}": [] for n in arms for kind in ("fwd_bwd", "step")}
    for r in range(args.warmup + args.rounds):
        for name, model in arms.items():
            model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            fwd_bwd(model)
            t1 = time.perf_counter()
            opts[name].step()
            t2 = time.perf_counter()
            if r >= args.warmup:
                times[f"{name}/fwd_bwd"].append(t1 - t0)
                times[f"{name}/step"].append(t2 - t0)
        print(f"round {r + 1}/{args.warmup + args.rounds}: " + ", ".join(
            f"{k} {v[-1] * 1e3:.0f} ms" for k, v in times.items() if v), flush=True)  # fmt: skip
    tokens = args.batch * args.seq_len
    med = {k: statistics.median(v) for k, v in times.items()}
    result = {
        "benchmark": "moe_vs_dense",
        "command": shlex.join(
            ["python", "benchmarks/moe_vs_dense.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "date": dt.date.today().isoformat(),
        "commit": git_commit(),
        "device": device_name(torch.device("cpu")),
        "torch": torch.__version__,
        "preset": args.preset,
        "expert_backend": args.backend,
        "tokens_per_step": tokens,
        "params": {
            "moe_total": sum(p.numel() for p in moe.parameters()),
            "moe_active": active_params(moe, cfg),
            "dense_total": sum(p.numel() for p in dense.parameters()),
        },
        "median_s": med,
        "tokens_per_s": {k: tokens / v for k, v in med.items()},
        "ratio_moe_to_dense": {
            "fwd_bwd": med["moe/fwd_bwd"] / med["dense/fwd_bwd"],
            "step": med["moe/step"] / med["dense/step"],
        },
        "times_s": times,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    p = result["params"]
    print(f"params: moe {p['moe_total']:,} total / {p['moe_active']:,} active, dense {p['dense_total']:,}")
    for kind in ("fwd_bwd", "step"):
        print(
            f"{kind:8s} moe {med[f'moe/{kind}'] * 1e3:7.1f} ms ({tokens / med[f'moe/{kind}']:,.0f} tok/s)  "
            f"dense {med[f'dense/{kind}'] * 1e3:7.1f} ms  ratio {result['ratio_moe_to_dense'][kind]:.2f}"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
