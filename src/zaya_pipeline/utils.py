"""Small shared helpers: atomic outputs, JSON files, the project environment, logging."""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Offline-safe defaults for every process of the project (../shared/FACTS.md): no hub retries, no telemetry.
PROJECT_ENV = {
    "HF_HUB_OFFLINE": "1",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DVC_NO_ANALYTICS": "1",
    "DO_NOT_TRACK": "1",
    "RAY_USAGE_STATS_ENABLED": "0",  # Ray reports usage to ray.io by default and ignores DO_NOT_TRACK
    "TOKENIZERS_PARALLELISM": "false",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
}


def set_project_env() -> None:
    for key, value in PROJECT_ENV.items():
        os.environ.setdefault(key, value)


def keep_freed_memory() -> bool:
    """Ask glibc's malloc to keep freed blocks up to 32 MiB in the heap instead of returning them to the OS.

    A training step frees and reallocates the same activation-sized buffers every step; by default each one
    above 128 KiB is an mmap that is unmapped on free, so every step page-faults its activations in again.
    On the 2-core CI machine this costs ~25% of an expert-MLP step (docs/benchmarks.md). Returns False where
    there is no glibc (macOS, musl) and nothing changed."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3  # mallopt parameter ids from glibc's malloc.h
        return bool(libc.mallopt(m_mmap_threshold, 32 << 20) and libc.mallopt(m_trim_threshold, 1 << 30))
    except (OSError, AttributeError):
        return False


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(f"zaya.{name}")


def setup_logging(level: int = logging.INFO) -> None:
    """Plain timestamped lines on stderr: readable on a terminal and in CI logs alike."""
    root = logging.getLogger("zaya")
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s", "%H:%M:%S"))
        root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists on this machine."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


@contextlib.contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """Build a directory under a temporary name and move it into place only when the block succeeds.

    A crash or an error leaves the previous complete output (or nothing) at ``path``, never a partial one.
    The temporary name holds the pid: one left by a process that was killed (SIGKILL cleans up nothing) is
    removed by the next run. An output that is a symlink (a folder kept on another disk) is written through:
    the new folder is built beside the link's target and replaces it; the link stays.
    """
    path = Path(path)
    if path.is_symlink():
        path = path.resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f".{path.name}.tmp-*-*"):
        pid = stale.name.removeprefix(f".{path.name}.tmp-").split("-", 1)[0]
        if pid.isdigit() and not process_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-{os.getpid()}-", dir=path.parent))
    tmp.chmod(0o777 & ~_umask())  # mkdtemp makes 0700; the output should get the usual permissions
    try:
        yield tmp
        if path.exists():
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        tmp.rename(path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@contextlib.contextmanager
def staged_files(root: str | Path, last: tuple[str, ...] = ()) -> Iterator[Path]:
    """Write a stage's report files into a staging folder and move them into ``root`` together, only when
    the block succeeds: a run that fails half-way leaves every previous file as it was, not some new and
    some old. Files keep their paths relative to the staging folder; those named in ``last`` (e.g. the DVC
    metrics file that later stages check) move after the others. Each move is one rename."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".staged-{os.getpid()}-", dir=root))
    try:
        yield stage
        files = sorted((p for p in stage.rglob("*") if p.is_file()), key=lambda p: (p.name in last, str(p)))
        for path in files:
            target = root / path.relative_to(stage)
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(path, target)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def write_json(path: str | Path, data: Any) -> Path:
    """Write JSON atomically (temp file + rename), sorted keys, for DVC metrics and manifests."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600
    os.replace(tmp, path)
    return path


def round_up(n: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is >= ``n`` (vocabulary padding)."""
    return -(-n // multiple) * multiple


def read_json(path: str | Path) -> Any:
    with open(path) as f:
        return json.load(f)


def remove_outputs(*paths: str | Path) -> None:
    """Delete a stage's stale outputs once its new results are ready, just before it writes them: a run that
    fails earlier (a bad value, a missing input, a crash) leaves the previous outputs as they were."""
    for p in map(Path, paths):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()


def file_sha256(path: str | Path) -> str:
    """sha256 hex digest of a file, read in 1 MiB blocks."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
