"""Fresh-clone benchmark: the README's two commands, timed, on a clean clone of this repository.

Clones the repository (committed files only) into a temporary folder, runs ``make run`` (install + the whole
pipeline on the embedded default) and then ``make test``, and writes wall times, the per-stage wall times the
stages report, and the headline metrics to a JSON file::

    python benchmarks/fresh_clone.py --out benchmarks/results/fresh_clone.json

Uses whatever Python ``make`` finds (``PYTHON=...`` to choose). Takes ~10-15 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAGE_REPORTS = ("prepare", "curate", "tokenizer", "tokenize", "train", "metrics", "registry")


def timed(cmd: list[str], cwd: Path, log: Path) -> tuple[float, int, dict[str, float]]:
    """Run ``cmd`` in ``cwd``, output to ``log``; return (wall s, exit code, wall s per DVC stage seen)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_TRACKING", "VIRTUAL_ENV"))}
    t0 = time.perf_counter()
    marks: list[tuple[str, float]] = []
    with open(log, "w") as f:
        proc = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        for line in proc.stdout:
            f.write(line)
            if line.startswith("Running stage '"):
                marks.append((line.split("'")[1], time.perf_counter()))
        rc = proc.wait()
    end = time.perf_counter()
    stage_s = {
        name: (marks[i + 1][1] if i + 1 < len(marks) else end) - t for i, (name, t) in enumerate(marks)
    }
    return end - t0, rc, stage_s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "fresh_clone.json")
    ap.add_argument("--skip-tests", action="store_true", help="time `make run` only")
    ap.add_argument("--keep", action="store_true", help="keep the clone (its path is printed)")
    args = ap.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="zaya-fresh-"))
    clone = work / "repo"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True, check=True
    ).stdout.strip()
    result: dict = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "commit": commit,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": sys.version.split()[0],
        },
        "command": "python benchmarks/fresh_clone.py",
    }
    print(f"clone at {clone}; make run ...", flush=True)
    run_s, run_rc, stage_s = timed(["make", "run"], clone, work / "make_run.log")
    result.update(make_run_s=run_s, make_run_rc=run_rc, stage_s=stage_s)
    result["install_s"] = run_s - sum(stage_s.values())  # venv + pip install + the summary command
    reports = clone / "reports"
    stages = {}
    for name in STAGE_REPORTS:
        path = reports / f"{name}.json"
        if path.is_file():
            data = json.loads(path.read_text())
            stages[name] = {k: v for k, v in data.items() if not isinstance(v, (dict, list))}
    result["reports"] = stages
    if not args.skip_tests and result["make_run_rc"] == 0:
        print("make test ...", flush=True)
        result["make_test_s"], result["make_test_rc"], _ = timed(
            ["make", "test"], clone, work / "make_test.log"
        )
        tail = (work / "make_test.log").read_text().strip().splitlines()[-1:]
        result["make_test_summary"] = tail[0] if tail else ""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "reports"}, indent=2))
    print(f"wrote {args.out}; logs in {work}")
    if not args.keep:
        shutil.rmtree(clone, ignore_errors=True)
    return 0 if result["make_run_rc"] == 0 and result.get("make_test_rc", 0) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
