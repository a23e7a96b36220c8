"""Fetch Debian documentation packages (``apt-get download``) and turn their HTML pages into documents.

Downloads are cached per package (``<cache>/<name>_<version>_<arch>.deb``) and reused. A machine whose apt
lists were never fetched (a fresh container) still works: when the system lists do not know the package we
run ``apt-get update`` into private lists under the cache folder, which needs no change to the system.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from zaya_pipeline.data.html_text import html_to_text, strip_template_lines
from zaya_pipeline.errors import DataError
from zaya_pipeline.utils import file_sha256, get_logger

log = get_logger("prepare")

LICENSES = {"sqlite3-doc": "public domain", "postgresql-doc-15": "PostgreSQL License"}
UNKNOWN_LICENSE = "see the package's copyright file"
APT_TIMEOUT_S = 600  # one apt-get call (a download of a few MB, or an update of the package lists)
# Fail fast on a dead mirror instead of apt's default retries and long connect timeouts.
APT_NET_OPTS = [
    "-o",
    "Acquire::Retries=1",
    "-o",
    "Acquire::http::Timeout=30",
    "-o",
    "Acquire::https::Timeout=30",
]
FOLDER_HINT = (
    "To use your own corpus instead, point the stage at a folder of *.jsonl / *.jsonl.gz / *.parquet files: "
    "zaya prepare data.corpus.source=folder data.corpus.input_dir=/path/to/jsonl"
)


@dataclass(frozen=True)
class Deb:
    name: str
    path: Path
    version: str
    sha256: str


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "zaya_pipeline" / "debs"


def _run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=APT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"timed out after {APT_TIMEOUT_S} s")


def _last_error(proc: subprocess.CompletedProcess) -> str:
    lines = [ln.strip() for ln in (proc.stderr or proc.stdout or "").splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("E:")]
    return (errors or lines or [f"exit status {proc.returncode}"])[-1]


def _private_apt_opts(cache: Path) -> list[str]:
    lists, apt_cache = cache / "apt" / "lists", cache / "apt" / "cache"
    (lists / "partial").mkdir(parents=True, exist_ok=True)
    (apt_cache / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    return ["-o", f"Dir::State::Lists={lists}", "-o", f"Dir::Cache={apt_cache}"]


def _download(name: str, cache: Path) -> Path:
    """``apt-get download name`` into ``cache``: system lists first, then private lists (updated here)."""
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=cache))
    try:
        proc = _run(["apt-get", "-q", *APT_NET_OPTS, "download", name], cwd=tmp)
        if proc.returncode != 0:
            log.info(
                "%s: not downloadable with the system apt lists (%s); fetching private lists into %s",
                name,
                _last_error(proc),
                cache / "apt",
            )
            private = _private_apt_opts(cache)
            update = _run(["apt-get", "-q", *APT_NET_OPTS, *private, "update"])
            if update.returncode != 0:
                raise DataError(
                    f"apt-get update (private lists under {cache / 'apt'}) failed: {_last_error(update)}"
                )
            proc = _run(["apt-get", "-q", *APT_NET_OPTS, *private, "download", name], cwd=tmp)
            if proc.returncode != 0:
                raise DataError(f"apt-get download {name} failed: {_last_error(proc)}")
        debs = sorted(tmp.glob(f"{name}_*.deb"))
        if len(debs) != 1:
            raise DataError(f"apt-get download {name} left {len(debs)} .deb files in {tmp}, expected one")
        final = cache / debs[0].name
        debs[0].replace(final)
        return final
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def fetch_debs(names: list[str], cache_dir: str) -> list[Deb]:
    """The cached or downloaded .deb of each package; one DataError lists every package that failed."""
    cache = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(
            f"cannot create the .deb cache folder {cache} (data.corpus.cache_dir): {exc}"
        ) from None
    debs, failures = [], []
    for name in names:
        cached = sorted(cache.glob(f"{name}_*.deb"))
        try:
            if cached:
                path = cached[-1]
                log.info("%s: using cached %s", name, path)
            elif shutil.which("apt-get") is None:
                raise DataError("apt-get is not installed on this system")
            else:
                log.info("%s: downloading with apt-get into %s", name, cache)
                path = _download(name, cache)
            if shutil.which("dpkg-deb") is None:
                raise DataError("dpkg-deb is not installed on this system (needed to unpack the .deb)")
            proc = _run(["dpkg-deb", "-f", str(path), "Version"])
            if proc.returncode != 0:
                raise DataError(
                    f"dpkg-deb cannot read {path} (delete it to download again): {_last_error(proc)}"
                )
            debs.append(Deb(name, path, proc.stdout.strip(), file_sha256(path)))
        except DataError as exc:
            failures.append(f"{name}: {exc}")
    if failures:
        raise DataError(
            "cannot obtain the Debian documentation package(s) of data.corpus.debian_packages:\n  "
            + "\n  ".join(failures)
            + f"\n{FOLDER_HINT}"
        )
    return debs


def _doc_root(pages: list[Path]) -> Path:
    """The deepest folder holding every page (e.g. ``usr/share/doc/postgresql-doc-15/html``)."""
    return Path(os.path.commonpath([p.parent for p in pages]))


@dataclass(frozen=True)
class Page:
    rel: str  # path under the package's documentation root (the document id is <package>/<rel>)
    installed: str  # where the package installs it, e.g. /usr/share/doc/sqlite3/vtab.html
    file: Path  # the unpacked copy


@contextmanager
def unpacked_pages(deb: Deb) -> Iterator[list[Page]]:
    """The HTML pages of ``deb``, sorted by ``rel``, unpacked into a temporary folder removed on exit."""
    with tempfile.TemporaryDirectory(prefix=f"zaya-{deb.name}-") as tmp:
        proc = _run(["dpkg-deb", "-x", str(deb.path), tmp])
        if proc.returncode != 0:
            raise DataError(
                f"dpkg-deb -x {deb.path} failed: {_last_error(proc)} (delete the cached file to refetch)"
            )
        files = sorted(f for f in Path(tmp).rglob("*.html") if f.is_file())  # octave-doc has *.html folders
        if not files:
            raise DataError(f"package {deb.name} ({deb.path}) contains no HTML pages")
        root = _doc_root(files)
        pages = [Page(f.relative_to(root).as_posix(), "/" + f.relative_to(tmp).as_posix(), f) for f in files]
        yield sorted(pages, key=lambda p: p.rel)


def deb_documents(deb: Deb, min_chars: int, max_docs: int) -> Iterator[dict]:
    """One record per HTML page with at least ``min_chars`` characters of text, sorted by path. The
    package's template lines (a tagline or project name atop every page) are stripped across its pages."""
    license_ = LICENSES.get(deb.name, UNKNOWN_LICENSE)
    with unpacked_pages(deb) as pages:
        texts = strip_template_lines([html_to_text(page.file.read_bytes()) for page in pages])
    kept = 0
    for page, text in zip(pages, texts, strict=True):
        if len(text) < min_chars:
            continue
        meta = {"source": deb.name, "version": deb.version, "path": page.installed, "license": license_}
        yield {"id": f"{deb.name}/{page.rel}", "text": text, "metadata": meta}
        kept += 1
        if max_docs and kept >= max_docs:
            break
