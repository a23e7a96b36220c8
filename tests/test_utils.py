"""utils.atomic_dir: a killed run's temporary folder is removed by the next run, a live one's is kept."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from zaya_pipeline.utils import atomic_dir, remove_outputs, staged_files


def test_atomic_dir_swaps_on_success_and_keeps_the_old_output_on_error(tmp_path):
    out = tmp_path / "out"
    with atomic_dir(out) as tmp:
        (tmp / "a").write_text("1")
    with pytest.raises(RuntimeError), atomic_dir(out) as tmp:
        (tmp / "a").write_text("2")
        raise RuntimeError("boom")
    assert (out / "a").read_text() == "1"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_killed_runs_temporary_folder_goes_with_the_next_run(tmp_path):
    code = (
        "import os, sys, time\n"
        "from zaya_pipeline.utils import atomic_dir\n"
        f"with atomic_dir({str(tmp_path / 'out')!r}) as tmp:\n"
        "    (tmp / 'half').write_text('x'); print(tmp.name, flush=True); time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    killed = proc.stdout.readline().strip()
    live = tmp_path / f".out.tmp-{os.getppid()}-x"  # a live process's (our parent's) folder stays
    live.mkdir()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (tmp_path / killed).is_dir()  # SIGKILL cleaned up nothing
    with atomic_dir(tmp_path / "out") as tmp:
        (tmp / "done").write_text("y")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out", live.name])


def test_staged_files_move_in_together_or_not_at_all(tmp_path):
    """evaluate's reports (issue 32 row 7): a failure half-way leaves every old file, not a mix."""
    (tmp_path / "metrics.json").write_text("old")
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "tasks.csv").write_text("old")
    with pytest.raises(RuntimeError), staged_files(tmp_path) as stage:
        (stage / "metrics.json").write_text("new")
        raise RuntimeError("the samples failed")
    assert (tmp_path / "metrics.json").read_text() == "old" and not list(tmp_path.glob(".staged-*"))
    with staged_files(tmp_path, last=("metrics.json",)) as stage:
        (stage / "plots").mkdir()
        (stage / "plots" / "tasks.csv").write_text("new")
        (stage / "metrics.json").write_text("new")
    assert (tmp_path / "metrics.json").read_text() == (tmp_path / "plots" / "tasks.csv").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json", "plots"]


def test_an_output_that_is_a_symlink_is_written_through(tmp_path):
    """Issue 32 row 10: `Cannot call rmtree on a symbolic link` after all the work, a temp folder left."""
    target = tmp_path / "other-disk" / "tasks"
    target.mkdir(parents=True)
    (target / "old.txt").write_text("old")
    link = tmp_path / "repo" / "tasks"
    link.parent.mkdir()
    link.symlink_to(target)
    with atomic_dir(link) as tmp:
        (tmp / "new.txt").write_text("new")
    assert link.is_symlink() and [p.name for p in link.iterdir()] == ["new.txt"]
    assert not list(tmp_path.rglob(".tasks.tmp-*"))
    remove_outputs(link)  # a stale output that is a link: the link goes, the other disk is untouched
    assert not link.exists() and (target / "new.txt").is_file()
