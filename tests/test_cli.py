"""The zaya command: help for every stage, clear errors and non-zero exits on bad input."""

from __future__ import annotations

import subprocess
import sys

import pytest

from zaya_pipeline.cli import STAGES


def zaya(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "zaya_pipeline.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )


def test_top_level_help_lists_every_stage():
    out = zaya("--help")
    assert out.returncode == 0
    for stage in [*STAGES, "params"]:
        assert stage in out.stdout


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_stage_help(stage, repo_root):
    out = zaya(stage, "--help", cwd=repo_root)
    assert out.returncode == 0, out.stderr
    assert f"zaya {stage}" in out.stdout and "model" in out.stdout


def test_unknown_stage_fails():
    out = zaya("trian")
    assert out.returncode == 2 and "unknown stage 'trian'" in out.stderr


def test_missing_params_file_fails_cleanly(tmp_path):
    out = zaya("prepare", "--params", str(tmp_path / "nope.yaml"))
    assert out.returncode == 2 and "nope.yaml does not exist" in out.stderr and "Traceback" not in out.stderr


def test_unknown_key_fails_cleanly(repo_root):
    out = zaya("train", "train.nonexistent_knob=1", cwd=repo_root)
    assert out.returncode != 0 and "train.nonexistent_knob" in out.stderr + out.stdout


def test_unknown_group_member_fails_cleanly(repo_root):
    out = zaya("train", "model=gigantic", cwd=repo_root)
    assert out.returncode != 0 and "model/gigantic" in out.stderr + out.stdout


def test_params_command_writes_a_composed_file(tmp_path, repo_root):
    out = zaya("params", "--out", str(tmp_path / "p.yaml"), "experiment=debug", cwd=repo_root)
    assert out.returncode == 0, out.stderr
    assert "name: debug" in (tmp_path / "p.yaml").read_text()
