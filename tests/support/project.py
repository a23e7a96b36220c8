"""A throwaway copy of the project as its own git + DVC repo, and the command runner the DVC tests use."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # the venv's zaya and dvc


def run(
    cmd: list[str], cwd: Path, timeout: int = 900, env: dict | None = None, stdout_only: bool = False
) -> str:
    """Run ``cmd`` with the venv first on PATH and no MLflow server in the environment; its output (stdout
    and stderr, or stdout alone)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_TRACKING")}
    full_env["PATH"] = f"{BIN}{os.pathsep}{full_env.get('PATH', '')}"
    full_env.update(env or {})
    out = subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, (
        f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    )
    return out.stdout if stdout_only else out.stdout + out.stderr


def copy_project(dst: Path, *overrides: str) -> Path:
    """A fresh git repo at ``dst`` holding exactly the project's committed-or-committable files (no
    dvc.lock, no reports), with params.yaml composed from ``overrides`` (``zaya params``), all committed."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    for rel in files:
        if (REPO / rel).is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, dst / rel)
    (dst / "dvc.lock").unlink(missing_ok=True)
    if (dst / "reports").exists():
        shutil.rmtree(dst / "reports")
    run(["git", "init", "-q"], dst)
    run([str(BIN / "zaya"), "params", *overrides], dst)
    run(["git", "add", "-A"], dst)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "params"], dst)
    return dst
