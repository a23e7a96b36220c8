"""Static report of the expert kernels: every ``@triton.jit`` kernel x every config of its tuning table x the
GPU targets, compiled ahead of time on this machine (no GPU needed; Triton's wheel carries the AMD and NVIDIA
backends and ptxas).

Each variant is compiled with the specialisation a real launch gets: ``capture_launches`` runs the triton
backend's forward and backward on empty CPU tensors of a model's shapes, with every kernel replaced by a
recorder, so the arguments (pointers, strides, sizes, constexprs) are exactly those of
``ops.triton_expert_mlp``; Triton's own binder then derives the 16-byte divisibility and stride-1
specialisations from them. Per variant: registers, spills, LDS / shared bytes against the target's limit,
occupancy, the matrix instructions (v_mfma / wgmma / mma) and their count, compile time.

``zaya kernels`` (``--help``) writes the JSON and a Markdown table; ``--check`` exits nonzero when a variant
spills, exceeds its target's LDS / shared memory or runs a GEMM without matrix instructions. A variant that
does not compile is an error, never a skip.

Target facts (bytes of LDS / shared memory one workgroup may use, registers): CDNA3 gfx942 (MI300X) and
CDNA2 gfx90a (MI250X) 64 KiB LDS per CU; CDNA4 gfx950 (MI355X) 160 KiB; sm_90 (H100/H200) 227 KiB opt-in per
block of 228 KiB per SM; sm_80 (A100) 163 KiB of 164 KiB. AMD occupancy is the compiler's waves per SIMD
(``; Occupancy``); NVIDIA's is CTAs per SM from registers, shared memory and threads.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if (
    os.environ.get("TRITON_INTERPRET") == "1"
):  # jit functions would be interpreter objects: nothing to compile
    raise ImportError("zaya_pipeline.kernel_report compiles for GPU targets: unset TRITON_INTERPRET first")

import torch  # noqa: E402
import triton  # noqa: E402  (imported before ops.triton_expert_mlp, so that it stays off the interpreter)
from triton import knobs  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.compiler.compiler import make_backend  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

from zaya_pipeline.kernels import configs as tables  # noqa: E402
from zaya_pipeline.kernels import expert_mlp as kernels  # noqa: E402


@dataclass(frozen=True)
class Target:
    name: str  # as the compiler calls it: gfx942, sm_90
    gpus: str
    vendor: str  # "rocm" | "cuda": which tuning table runs there
    arch: str | int
    warp_size: int
    shared_limit: int  # bytes of LDS / shared memory one workgroup may use
    shared_per_cu: int  # bytes per CU / SM (NVIDIA occupancy)
    xcds: int = 1  # dies with their own L2 (the row-tiled GEMMs' NUM_XCDS constexpr on this target)

    def gpu_target(self) -> GPUTarget:
        return GPUTarget("hip" if self.vendor == "rocm" else "cuda", self.arch, self.warp_size)


TARGETS = {
    t.name: t
    for t in (
        Target("gfx942", "MI300X", "rocm", "gfx942", 64, 64 * 1024, 64 * 1024, xcds=8),
        Target("gfx950", "MI355X", "rocm", "gfx950", 64, 160 * 1024, 160 * 1024, xcds=8),
        Target("gfx90a", "MI250X", "rocm", "gfx90a", 64, 64 * 1024, 64 * 1024),
        Target("sm_90", "H100/H200", "cuda", 90, 32, 227 * 1024, 228 * 1024),
        Target("sm_80", "A100", "cuda", 80, 32, 163 * 1024, 164 * 1024),
    )
}
# model config -> (tokens of one micro-batch, for the divisibility of the sizes, and the conf/model file)
SHAPES = {"zaya1_base": 8192, "small": 8192}
_MATRIX_INSTR = {  # target vendor -> (assembly key, regex of one matrix instruction)
    "rocm": ("amdgcn", re.compile(r"^\s*(v_mfma_\w+)", re.M)),
    "cuda": ("ptx", re.compile(r"^\s*((?:wgmma\.mma_async|mma\.sync)[\w.]*)", re.M)),
}
GEMM_KERNELS = ("gate_up", "grouped_gemm", "down_bwd", "grouped_dw")


@dataclass
class Launch:
    """One kernel launch of the triton backend: the jit function, its arguments and its constexprs (the
    tuning config's block sizes left out for autotuned kernels)."""

    kernel: str  # "gate_up", "grouped_gemm", ...
    role: str  # what this launch computes
    fn: Any
    args: tuple
    kwargs: dict
    autotuned: bool


@dataclass
class Variant:
    kernel: str
    role: str
    config: str  # "128x128x64 w8 s3 ..." or "-" for kernels without a table
    target: str
    shapes: list[str] = field(default_factory=list)
    ok: bool = False
    error: str = ""
    registers: int = 0  # NVIDIA: per thread; AMD: VGPRs + AGPRs per lane
    spill_bytes: int = 0  # NVIDIA: spill stores; AMD: scratch bytes per lane when VGPRs spill
    spilled_regs: int = 0  # AMD: VGPRs + SGPRs spilled
    shared_bytes: int = 0
    shared_limit: int = 0
    occupancy: int = 0  # AMD: waves per SIMD; NVIDIA: CTAs per SM
    matrix_instr: dict[str, int] = field(default_factory=dict)
    compile_s: float = 0.0

    @property
    def problems(self) -> list[str]:
        found = []
        if not self.ok:
            return [f"does not compile: {self.error}"]
        if self.spill_bytes or self.spilled_regs:
            found.append(f"spills ({self.spill_bytes} B, {self.spilled_regs} registers)")
        if self.shared_bytes > self.shared_limit:
            found.append(
                f"needs {self.shared_bytes} B of LDS/shared memory, over the {self.shared_limit} B limit"
            )
        if self.kernel in GEMM_KERNELS and not self.matrix_instr:
            found.append("uses no matrix instructions")
        return found


# ---- capturing the launches ---------------------------------------------------------------------------


class _Recorder:
    """Stands in for a kernel in ``kernels``: ``rec[grid](*args, **kw)`` records the launch."""

    def __init__(self, name: str, kernel: Any, log: list):
        self.name, self.kernel, self.log = name, kernel, log
        self.autotuned = isinstance(kernel, triton.runtime.Autotuner)
        self.configs = kernel.configs if self.autotuned else []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            fn = self.kernel.fn if self.autotuned else self.kernel
            self.log.append(
                Launch(self.name, _role(self.name, fn, args, kwargs), fn, args, kwargs, self.autotuned)
            )

        return launch


def _role(name: str, fn: Any, args: tuple, kwargs: dict) -> str:
    bound = dict(zip(fn.arg_names, args, strict=False)) | kwargs
    if name == "grouped_gemm":
        return "down forward" if bound["stride_bn"] == 1 else "dX (W_gate|up^T view)"
    if name == "grouped_dw":
        return "dW_gate|up" if bound["A_GATHER"] else "dW_down"
    if name == "combine":
        return "y (weighted)" if bound["HAS_WEIGHTS"] else "dx (unweighted)"
    return {
        "gate_up": "gate|up + SwiGLU",
        "down_bwd": "dy W_down^T + SwiGLU bwd",
        "count": "permute: block histograms",
        "scan": "permute: block offsets",
        "place": "permute: stable places",
    }.get(name, name)


def kernel_names() -> list[str]:
    """Every launchable kernel of ``kernels.expert_mlp`` (the objects the launch code indexes)."""
    return sorted(
        n.removesuffix("_kernel")
        for n, obj in vars(kernels).items()
        if n.endswith("_kernel")
        and not n.startswith("_")
        and isinstance(obj, (triton.JITFunction, triton.runtime.Autotuner))
    )


def model_shape(model: str, tokens: int) -> dict[str, int]:
    """T, D, F, E, K of ``conf/model/<model>.yaml``."""
    from omegaconf import OmegaConf

    from zaya_pipeline.config import config_dir

    cfg = OmegaConf.load(config_dir() / "model" / f"{model}.yaml")
    return {
        "T": tokens,
        "D": cfg.d_model,
        "F": cfg.moe.expert_hidden,
        "E": cfg.moe.num_experts,
        "K": cfg.moe.top_k,
    }


def capture_launches(T: int, D: int, F: int, E: int, K: int, dtype=torch.bfloat16) -> list[Launch]:
    """Every kernel launch of one forward + backward of the triton backend at these shapes (nothing runs)."""
    from zaya_pipeline.ops import triton_expert_mlp as op

    log: list[Launch] = []
    saved = {}
    for name in kernel_names():
        attr = f"{name}_kernel"
        saved[attr] = getattr(kernels, attr)
        setattr(kernels, attr, _Recorder(name, saved[attr], log))
    try:
        x = torch.empty(T, D, dtype=dtype)
        ids = (torch.arange(T * K, dtype=torch.int64) % E).view(T, K)
        w = torch.full((T, K), 1.0 / K, dtype=dtype)
        w_gu = torch.empty(E, D, 2 * F, dtype=dtype)
        w_down = torch.empty(E, F, D, dtype=dtype)
        out = op._forward(x, ids, w, w_gu, w_down)
        op._backward(torch.empty_like(x), x, w, w_gu, w_down, *out[1:])
    finally:
        for attr, kernel in saved.items():
            setattr(kernels, attr, kernel)
    return log


# ---- compiling one variant ----------------------------------------------------------------------------


def config_label(config: triton.Config | None) -> str:
    if config is None:
        return "-"
    kw = config.kwargs
    label = f"{kw['BLOCK_M']}x{kw['BLOCK_N']}x{kw['BLOCK_K']} w{config.num_warps} s{config.num_stages}"
    extra = {k: v for k, v in kw.items() if not k.startswith("BLOCK_")}
    return label + "".join(f" {k}={v}" for k, v in extra.items())


def _amd_stats(v: Variant, asm: str) -> None:
    def num(key: str) -> int:
        found = re.search(rf"^\s*;\s*{key}:\s*(\d+)", asm, re.M)
        return int(found.group(1)) if found else 0

    v.registers = num("NumVgprs") + num("NumAgprs")
    v.occupancy = num("Occupancy")
    v.spilled_regs = sum(int(n) for n in re.findall(r"\.[vs]gpr_spill_count:\s*(\d+)", asm))
    v.spill_bytes = num("ScratchSize") if v.spilled_regs else 0


def _nvidia_stats(v: Variant, log: str, num_warps: int, shared_per_sm: int) -> None:
    if "Used" not in log:
        raise RuntimeError("no ptxas -v log was printed (a cached compile?)")
    v.registers = int(re.search(r"Used (\d+) registers", log).group(1))
    v.spill_bytes = int(re.search(r"(\d+) bytes spill stores", log).group(1))
    threads = num_warps * 32
    by_regs = 65536 // max(v.registers * threads, 1)
    by_shared = shared_per_sm // v.shared_bytes if v.shared_bytes else 32
    v.occupancy = min(by_regs, by_shared, 2048 // threads, 32)


def _target_kwargs(launch: Launch, config: triton.Config | None, target: Target) -> dict:
    """The launch's keyword arguments as they are on ``target``: its config and its XCD count."""
    kwargs = dict(launch.kwargs) | (config.all_kwargs() if config else {})
    if "NUM_XCDS" in kwargs:
        kwargs["NUM_XCDS"] = target.xcds
    return kwargs


def compile_variant(launch: Launch, config: triton.Config | None, target: Target) -> Variant:
    """Compile ``launch`` with ``config`` for ``target``; errors are recorded in the variant, not raised."""
    v = Variant(
        launch.kernel, launch.role, config_label(config), target.name, shared_limit=target.shared_limit
    )
    gpu = target.gpu_target()
    backend = make_backend(gpu)
    kwargs = _target_kwargs(launch, config, target)
    knobs.compilation.always_compile = True  # a cached kernel would skip ptxas and print no register log
    knobs.nvidia.dump_ptxas_log = True
    t0 = time.perf_counter()
    try:
        binder = create_function_from_signature(launch.fn.signature, launch.fn.params, backend)
        bound, specialization, options = binder(*launch.args, **kwargs)
        options, signature, constexprs, attrs = launch.fn._pack_args(
            backend, kwargs, bound, specialization, options
        )
        log = io.StringIO()
        with contextlib.redirect_stdout(log):  # ptxas -v prints here (knobs.nvidia.dump_ptxas_log)
            compiled = triton.compile(
                ASTSource(launch.fn, signature, constexprs, attrs), target=gpu, options=options.__dict__
            )
        v.shared_bytes = int(compiled.metadata.shared)
        asm_key, instr = _MATRIX_INSTR[target.vendor]
        for name in instr.findall(compiled.asm[asm_key]):
            v.matrix_instr[name] = v.matrix_instr.get(name, 0) + 1
        if target.vendor == "rocm":
            _amd_stats(v, compiled.asm["amdgcn"])
        else:
            _nvidia_stats(v, log.getvalue(), options.num_warps, target.shared_per_cu)
        v.ok = True
    except Exception as exc:  # noqa: BLE001 - every failure is reported with its variant
        v.error = " ".join(str(exc).split())[:300] or type(exc).__name__
    v.compile_s = round(time.perf_counter() - t0, 3)
    return v


# ---- the whole report ---------------------------------------------------------------------------------

_JOBS: list[tuple[Launch, triton.Config | None, Target]] = []  # set before the pool forks


def _compile_job(i: int) -> Variant:
    return compile_variant(*_JOBS[i])


def _variant_key(launch: Launch, config: triton.Config | None, target: Target) -> tuple:
    """Two launches with the same key compile to the same binary (same specialisation, config and target)."""
    kwargs = _target_kwargs(launch, config, target)
    binder = create_function_from_signature(
        launch.fn.signature, launch.fn.params, make_backend(target.gpu_target())
    )
    _, specialization, _ = binder(*launch.args, **kwargs)
    return (launch.kernel, launch.role, repr(specialization), repr(sorted(kwargs.items())), target.name)


def build_report(
    shapes: dict[str, dict[str, int]],
    targets: list[Target],
    jobs: int = 1,
    progress=print,
    only: set[str] | None = None,
) -> list[Variant]:
    """Every (kernel launch, config, target) variant of ``shapes`` (of the kernels in ``only``, if given)
    compiled once: shared specialisations are compiled once and list every shape they serve."""
    unique: dict[tuple, int] = {}
    owners: list[list[str]] = []
    _JOBS.clear()
    for shape_name, shape in shapes.items():
        for launch in capture_launches(**shape):
            if only and launch.kernel not in only:
                continue
            for target in targets:
                configs = (
                    tables.table(tables.KERNEL_TABLE[launch.kernel], target.vendor, target.name)
                    if launch.autotuned
                    else [None]
                )
                for config in configs:
                    key = _variant_key(launch, config, target)
                    if key not in unique:
                        unique[key] = len(_JOBS)
                        _JOBS.append((launch, config, target))
                        owners.append([])
                    owners[unique[key]].append(shape_name)
    progress(
        f"compiling {len(_JOBS)} variants for {', '.join(t.name for t in targets)} with {jobs} process(es)"
    )
    results: list[Variant] = []
    t0 = time.perf_counter()
    with contextlib.ExitStack() as stack:
        if jobs > 1:
            import multiprocessing

            fork = multiprocessing.get_context("fork")
            pool = stack.enter_context(ProcessPoolExecutor(jobs, mp_context=fork))
            compiled = pool.map(_compile_job, range(len(_JOBS)), chunksize=4)
        else:
            compiled = map(_compile_job, range(len(_JOBS)))
        for i, v in enumerate(compiled):
            results.append(v)
            if (i + 1) % 25 == 0:
                progress(f"  {i + 1}/{len(_JOBS)} compiled ({time.perf_counter() - t0:.0f} s)")
    for v, shape_names in zip(results, owners, strict=True):
        v.shapes = sorted(set(shape_names))
    return results


def problems(variants: list[Variant]) -> list[str]:
    """One line per violated rule: does not compile, spills, over the LDS / shared limit, GEMM without MMA."""
    return [f"{v.kernel} ({v.role}) {v.config} on {v.target}: {p}" for v in variants for p in v.problems]


def summary_rows(variants: list[Variant], targets: list[Target]) -> list[dict[str, Any]]:
    rows = []
    for t in targets:
        mine = [v for v in variants if v.target == t.name]
        rows.append(
            {
                "target": t.name,
                "gpus": t.gpus,
                "variants": len(mine),
                "failed": sum(not v.ok for v in mine),
                "spilling": sum(bool(v.spill_bytes or v.spilled_regs) for v in mine),
                "over_shared": sum(v.shared_bytes > v.shared_limit for v in mine),
                "gemm_without_mma": sum(
                    v.kernel in GEMM_KERNELS and v.ok and not v.matrix_instr for v in mine
                ),
                "max_registers": max((v.registers for v in mine), default=0),
                "max_shared": max((v.shared_bytes for v in mine), default=0),
                "shared_limit": t.shared_limit,
                "compile_s": round(sum(v.compile_s for v in mine), 1),
            }
        )
    return rows


def markdown(variants: list[Variant], targets: list[Target]) -> str:
    lines = [
        "| target | GPUs | variants | failed | spilling | over LDS/shared | GEMM without MMA | max registers "
        "| max LDS/shared (limit) | compile s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in summary_rows(variants, targets):
        lines.append(
            f"| {r['target']} | {r['gpus']} | {r['variants']} | {r['failed']} | {r['spilling']} | "
            f"{r['over_shared']} | {r['gemm_without_mma']} | {r['max_registers']} | "
            f"{r['max_shared']} ({r['shared_limit']}) | {r['compile_s']} |"
        )
    for t in targets:
        occ = "waves/SIMD" if t.vendor == "rocm" else "CTAs/SM"
        lines += [
            "",
            f"**{t.name}** ({t.gpus})",
            "",
            f"| kernel | role | config | registers | spills (B) | LDS/shared (B) | {occ} "
            "| matrix instructions | s |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for v in (v for v in variants if v.target == t.name):
            mma = ", ".join(f"{name} x{n}" for name, n in sorted(v.matrix_instr.items())) or "-"
            spills = f"{v.spill_bytes}" + (f" ({v.spilled_regs} regs)" if v.spilled_regs else "")
            lines.append(
                f"| {v.kernel} | {v.role} | {v.config} | {v.registers} | {spills} | {v.shared_bytes} | "
                f"{v.occupancy} | {mma} | {v.compile_s} |"
                if v.ok
                else f"| {v.kernel} | {v.role} | {v.config} | FAILED: {v.error[:80]} | | | | | |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="zaya kernels",
        description="Compile every expert kernel x tuning config x GPU target ahead of time (no GPU needed) "
        "and "
        "report registers, spills, LDS/shared memory, occupancy and matrix instructions.",
    )
    parser.add_argument(
        "--targets", default=",".join(TARGETS), help=f"comma-separated targets (default: {','.join(TARGETS)})"
    )
    parser.add_argument(
        "--models",
        default=",".join(SHAPES),
        help="comma-separated conf/model configs whose shapes to compile at",
    )
    parser.add_argument("--kernels", default="", help="comma-separated kernels to compile (default: all)")
    parser.add_argument("--out", default="benchmarks/results/kernels_aot.json", help="JSON report to write")
    parser.add_argument(
        "--markdown", default="benchmarks/results/kernels_aot.md", help="Markdown table to write"
    )
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="compile processes")
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if any variant spills, overflows or lacks MMA"
    )
    args = parser.parse_args(argv)
    try:
        targets = [TARGETS[t] for t in args.targets.split(",")]
    except KeyError as exc:
        parser.error(f"--targets: unknown target {exc}; known: {', '.join(TARGETS)}")
    shapes = {}
    for model in args.models.split(","):
        if model not in SHAPES:
            parser.error(f"--models: unknown model {model!r}; known: {', '.join(SHAPES)}")
        shapes[model] = model_shape(model, SHAPES[model])
    only = set(filter(None, args.kernels.split(",")))
    if only - set(kernel_names()):
        parser.error(
            f"--kernels: unknown {sorted(only - set(kernel_names()))}; known: {', '.join(kernel_names())}"
        )
    t0 = time.perf_counter()
    variants = build_report(
        shapes, targets, jobs=args.jobs, progress=lambda m: print(m, file=sys.stderr), only=only or None
    )
    found = problems(variants)
    report = {
        "triton": triton.__version__,
        "torch": torch.__version__,
        "shapes": shapes,
        "targets": {t.name: asdict(t) for t in targets},
        "summary": summary_rows(variants, targets),
        "problems": found,
        "wall_s": round(time.perf_counter() - t0, 1),
        "variants": [asdict(v) for v in variants],
    }
    for path, text in (
        (args.out, json.dumps(report, indent=1)),
        (args.markdown, markdown(variants, targets)),
    ):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
    print(markdown(variants, targets).split("\n\n")[0])
    print(f"{len(variants)} variants in {report['wall_s']} s -> {args.out}, {args.markdown}")
    failed = [p for p in found if "does not compile" in p]
    for line in found:
        print(f"error: {line}" if line in failed or args.check else f"warning: {line}", file=sys.stderr)
    return 1 if failed or (args.check and found) else 0


if __name__ == "__main__":
    sys.exit(main())
