"""`zaya train` killed and resumed with `train.resume=auto`, through the real CLI in subprocesses:

* SIGKILL (no chance to save) mid-run: the resumed run reproduces the uninterrupted loss curve step for step;
* SIGTERM to a 2-process FSDP2 x EP run: both ranks save the same step and exit with 143; that checkpoint
  resumes in ONE process and continues the 2-process curve (same global batch).
"""

from __future__ import annotations

import csv
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from zaya_pipeline.distributed.checkpoint import latest_checkpoint, list_checkpoints

MAX_STEPS = 40


def train_args(root: Path, token_dir: Path, *overrides: str) -> list[str]:
    return [
        sys.executable, "-m", "zaya_pipeline.cli", "train",
        "train=debug", "model=debug",
        f"train.max_steps={MAX_STEPS}", "train.val_every=1000", "train.log_every=1",
        "train.global_batch=8", "train.micro_batch=4", "train.num_threads=1",
        "train.checkpoint_every=5",
        "model.moe.router.aux_loss_coef=0.0", "model.moe.router.z_loss_coef=0.0",
        f"paths.tokens={token_dir}", f"paths.train={root}/train", f"paths.reports={root}/reports",
        f"paths.checkpoints={root}/ckpt", f"registry.tracking_uri=sqlite:///{root}/mlflow.db",
        *overrides,
    ]  # fmt: skip


def run(root: Path, token_dir: Path, *overrides: str) -> dict[int, float]:
    root.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        train_args(root, token_dir, *overrides), capture_output=True, text=True, timeout=600, cwd=root
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return losses(root)


def losses(root: Path) -> dict[int, float]:
    with open(root / "reports" / "plots" / "train.csv") as f:
        return {int(row["step"]): float(row["loss"]) for row in csv.DictReader(f)}


def interrupt(root: Path, token_dir: Path, sig: int, *overrides: str) -> subprocess.CompletedProcess:
    """Start a run, send ``sig`` once its first checkpoint exists, and wait for it to end."""
    root.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        train_args(root, token_dir, *overrides), cwd=root, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + 300
    while latest_checkpoint(root / "ckpt") is None and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before its first checkpoint"
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def assert_same_curve(resumed: dict[int, float], reference: dict[int, float], rtol: float) -> None:
    assert resumed and max(resumed) == MAX_STEPS
    for step, loss in resumed.items():
        assert abs(loss - reference[step]) / reference[step] < rtol, (step, loss, reference[step])


@pytest.mark.slow
def test_a_run_killed_with_sigkill_resumes_step_for_step(tmp_path, token_dir):
    reference = run(tmp_path / "ref", token_dir)
    killed = interrupt(tmp_path / "run", token_dir, signal.SIGKILL)
    assert killed.returncode == -signal.SIGKILL
    saved = list_checkpoints(tmp_path / "run" / "ckpt")
    assert saved and not (tmp_path / "run" / "train" / "model.pt").exists()
    resumed = run(tmp_path / "run", token_dir, "train.resume=auto")
    first = min(resumed)
    assert first == int(saved[-1].name.removeprefix("step")) + 1 < MAX_STEPS
    assert_same_curve(resumed, reference, rtol=1e-6)


@pytest.mark.slow
@pytest.mark.distributed
def test_sigterm_saves_both_ranks_and_the_checkpoint_resumes_in_one_process(tmp_path, token_dir):
    fsdp = "parallel=fsdp2_ep2"
    reference = run(tmp_path / "ref", token_dir, fsdp)
    stopped = interrupt(tmp_path / "run", token_dir, signal.SIGTERM, fsdp)
    assert stopped.returncode == 143, stopped.stderr[-3000:]
    assert "train.resume=auto" in stopped.stderr
    last = latest_checkpoint(tmp_path / "run" / "ckpt")
    step = int(last.name.removeprefix("step"))
    assert step < MAX_STEPS
    assert not any(p.name.endswith(".partial") for p in (tmp_path / "run" / "ckpt").iterdir())
    resumed = run(tmp_path / "run", token_dir, "train.resume=auto")  # one process, the same global batch
    assert min(resumed) == step + 1
    # two processes sum gradients and expert loads in another order than one; top-1 routing with the skip
    # expert carries those last-bit differences into later choices (measured: 1.2e-4 by step 38, 2026-12-07)
    assert_same_curve(resumed, reference, rtol=5e-4)
