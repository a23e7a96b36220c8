"""Launching `zaya train` from outside: under torchrun (Lightning's TorchElasticEnvironment) 2 CPU processes
with FSDP2 x EP=2 train exactly like the 2 processes Lightning launches itself; the SLURM templates
(scripts/slurm/*.sbatch) are valid bash and compose into a valid config."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from zaya_pipeline.config import load_config
from zaya_pipeline.distributed.mesh import mesh_sizes
from zaya_pipeline.model.saved_model import load_model

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = sorted((REPO / "scripts" / "slurm").glob("*.sbatch"))


def train_args(root: Path, token_dir: Path) -> list[str]:
    """The 2-process parity run of test_train_parallel.py: 8 steps, 2 micro-batches per rank."""
    return [
        "train",
        "train=debug",
        "model=debug",
        "train.max_steps=8",
        "train.val_every=4",
        "train.log_every=2",
        "train.global_batch=16",
        "train.micro_batch=4",
        "model.moe.router.aux_loss_coef=0.0",  # aux and z losses are per-rank means: off for the parity
        "model.moe.router.z_loss_coef=0.0",
        f"paths.tokens={token_dir}",
        f"paths.train={root}/train",
        f"paths.reports={root}/reports",
        f"registry.tracking_uri=sqlite:///{root}/mlflow.db",
        "parallel=fsdp2_ep2",
    ]


def run(root: Path, command: list[str]) -> tuple[dict, list[float], str]:
    root.mkdir(exist_ok=True)
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(root / "reports" / "plots" / "train.csv") as f:
        losses = [float(row["loss"]) for row in csv.DictReader(f)]
    return json.loads((root / "reports" / "train.json").read_text()), losses, proc.stderr


@pytest.mark.slow
@pytest.mark.distributed
def test_torchrun_trains_like_the_lightning_launch(tmp_path, token_dir):
    elastic_root = tmp_path / "torchrun"
    # (a fresh MLflow store: only rank 0 opens it, so the ranks do not collide creating it)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    elastic, elastic_losses, log = run(
        elastic_root, [*torchrun, "-m", "zaya_pipeline.cli", *train_args(elastic_root, token_dir)]
    )
    lightning_root = tmp_path / "lightning"
    spawned, spawned_losses, _ = run(
        lightning_root, [sys.executable, "-m", "zaya_pipeline.cli", *train_args(lightning_root, token_dir)]
    )
    assert "Starting with 2 processes" in log  # world size 2: torchrun's ranks, none launched by Lightning
    assert log.count("step 8/8  loss") == 1  # the progress lines come from rank 0 only
    assert elastic["steps"] == spawned["steps"] == 8
    assert elastic["tokens_seen"] == spawned["tokens_seen"] == 8 * 16 * 64
    for a, b in zip(elastic_losses, spawned_losses, strict=True):
        assert abs(a - b) / b < 1e-4
    model, cfg = load_model(elastic_root / "train" / "model.pt")  # rank 0 wrote the full model
    reference, _ = load_model(lightning_root / "train" / "model.pt")
    assert model.blocks[0].moe.experts.w_gate_up_EDF2.shape[0] == cfg.moe.num_experts
    for (name, p), q in zip(model.state_dict().items(), reference.state_dict().values(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=name)


def test_there_are_slurm_templates():
    assert {p.name for p in TEMPLATES} >= {"train_mi300x.sbatch", "train_nvidia.sbatch"}


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: p.name)
def test_slurm_template_is_valid_bash(template):
    proc = subprocess.run(["bash", "-n", str(template)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: p.name)
def test_slurm_template_composes_a_valid_multi_node_config(template, tmp_path):
    """Run the template's body as sbatch would on 2 nodes, with an `srun` that records its command line."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text('#!/usr/bin/env bash\nprintf "%s\\0" "$@" > "$SRUN_ARGS"\n')
    srun.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "SRUN_ARGS": str(tmp_path / "srun.args"),
        "SLURM_SUBMIT_DIR": str(tmp_path),
        "SLURM_JOB_ID": "4242",
        "SLURM_NNODES": "2",
        "SLURM_NTASKS_PER_NODE": "8",
        "SLURM_CPUS_PER_TASK": "16",
    }
    proc = subprocess.run(
        ["bash", str(template), "train.max_steps=10"], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    argv = (tmp_path / "srun.args").read_text().split("\0")[:-1]
    start = argv.index("zaya_pipeline.cli")
    assert argv[start + 1] == "train"
    overrides = argv[start + 2 :]
    assert overrides[-1] == "train.max_steps=10"  # the submitter's overrides come last and win
    cfg = load_config(overrides)
    p = cfg.parallel
    assert (p.accelerator, p.strategy, p.devices, p.num_nodes) == ("gpu", "fsdp2", 8, 2)
    sizes = mesh_sizes(p, p.devices * p.num_nodes, cfg.model.moe.num_experts)
    assert sizes.ep <= p.devices  # expert all-to-all stays inside a node
    assert cfg.model.name == "zaya1_base" and cfg.train.max_steps == 10


def test_a_launcher_world_that_differs_from_the_config_names_the_keys(monkeypatch):
    from zaya_pipeline.config import ParallelConfig
    from zaya_pipeline.errors import ConfigError
    from zaya_pipeline.train.run import check_launcher_world, launch_rank

    parallel = ParallelConfig(devices=2, num_nodes=1)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    with pytest.raises(
        ConfigError, match=r"torchrun started 4 processes .*parallel.devices × parallel.num_nodes"
    ):
        check_launcher_world(parallel)
    assert launch_rank(parallel) == 3
    monkeypatch.setenv("WORLD_SIZE", "2")
    check_launcher_world(parallel)
    for key in ("TORCHELASTIC_RUN_ID", "WORLD_SIZE", "RANK"):
        monkeypatch.delenv(key)
    monkeypatch.setenv("SLURM_STEP_NUM_TASKS", "8")
    monkeypatch.setenv("SLURM_PROCID", "5")
    with pytest.raises(ConfigError, match="srun started 8 processes"):
        check_launcher_world(parallel)
    assert launch_rank(parallel) == 5
    monkeypatch.delenv("SLURM_STEP_NUM_TASKS")
    monkeypatch.setenv("NODE_RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert launch_rank(parallel) == 3  # Lightning's relaunch on the second node
