#!/usr/bin/env bash
# The one GPU check, for a CUDA or ROCm machine (under 9 minutes: the three timeouts total 500 s):
#   1. prints the accelerator (nvidia-smi / rocm-smi) and the python, torch and triton versions;
#   2. creates .venv with `make setup` if it is missing;
#   3. runs the GPU tests: pytest -m gpu tests/ops (timeout 200 s, one kernel config: ZAYA_TRITON_AUTOTUNE=0);
#   4. benchmarks the expert MLP at the zaya1 shape on cuda, autotuned (timeout 200 s), writing
#      ${OUT:-benchmarks/results}/expert_mlp_gpu.json;
#   5. training throughput and MFU of model=small on one device, bf16 autocast (timeout 150 s):
#      ${OUT:-benchmarks/results}/train_mfu_gpu.json (issue target: MFU >= 40% on an H200).
# A failed step is reported and the later steps still run; the exit status is nonzero if any step failed.
# Run from anywhere:  scripts/gpu_check.sh      (OUT=/some/dir scripts/gpu_check.sh to put the JSON there)
# Timeouts can be changed with PYTEST_TIMEOUT=... BENCH_TIMEOUT=... MFU_TIMEOUT=... (seconds).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=.venv/bin/python
OUT_DIR="${OUT:-benchmarks/results}"
mkdir -p "$OUT_DIR"
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
PYEOF
}

gpu_tests() {
  # one config per kernel: autotuning every test shape would spend the budget compiling
  ZAYA_TRITON_AUTOTUNE=0 timeout "${PYTEST_TIMEOUT:-200}" "$PY" -m pytest -m gpu tests/ops -q
}

benchmark() {
  timeout "${BENCH_TIMEOUT:-150}" "$PY" benchmarks/expert_mlp.py --device cuda --shape zaya1 \
    --out "${OUT_DIR}/expert_mlp_gpu.json"
}

train_mfu() {
  timeout "${MFU_TIMEOUT:-150}" "$PY" benchmarks/train_mfu.py --device cuda --model small --batch 8 \
    --seq-len 2048 --out "${OUT_DIR}/train_mfu_gpu.json"
}

step accelerator accelerator
if [[ ! -x "$PY" ]]; then
  step setup make setup
fi
if [[ -x "$PY" ]]; then
  step versions versions
  step gpu-tests gpu_tests
  step benchmark benchmark
  step train-mfu train_mfu
else
  echo "=== no ${PY}: skipping versions, gpu-tests and benchmark"
  failed+=(versions gpu-tests benchmark train-mfu)
fi

if ((${#failed[@]})); then
  echo "=== gpu_check: FAILED steps: ${failed[*]}"
  exit 1
fi
echo "=== gpu_check: all steps passed"
