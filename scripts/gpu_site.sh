#!/usr/bin/env bash
# Copies the pure-Python packages that scripts/gpu_check.sh imports beyond torch, triton and pytest
# (hydra-core, omegaconf, antlr4-python3-runtime) from .venv into .gpu_site/ (ignored by git), for a GPU
# machine that has torch but cannot install packages. Run here after `make setup`; then, there:
#     PY=python3 PYTHONPATH=src:.gpu_site scripts/gpu_check.sh
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
rm -rf .gpu_site
mkdir -p .gpu_site
for pkg in hydra omegaconf antlr4; do
  cp -r "$site/$pkg" .gpu_site/
done
find .gpu_site -name __pycache__ -prune -exec rm -rf {} +
du -sh .gpu_site
