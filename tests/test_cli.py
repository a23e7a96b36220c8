"""The zaya command: help for every stage, clear errors and non-zero exits on bad input."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


# --- one-line errors: a bad value, a mistyped key, an unknown preset (issue 24) ----------------------------

MODELS = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "conf" / "model").glob("*.yaml"))
BAD = {
    "fp99": ("train.precision=fp99", ["train.precision", "'fp99'", "32-true", "bf16-mixed"]),
    "typo": ("train.max_stepz=3", ["'train.max_stepz'", "did you mean 'train.max_steps'"]),
    "preset": ("model=huge", ["model/huge", "choose one of " + ", ".join(MODELS)]),
}


@pytest.fixture(scope="module")
def earlier_run(tmp_path_factory) -> Path:
    """The outputs and MLflow store of an earlier train run (stand-ins), and real token shards."""
    from train.token_shards import write_shards

    root = tmp_path_factory.mktemp("earlier")
    write_shards(root / "tokens")
    for path in ("train/model.pt", "train/run.json", "reports/train.json", "reports/plots/train.csv"):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(f"earlier {path}")
    return root


def outputs_of(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("how", ["conf", "params", "params-command"])
@pytest.mark.parametrize("case", sorted(BAD))
def test_a_config_mistake_is_one_line_naming_the_key_and_the_choices(case, how, earlier_run, repo_root):
    override, expected = BAD[case]
    root = earlier_run
    paths = [
        f"paths.tokens={root / 'tokens'}", f"paths.train={root / 'train'}",
        f"paths.reports={root / 'reports'}", f"registry.tracking_uri=sqlite:///{root / 'mlflow.db'}",
    ]  # fmt: skip
    before = outputs_of(root)
    if how == "conf":
        out = zaya("train", "experiment=debug", *paths, override, cwd=repo_root)
    elif how == "params":
        out = zaya("train", "--params", "params.yaml", *paths, override, cwd=repo_root)
    else:
        out = zaya("params", "--out", str(root / "params.yaml"), override, cwd=repo_root)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), out.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    assert "+train" not in lines[0] and out.stdout == ""
    assert outputs_of(root) == before  # nothing written: no params file, no MLflow store, outputs intact


def test_a_sweep_over_an_unknown_member_names_it(repo_root):
    out = zaya("model-info", "-m", "model=debug,hugee", "train/optim=adamw", cwd=repo_root)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1, out.stderr
    assert "unknown model config 'hugee'" in lines[0] and "debug, small" in lines[0]


def test_a_misplaced_key_suggests_where_it_lives(repo_root):
    out = zaya("model-info", "lr=0.1", cwd=repo_root)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        "error: unknown config key 'lr': did you mean 'train.optim.lr' or 'train.optim.muon.lr'?"
    ]


def test_help_and_cfg_still_work(repo_root):
    assert zaya("train", "--help", cwd=repo_root).returncode == 0
    out = zaya("model-info", "--cfg", "job", "model=debug", "train.max_steps=7", cwd=repo_root)
    assert out.returncode == 0 and "max_steps: 7" in out.stdout, out.stderr
