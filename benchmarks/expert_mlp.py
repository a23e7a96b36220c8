"""Expert MLP forward+backward per backend, against a dense GEMM bound with the same FLOPs.

Each backend of ``zaya_pipeline.ops.expert_mlp`` runs ``y = expert_mlp(x, ids, w, w_gate_up, w_down)`` and
``y.backward(grad)`` on random, near-uniformly balanced routing (a seeded top-k of random scores; the
weights are the softmax router probabilities of the chosen experts). The dense bound is the same work as
perfectly balanced batched matmuls: S = T*K rows split evenly over E experts, timed as exactly the 6 bmm
calls of forward and backward (x@Wgu, a@Wd; dA=dY@Wd^T, dWd=a^T@dY, dX=dH@Wgu^T, dWgu=x^T@dH) on
preallocated tensors, with no elementwise work. FLOPs: 6*S*D*F forward, twice that backward, 18*S*D*F in
all. Rounds are interleaved (round r runs every arm once) so that machine noise hits all arms alike; the
claims use medians. Per backend the JSON also holds the bytes saved for backward (all devices), the peak
allocated memory over one forward+backward (cuda), and the max relative error of y and the four gradients
against the ``loop`` backend::

    python benchmarks/expert_mlp.py --shape cpu --out benchmarks/results/expert_mlp_cpu.json
    python benchmarks/expert_mlp.py --device cuda --shape zaya1

On CPU ``triton`` runs under the Triton interpreter (very slow): it is left out unless ``--interpreter``
is given (or it is named in ``--backends``); use a tiny shape with it.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from bench_env import (  # a sibling module (benchmarks/ is sys.path[0] when run as a script)
    device_name,
    git_commit,
    version_of,
)

REPO = Path(__file__).resolve().parents[1]
SHAPES = {  # preset -> tokens, d_model, hidden, experts, top_k, dtype
    "cpu": {"tokens": 4096, "d_model": 512, "hidden": 512, "experts": 16, "top_k": 1, "dtype": "fp32"},
    "zaya1": {"tokens": 16384, "d_model": 2048, "hidden": 2048, "experts": 16, "top_k": 1, "dtype": "bf16"},
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
GRAD_NAMES = ("x", "topk_weights", "w_gate_up", "w_down")
MIB = 2**20


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    default_device = "cuda" if torch.cuda.is_available() else "cpu"
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda"],
        default=default_device,
        help="where to run (default: cuda if available, else cpu; ROCm is 'cuda')",
    )
    parser.add_argument(
        "--shape",
        choices=list(SHAPES),
        default=None,
        help="shape preset: cpu = T4096 D512 F512 E16 K1 fp32, zaya1 = T16384 D2048 F2048 "
        "E16 K1 bf16 (default: zaya1 on cuda, cpu on cpu); the flags below override it",
    )
    parser.add_argument("--tokens", type=int, help="T, tokens")
    parser.add_argument("--d-model", type=int, help="D, model width")
    parser.add_argument("--hidden", type=int, help="F, expert hidden width")
    parser.add_argument("--experts", type=int, help="E, number of experts")
    parser.add_argument("--top-k", type=int, help="K, experts per token")
    parser.add_argument("--dtype", choices=list(DTYPES), help="dtype of activations and weights")
    parser.add_argument(
        "--backends",
        default=None,
        help="comma-separated backends (default: available_backends(device, dtype), without "
        "triton on cpu unless --interpreter)",
    )
    parser.add_argument(
        "--interpreter",
        action="store_true",
        help="on cpu, include triton (runs under TRITON_INTERPRET=1: extremely slow)",
    )
    parser.add_argument("--repeats", type=int, default=9, help="timed rounds (default: %(default)s)")
    parser.add_argument(
        "--warmup", type=int, default=2, help="untimed runs per arm first (default: %(default)s)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the inputs and routing (default: 0)")
    parser.add_argument(
        "--malloc",
        choices=["keep", "default"],
        default="keep",
        help="keep: glibc keeps freed blocks (utils.keep_freed_memory, what `zaya train` does); "
        "default: glibc's own thresholds (default: %(default)s)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON path (default: benchmarks/results/expert_mlp_<device>.json)",
    )
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA/ROCm device")
    args.shape = args.shape or ("zaya1" if args.device == "cuda" else "cpu")
    for key, value in SHAPES[args.shape].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if min(args.tokens, args.d_model, args.hidden, args.experts, args.top_k) < 1:
        parser.error("sizes must be positive")
    if args.top_k > args.experts:
        parser.error("--top-k cannot exceed --experts")
    if args.repeats < 1 or args.warmup < 0:
        parser.error("--repeats must be >= 1 and --warmup >= 0")
    args.out = args.out or REPO / f"benchmarks/results/expert_mlp_{args.device}.json"
    return args


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_inputs(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> dict:
    """x, ids, weights, w_gate_up, w_down (all float ones leaves with requires_grad) and the fixed grad."""
    T, D, F_, E, K = args.tokens, args.d_model, args.hidden, args.experts, args.top_k
    gen = torch.Generator(device=device).manual_seed(args.seed)

    def randn(*shape, std=1.0):
        t = torch.randn(*shape, generator=gen, device=device, dtype=torch.float32) * std
        return t.to(dtype).requires_grad_()

    # iid scores: every expert is equally likely, so the loads are multinomial, close to T*K/E each.
    scores_TE = torch.randn(T, E, generator=gen, device=device)
    probs_TK, ids_TK = scores_TE.softmax(-1).topk(K, dim=-1)
    return {
        "x": randn(T, D),
        "ids": ids_TK,
        "topk_weights": probs_TK.to(dtype).requires_grad_(),
        "w_gate_up": randn(E, D, 2 * F_, std=D**-0.5),
        "w_down": randn(E, F_, D, std=F_**-0.5),
        "grad": torch.randn(T, D, generator=gen, device=device).to(dtype),
    }


def backend_step(name: str, inp: dict) -> tuple[Callable[[], torch.Tensor], Callable[[], torch.Tensor]]:
    """(forward, step): ``forward()`` returns y; ``step()`` clears the grads, runs forward and backward."""
    from zaya_pipeline.ops import expert_mlp

    leaves = [inp[k] for k in GRAD_NAMES]

    def forward() -> torch.Tensor:
        return expert_mlp(
            inp["x"], inp["ids"], inp["topk_weights"], inp["w_gate_up"], inp["w_down"], backend=name
        )

    def step() -> torch.Tensor:
        for t in leaves:
            t.grad = None
        y = forward()
        y.backward(inp["grad"])
        return y

    return forward, step


def dense_step(args: argparse.Namespace, device: torch.device, dtype: torch.dtype) -> tuple[Callable, int]:
    """The 6 bmm calls of a balanced forward+backward on preallocated tensors; returns (step, rows)."""
    D, F_, E = args.d_model, args.hidden, args.experts
    N = max(args.tokens * args.top_k // E, 1)
    gen = torch.Generator(device=device).manual_seed(args.seed + 1)

    def buf(*shape):
        return torch.randn(*shape, generator=gen, device=device).to(dtype)

    x, wgu, wd = buf(E, N, D), buf(E, D, 2 * F_) * D**-0.5, buf(E, F_, D) * F_**-0.5
    a, dy, dh = buf(E, N, F_), buf(E, N, D), buf(E, N, 2 * F_)
    h, y, da = (
        torch.empty(E, N, 2 * F_, device=device, dtype=dtype),
        torch.empty_like(dy),
        torch.empty_like(a),
    )
    dwd, dx, dwgu = torch.empty_like(wd), torch.empty_like(x), torch.empty_like(wgu)

    def step() -> None:
        torch.bmm(x, wgu, out=h)  # forward
        torch.bmm(a, wd, out=y)
        torch.bmm(dy, wd.transpose(1, 2), out=da)  # backward
        torch.bmm(a.transpose(1, 2), dy, out=dwd)
        torch.bmm(dh, wgu.transpose(1, 2), out=dx)
        torch.bmm(x.transpose(1, 2), dh, out=dwgu)

    return step, E * N


def timed(step: Callable, device: torch.device) -> float:
    sync(device)
    t0 = time.perf_counter()
    step()
    sync(device)
    return time.perf_counter() - t0


def rel_err(a: torch.Tensor | None, b: torch.Tensor | None) -> float | None:
    if a is None or b is None:
        return None
    a, b = a.detach().float(), b.detach().float()
    scale = b.abs().max().item()
    diff = (a - b).abs().max().item()
    return diff / scale if scale > 0 else diff


def measure_pass(forward: Callable, inp: dict, device: torch.device) -> dict:
    """One forward+backward: saved-for-backward bytes, peak memory (cuda) and the outputs for parity."""
    from zaya_pipeline.profiling import saved_activation_bytes

    for k in GRAD_NAMES:
        inp[k].grad = None
    inputs = [inp[k] for k in ("x", "ids", "topk_weights", "w_gate_up", "w_down")]
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    y, saved = saved_activation_bytes(forward, inputs)
    y.backward(inp["grad"])
    out = {"saved_mib": saved / MIB}
    if device.type == "cuda":
        sync(device)
        out["peak_mib"] = (torch.cuda.max_memory_allocated(device) - base) / MIB
    tensors = {"y": y.detach(), **{k: inp[k].grad for k in GRAD_NAMES}}
    for k in GRAD_NAMES:
        inp[k].grad = None
    return out | {"tensors": tensors}


def short_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:300]


def print_table(result: dict) -> None:
    cols = ("arm", "median ms", "min ms", "TFLOP/s", "x dense", "saved MiB", "peak MiB", "max rel err")
    rows = []
    dense = result["dense_bound"]
    rows.append(
        ("dense bound", dense["median_s"] * 1e3, dense["min_s"] * 1e3, dense["tflops"], 1.0, None, None, None)
    )
    for name, r in result["backends"].items():
        if "error" in r:
            rows.append((name, f"skipped: {r['error']}"))
            continue
        worst = max((v for v in r["parity"].values() if v is not None), default=None)
        rows.append(
            (
                name,
                r["median_s"] * 1e3,
                r["min_s"] * 1e3,
                r["tflops"],
                r["ratio_to_dense"],
                r["saved_mib"],
                r.get("peak_mib"),
                worst,
            )
        )

    def cell(v, i):
        if v is None:
            return "-"
        if isinstance(v, str):
            return v
        return f"{v:.2e}" if i == 7 else f"{v:.3f}" if i == 3 else f"{v:.2f}"

    widths = [max(len(cols[i]), 12 if i == 0 else 10) for i in range(len(cols))]
    print(
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cols, widths, strict=True)))
    )
    for row in rows:
        if len(row) == 2:
            print(f"{row[0].ljust(widths[0])}  {row[1]}")
            continue
        print(
            "  ".join(
                cell(v, i).rjust(w) if i else v.ljust(w)
                for i, (v, w) in enumerate(zip(row, widths, strict=True))
            )
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device, dtype = torch.device(args.device), DTYPES[args.dtype]
    if args.malloc == "keep":
        from zaya_pipeline.utils import keep_freed_memory

        keep_freed_memory()
    from zaya_pipeline.ops import available_backends

    if args.backends:
        backends = [b.strip() for b in args.backends.split(",") if b.strip()]
        known = available_backends(device, dtype)
        unknown = [b for b in backends if b not in known]
        if unknown:
            print(
                f"error: backends {unknown} not available on {device.type}/{args.dtype}; choose from {known}"
            )
            return 2
    else:
        backends = [
            b
            for b in available_backends(device, dtype)
            if device.type != "cpu" or b != "triton" or args.interpreter
        ]
    if device.type == "cpu" and "triton" in backends:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton
        print("note: triton on cpu runs under the Triton interpreter: expect it to be very slow", flush=True)

    T, D, F_, E, K = args.tokens, args.d_model, args.hidden, args.experts, args.top_k
    S = T * K
    flops = 18 * S * D * F_
    inp = make_inputs(args, device, dtype)
    loads = torch.bincount(inp["ids"].reshape(-1), minlength=E)
    print(
        f"expert_mlp T={T} D={D} F={F_} E={E} K={K} {args.dtype} on {device_name(device)}; "
        f"{flops / 1e9:.1f} GFLOP per forward+backward; "
        f"expert loads {loads.min().item()}..{loads.max().item()} "
        f"(mean {S / E:.0f}); backends {backends}",
        flush=True,
    )

    # The loop backend is the parity reference; it runs once even when it is not benchmarked.
    arms: dict[str, Callable] = {}
    results: dict[str, dict] = {}
    reference = None
    for name in dict.fromkeys(["loop", *backends]):
        forward, step = backend_step(name, inp)
        try:
            measured = measure_pass(forward, inp, device)
        except Exception as exc:  # e.g. triton not importable / kernels missing: skip it, keep the rest
            print(f"skipping {name}: {short_error(exc)}", flush=True)
            if os.environ.get("ZAYA_BENCH_TRACEBACK"):
                traceback.print_exc()
            results[name] = {"error": short_error(exc)}
            continue
        tensors = measured.pop("tensors")
        if name == "loop":
            reference = tensors
        if name in backends:
            parity = {k: rel_err(tensors[k], reference[k]) if reference else None for k in tensors}
            results[name] = measured | {"parity": parity}
            arms[name] = step
        del tensors
    dense, dense_rows = dense_step(args, device, dtype)
    dense_flops = 18 * dense_rows * D * F_
    arms["dense bound"] = dense

    for name, step in arms.items():
        for i in range(args.warmup):
            print(f"warm-up {name} {i + 1}/{args.warmup}: {timed(step, device) * 1e3:.1f} ms", flush=True)
    times: dict[str, list[float]] = {name: [] for name in arms}
    for r in range(args.repeats):
        for name, step in arms.items():
            times[name].append(timed(step, device))
        print(
            f"round {r + 1}/{args.repeats}: "
            + ", ".join(f"{n} {ts[-1] * 1e3:.1f} ms" for n, ts in times.items()),
            flush=True,
        )

    dense_median = statistics.median(times["dense bound"])
    dense_result = {
        "what": f"6 bmm calls, {E} x ({dense_rows // E} rows), preallocated, no elementwise ops",
        "rows": dense_rows,
        "flops": dense_flops,
        "median_s": dense_median,
        "min_s": min(times["dense bound"]),
        "tflops": dense_flops / dense_median / 1e12,
        "times_s": times["dense bound"],
    }
    for name in backends:
        if "error" in results[name]:
            continue
        median = statistics.median(times[name])
        results[name] = {
            "median_s": median,
            "min_s": min(times[name]),
            "tflops": flops / median / 1e12,
            "ratio_to_dense": median / dense_median,
            **results[name],
            "times_s": times[name],
        }
    ok = {n: r for n, r in results.items() if n in backends and "error" not in r}
    best = min(ok, key=lambda n: ok[n]["median_s"]) if ok else None
    command = ["python", "benchmarks/expert_mlp.py", *(sys.argv[1:] if argv is None else argv)]
    result = {
        "benchmark": "expert_mlp",
        "command": shlex.join(command),
        "date": dt.date.today().isoformat(),
        "commit": git_commit(),
        "device": device_name(device),
        "torch": torch.__version__,
        "triton": version_of("triton"),
        "hip": torch.version.hip,
        "malloc": args.malloc,
        "shape": {
            "preset": args.shape,
            "tokens": T,
            "d_model": D,
            "hidden": F_,
            "experts": E,
            "top_k": K,
            "dtype": args.dtype,
            "routed_rows": S,
        },
        "routing": {
            "what": "top-k of iid normal scores; weights = the chosen experts' softmax router probabilities",
            "seed": args.seed,
            "expert_loads": loads.tolist(),
        },
        "repeats": args.repeats,
        "warmup": args.warmup,
        "flops": flops,
        "dense_bound": dense_result,
        "memory_note": "saved_mib: distinct storages saved for backward beyond the inputs and weights; "
        "peak_mib (cuda): max_memory_allocated over one forward+backward minus what was allocated "
        "before (so it includes y and the four gradients)",
        "parity_note": "max|a - b| / max|b| against the loop backend, per output",
        "backends": {n: results[n] for n in backends},
        "best_backend": best,
        "best_ratio_to_dense": ok[best]["ratio_to_dense"] if best else None,
    }
    print()
    print_table(result)
    if best:
        print(
            f"best: {best}, median {ok[best]['median_s'] * 1e3:.2f} ms = "
            f"{result['best_ratio_to_dense']:.2f} x the dense bound",
            flush=True,
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
