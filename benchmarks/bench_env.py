"""What every benchmark JSON records about where it ran: the commit, the device, package versions."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def git_commit() -> str | None:
    """HEAD of the checkout, or ``$ZAYA_GIT_COMMIT`` for a tree copied without git (a lent GPU box)."""
    if os.environ.get("ZAYA_GIT_COMMIT"):
        return os.environ["ZAYA_GIT_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    except FileNotFoundError:  # no git on the machine
        return None
    return out.stdout.strip() or None


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"


def version_of(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def header(benchmark: str, machine_note: str = "") -> dict:
    """The first keys of a result JSON: what ran, when, from which commit, with which command, where."""
    import datetime as dt
    import shlex
    import sys

    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    return {
        "benchmark": benchmark,
        "date": dt.date.today().isoformat(),
        "command": "python " + shlex.join(sys.argv),
        "commit": git_commit(),
        "machine": f"{machine}; {machine_note}" if machine_note else machine,
    }
