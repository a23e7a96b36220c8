"""Compiled vs eager training step on a CPU: a ZAYA1-width model (d_model 2048, 16 experts of 2048, top-1,
CCA attention, ZAYA1 router; ``model=zaya1_base``) cut to ``--layers`` layers, each block compiled as one
graph (``compile_blocks(fullgraph=True)``, inductor) against the same model eager.

Per arm: tokens/s (median over interleaved rounds: eager, compiled, eager, ... so drift hits both), the
graph breaks of one block (``torch._dynamo.explain``), and the ops of one training step: aten ops dispatched
(eager: every op; compiled: the ops inductor leaves outside its fused kernels, e.g. the GEMMs and our expert
custom op) plus the fused kernels inductor generated::

    python benchmarks/compile_cpu.py --out benchmarks/results/compile_cpu.json
"""

from __future__ import annotations

import argparse
import collections
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


def count_ops(step) -> collections.Counter:
    """aten ops of one call of ``step`` that no other aten op called (the profiler's outermost ones): in
    eager every op the Python code runs; compiled, those inductor left outside its fused kernels."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    seen: collections.Counter = collections.Counter()
    for event in prof.events():
        parent = event.cpu_parent
        while parent is not None and not parent.name.startswith("aten::"):
            parent = parent.cpu_parent
        if event.name.startswith("aten::") and parent is None:
            seen[event.name] += 1
    return seen


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="zaya1_base")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (one timed step per arm each)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per arm after the first")
    p.add_argument("--out", default="")
    args = p.parse_args()

    from zaya_pipeline.config import load_config
    from zaya_pipeline.model.sizing import forward_flops_per_token
    from zaya_pipeline.model.transformer import ZayaLM, compile_blocks

    overrides = [f"model={args.model}", f"model.n_layers={args.layers}", f"model.vocab_size={args.vocab}"]
    cfg = load_config([*overrides, f"model.max_seq_len={args.seq_len}"]).model
    ids = torch.randint(
        0, args.vocab, (args.batch, args.seq_len + 1), generator=torch.Generator().manual_seed(0)
    )
    # fused kernels: compile one block afresh and count what inductor generates for it (forward + backward)
    from torch._inductor import metrics as inductor_metrics

    inductor_metrics.reset()
    probe = ZayaLM(cfg).train()
    compile_blocks(probe, fullgraph=True)
    with torch._inductor.config.patch(force_disable_caches=True):  # a cache hit would generate nothing
        out = probe(ids[:, :-1])
        (out.logits.float().square().mean() + out.aux_loss).backward()
    generated = inductor_metrics.generated_kernel_count + inductor_metrics.generated_cpp_vec_kernel_count
    kernels_per_block = generated // max(args.layers, 1)
    explain = torch._dynamo.explain(ZayaLM(cfg).train().blocks[0])(probe.embed(ids[:, :-1]).detach())
    torch._dynamo.reset()  # explain and the probe leave compiled code behind; the arms start clean
    del probe, out  # memory for the two arms

    arms = {}
    for name in ("eager", "compiled"):
        torch.manual_seed(0)
        model = ZayaLM(cfg).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        if name == "compiled":
            compile_blocks(model, fullgraph=True)

        def step(model=model, opt=opt) -> float:
            out = model(ids[:, :-1])
            loss = F.cross_entropy(out.logits.flatten(0, 1).float(), ids[:, 1:].flatten()) + out.aux_loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            model.update_router_biases()
            return loss.item()

        t0 = time.perf_counter()
        first_loss = step()  # compiles (forward and backward graphs)
        warm_s = time.perf_counter() - t0
        for _ in range(args.warmup):
            step()
        arms[name] = {
            "model": model,
            "step": step,
            "times": [],
            "first_step_s": warm_s,
            "first_loss": first_loss,
        }
        print(f"{name}: first step {warm_s:.1f} s (loss {first_loss:.4f})", flush=True)

    for r in range(args.rounds):
        for arm in arms.values():
            t0 = time.perf_counter()
            arm["step"]()
            arm["times"].append(time.perf_counter() - t0)
        print(
            f"round {r + 1}/{args.rounds}: "
            + ", ".join(f"{n} {a['times'][-1]:.2f} s" for n, a in arms.items())
        )
    for arm in arms.values():  # after the timing: the profiler must not disturb it
        ops = count_ops(arm["step"])
        arm["aten_ops_per_step"] = sum(ops.values())
        arm["top_ops"] = dict(ops.most_common(8))
    tokens = args.batch * args.seq_len
    result = {
        "benchmark": "compile_cpu",
        "date": dt.date.today().isoformat(),
        "commit": git_commit(),
        "command": shlex.join([sys.executable, *sys.argv]),
        "device": device_name(torch.device("cpu")),
        "threads": torch.get_num_threads(),
        "model": {
            "preset": args.model,
            "n_layers": args.layers,
            "d_model": cfg.d_model,
            "experts": cfg.moe.num_experts,
            "top_k": cfg.moe.top_k,
            "expert_hidden": cfg.moe.expert_hidden,
            "attention": cfg.attention.type,
            "router": cfg.moe.router.type,
        },  # fmt: skip
        "tokens_per_step": tokens,
        "train_flops_per_token": 3 * forward_flops_per_token(cfg, args.seq_len),
        "graph_breaks_per_block": explain.graph_break_count,
        "graphs_per_block": explain.graph_count,
        "fused_kernels_per_block": kernels_per_block,
        "arms": {},
    }
    for name, arm in arms.items():
        median = statistics.median(arm["times"])
        result["arms"][name] = {
            "step_s_median": median,
            "step_s": arm["times"],
            "tokens_per_s": tokens / median,
            "first_step_s": arm["first_step_s"],
            "first_loss": arm["first_loss"],
            "aten_ops_per_step": arm["aten_ops_per_step"],
            "top_ops": arm["top_ops"],
        }
    eager, compiled = result["arms"]["eager"], result["arms"]["compiled"]
    result["speedup"] = eager["step_s_median"] / compiled["step_s_median"]
    result["first_loss_rel_diff"] = abs(compiled["first_loss"] - eager["first_loss"]) / abs(
        eager["first_loss"]
    )
    print(
        f"eager {eager['tokens_per_s']:.0f} tokens/s, {eager['aten_ops_per_step']} aten ops/step; compiled "
        f"{compiled['tokens_per_s']:.0f} tokens/s, {compiled['aten_ops_per_step']} aten ops/step + "
        f"{kernels_per_block} fused kernels per block; {result['graph_breaks_per_block']} graph breaks; "
        f"speedup {result['speedup']:.2f}x"
    )
    if args.out:
        out = REPO / args.out
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
