#!/usr/bin/env bash
# The one GPU check, for a CUDA or ROCm machine (the step timeouts total 550 s; run it under a 600 s limit):
#   1. prints the accelerator (nvidia-smi / rocm-smi) and the python, torch and triton versions;
#   2. train-mfu: training throughput and MFU of model=small on one device, bf16 autocast, the default
#      expert backend, plus a profile of one step (timeout 60 s) -> train_mfu_gpu.json, train_mfu_gpu_profile.txt
#      (issue 6 target: MFU >= 40% on an H200);
#   3. train-mfu-triton: step 2 with model.moe.expert_backend=triton (timeout 60 s) -> train_mfu_gpu_triton.json;
#   4. gpu-tests: pytest -m gpu tests/ops, the ZAYA1-shape parity first, one kernel config per kernel
#      (ZAYA_TRITON_AUTOTUNE=0; timeouts 60 + 150 s; each kernel specialisation compiles, ~20 s per case);
#   5. train-mfu-compile: step 2 under torch.compile (timeout 100 s) -> train_mfu_gpu_compile.json;
#   6. benchmark: the expert MLP at the zaya1 shape, every backend, autotuned (timeout 120 s)
#      -> expert_mlp_gpu.json.
# GPU_STEPS="train-mfu gpu-tests" runs only those (default: all). A failed step is reported and the later
# steps still run; the exit status is nonzero if any step failed. Outputs go to ${OUT:-benchmarks/results};
# the whole log to gpu_check.log there as well.
#
# Python: $PY if set, else .venv/bin/python (created with `make setup` if missing). On a machine that already
# has torch and triton but no registry (a lent GPU box), point PY at its python and put the project and the
# pure-Python dependencies the checks import (hydra-core, omegaconf, antlr4) on PYTHONPATH:
#     scripts/gpu_site.sh                                    # here: copies them from .venv into .gpu_site/
#     PY=python3 PYTHONPATH=src:.gpu_site scripts/gpu_check.sh   # there
# Timeouts can be changed with PYTEST_TIMEOUT=... BENCH_TIMEOUT=... MFU_TIMEOUT=... COMPILE_TIMEOUT=... (s).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT_DIR="${OUT:-benchmarks/results}"
mkdir -p "$OUT_DIR"
exec > >(tee -a "${OUT_DIR}/gpu_check.log") 2>&1
export PYTHONUNBUFFERED=1
failed=()

step() {  # step NAME COMMAND...: run it, report ok/FAILED with its time, remember failures
  local name=$1 t0=$SECONDS rc=0
  shift
  echo "=== ${name}: $*"
  "$@" || rc=$?
  if ((rc == 0)); then
    echo "=== ${name}: ok ($((SECONDS - t0)) s)"
  else
    if ((rc == 124)); then
      echo "=== ${name}: FAILED (timed out after $((SECONDS - t0)) s)"
    else
      echo "=== ${name}: FAILED (exit ${rc}, $((SECONDS - t0)) s)"
    fi
    failed+=("$name")
  fi
}

accelerator() {
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi
  elif command -v rocm-smi >/dev/null; then
    rocm-smi
  else
    echo "neither nvidia-smi nor rocm-smi found"
  fi
}

versions() {
  "$PY" - <<'PYEOF'
import importlib.metadata, platform, sys
import torch
try:
    triton = importlib.metadata.version("triton")
except importlib.metadata.PackageNotFoundError:
    triton = None
print(f"python {platform.python_version()}, torch {torch.__version__} (cuda {torch.version.cuda}, "
      f"hip {torch.version.hip}), triton {triton}")
if not torch.cuda.is_available():
    sys.exit("torch sees no CUDA/ROCm device (a CPU-only torch build?)")
print(f"device 0: {torch.cuda.get_device_name(0)}, {torch.cuda.device_count()} visible")
import zaya_pipeline.config, zaya_pipeline.ops  # the project and its config deps import
PYEOF
}

train_mfu() {  # train_mfu TIMEOUT NAME [extra args]: model=small, 8 x 2048 tokens per step
  local limit=$1 name=$2
  shift 2
  timeout "$limit" "$PY" benchmarks/train_mfu.py --device cuda --model small --batch 8 --seq-len 2048 \
    --out "${OUT_DIR}/${name}.json" "$@"
}

gpu_tests() {
  # one config per kernel: autotuning every test shape would spend the budget compiling
  local rc=0
  ZAYA_TRITON_AUTOTUNE=0 timeout 60 "$PY" -m pytest -m gpu tests/ops -v -p no:cacheprovider -k zaya1 \
    --junitxml "${OUT_DIR}/gpu_tests_zaya1.xml" || rc=$?
  ZAYA_TRITON_AUTOTUNE=0 timeout "${PYTEST_TIMEOUT:-150}" "$PY" -m pytest -m gpu tests/ops -v \
    -p no:cacheprovider -k "not zaya1" --junitxml "${OUT_DIR}/gpu_tests.xml" || rc=$?
  return $rc
}

benchmark() {
  timeout "${BENCH_TIMEOUT:-120}" "$PY" benchmarks/expert_mlp.py --device cuda --shape zaya1 \
    --out "${OUT_DIR}/expert_mlp_gpu.json"
}

step accelerator accelerator
if [[ -z "${PY:-}" ]]; then
  PY=.venv/bin/python
  [[ -x "$PY" ]] || step setup make setup
fi
if command -v "$PY" >/dev/null; then
  step versions versions
  wanted() { [[ -z "${GPU_STEPS:-}" || " ${GPU_STEPS} " == *" $1 "* ]]; }
  if wanted train-mfu; then
    step train-mfu train_mfu "${MFU_TIMEOUT:-60}" train_mfu_gpu --profile "${OUT_DIR}/train_mfu_gpu_profile.txt"
  fi
  if wanted train-mfu-triton; then
    step train-mfu-triton train_mfu "${MFU_TIMEOUT:-60}" train_mfu_gpu_triton --backend triton
  fi
  if wanted gpu-tests; then step gpu-tests gpu_tests; fi
  if wanted train-mfu-compile; then
    step train-mfu-compile train_mfu "${COMPILE_TIMEOUT:-100}" train_mfu_gpu_compile --compile
  fi
  if wanted benchmark; then step benchmark benchmark; fi
else
  echo "=== no ${PY}: skipping the python steps"
  failed+=(versions train-mfu gpu-tests benchmark train-mfu-triton train-mfu-compile)
fi

if ((${#failed[@]})); then
  echo "=== gpu_check: FAILED steps: ${failed[*]}"
  exit 1
fi
echo "=== gpu_check: all steps passed"
