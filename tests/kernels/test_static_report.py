"""The static kernel report (``zaya kernels``): every expert kernel x every config of its tuning table,
compiled ahead of time for gfx942, gfx950, gfx90a, sm_90 and sm_80 at the zaya1_base and small shapes,
with no spills, within each target's LDS / shared memory, and with matrix instructions in every GEMM.

The compiles run in subprocesses: this test process runs Triton under its interpreter, whose jit functions
cannot be compiled for a GPU target."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

MATRIX_FAMILY = {
    "gfx942": "v_mfma_",
    "gfx950": "v_mfma_",
    "gfx90a": "v_mfma_",
    "sm_90": "wgmma.",
    "sm_80": "mma.sync",
}


def _env():
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    return env


def _run(args, tmp_path, code=None):
    cmd = [sys.executable, "-c", code] if code else [sys.executable, "-m", "zaya_pipeline.kernel_report"]
    out = tmp_path / "report.json"
    cmd += [*args, "--out", str(out), "--markdown", str(tmp_path / "report.md")]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=900)
    return proc, out


@pytest.mark.slow
def test_every_config_compiles_for_every_target_without_spills(tmp_path):
    proc, out = _run(["--check"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["problems"] == []
    assert set(report["targets"]) == set(MATRIX_FAMILY)
    assert set(report["shapes"]) == {"zaya1_base", "small"}
    variants = report["variants"]
    kernels = {v["kernel"] for v in variants}
    assert {
        "gate_up",
        "grouped_gemm",
        "down_bwd",
        "grouped_dw",
        "combine",
        "count",
        "scan",
        "place",
    } <= kernels
    for v in variants:
        assert v["ok"] and v["spill_bytes"] == 0 and v["spilled_regs"] == 0, v
        assert v["registers"] > 0 and v["shared_bytes"] <= v["shared_limit"], v
        assert v["occupancy"] >= 1, v
        if v["kernel"] in ("gate_up", "grouped_gemm", "down_bwd", "grouped_dw"):
            assert v["matrix_instr"] and all(
                k.startswith(MATRIX_FAMILY[v["target"]]) for k in v["matrix_instr"]
            ), v
    # every config of every table, for every target of its vendor
    code = textwrap.dedent(
        """
        import json, sys
        from zaya_pipeline.kernels import configs
        vendors = (("cuda", ""), ("rocm", "gfx942"))
        tables = ("gemm", "gate_up", "down_bwd", "dw")
        print(json.dumps({f"{v}/{t}": len(configs.table(t, v, a)) for v, a in vendors for t in tables}))
        """
    )
    sizes = json.loads(
        subprocess.run(
            [sys.executable, "-c", code], env=_env(), capture_output=True, text=True, check=True
        ).stdout
    )
    per_target = {}
    for v in variants:
        per_target.setdefault((v["target"], v["kernel"], v["role"]), set()).add(v["config"])
    table_of = {"gate_up": "gate_up", "grouped_gemm": "gemm", "down_bwd": "down_bwd", "grouped_dw": "dw"}
    for (target, kernel, role), seen in per_target.items():
        vendor = "rocm" if target.startswith("gfx") else "cuda"
        want = sizes[f"{vendor}/{table_of[kernel]}"] if kernel in table_of else 1
        assert len(seen) == want, (target, kernel, role, seen)
    assert "| gfx942 | MI300X |" in (tmp_path / "report.md").read_text()


ADD_BAD_CONFIGS = textwrap.dedent(
    """
    import sys
    from zaya_pipeline import kernel_report as aot
    from zaya_pipeline.kernels import configs
    configs._CUDA_DOWN_BWD.append((128, 128, 64, 4, 4))       # 128 accumulators per thread + epilogue: spills
    configs._ROCM_GEMM.append((256, 256, 128, 8, 2, 16, 2))   # LDS over gfx942's 64 KiB
    sys.exit(aot.main(sys.argv[1:]))
    """
)


@pytest.mark.slow
def test_a_spilling_or_oversized_config_fails_the_check(tmp_path):
    args = [
        "--check",
        "--targets",
        "sm_80,gfx942",
        "--models",
        "zaya1_base",
        "--kernels",
        "down_bwd,grouped_dw",
    ]
    proc, out = _run(args, tmp_path, code=ADD_BAD_CONFIGS)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "down_bwd (dy W_down^T + SwiGLU bwd) 128x128x64 w4 s4 on sm_80: spills" in proc.stderr
    assert "grouped_dw (dW_down) 256x256x128 w8 s2" in proc.stderr and "over the 65536 B limit" in proc.stderr
    problems = json.loads(out.read_text())["problems"]
    assert problems and all("128x128x64 w4 s4" in p or "256x256x128" in p for p in problems), problems


def test_a_variant_that_does_not_compile_is_an_error_not_a_skip(tmp_path):
    code = ADD_BAD_CONFIGS.replace(
        "configs._CUDA_DOWN_BWD.append((128, 128, 64, 4, 4))",
        "configs._CUDA_DOWN_BWD.append((64, 48, 64, 4, 4))",
    )
    args = ["--targets", "sm_90", "--models", "small", "--kernels", "down_bwd"]  # no --check: still an error
    proc, _ = _run(args, tmp_path, code=code)
    assert proc.returncode == 1
    assert (
        "error: down_bwd (dy W_down^T + SwiGLU bwd) 64x48x64 w4 s4 on sm_90: does not compile" in proc.stderr
    )


def test_bad_arguments_name_the_flag(tmp_path):
    proc, _ = _run(["--targets", "gfx1100"], tmp_path)
    assert proc.returncode == 2 and "--targets: unknown target 'gfx1100'" in proc.stderr
    proc, _ = _run(["--kernels", "nope"], tmp_path)
    assert proc.returncode == 2 and "--kernels: unknown ['nope']" in proc.stderr
