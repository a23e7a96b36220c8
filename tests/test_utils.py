"""utils.atomic_dir: a killed run's temporary folder is removed by the next run, a live one's is kept."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from zaya_pipeline.utils import atomic_dir


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
