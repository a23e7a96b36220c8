"""``zaya prepare``: obtain the raw corpus and write it as JSONL.gz, byte-for-byte reproducibly.

Sources (``data.corpus.source``):

* ``debian`` (default): the Debian documentation packages of ``data.corpus.debian_packages``, one document
  per HTML page (see ``debian.py`` and ``html_text.py``);
* ``folder``: the user's ``*.jsonl`` / ``*.jsonl.gz`` / ``*.parquet`` files under ``data.corpus.input_dir``.

Output (``paths.raw``, built in a temporary folder and moved into place only when complete)::

    <raw>/<source-name>.jsonl.gz  {"id", "text", "metadata"} per line; gzip header without time or name
    <raw>/manifest.json           {source, sources: [{name, file, version, sha256, docs, chars}], docs, chars}

and the DVC metrics file ``<reports>/prepare.json`` ({docs, chars, sources: {name: {docs, chars}}}).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable
from pathlib import Path

from zaya_pipeline.config import ZayaConfig
from zaya_pipeline.data import debian, folder
from zaya_pipeline.errors import ConfigError, DataError
from zaya_pipeline.utils import atomic_dir, file_sha256, get_logger, remove_outputs, write_json

log = get_logger("prepare")

SOURCES = ("debian", "folder")
GZIP_LEVEL = 6


def write_jsonl_gz(path: Path, records: Iterable[dict]) -> tuple[int, int]:
    """Write records as gzipped JSON lines, gzip header fixed (mtime 0, no name); returns (docs, chars)."""
    docs = chars = 0
    with (
        open(path, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=GZIP_LEVEL) as gz,
    ):
        for rec in records:
            line = json.dumps(rec, ensure_ascii=False, default=str) + "\n"
            gz.write(line.encode("utf-8"))
            docs += 1
            chars += len(rec["text"])
    return docs, chars


def _prepare_debian(cfg: ZayaConfig, out: Path) -> list[dict]:
    corpus = cfg.data.corpus
    if not corpus.debian_packages:
        raise ConfigError(
            "data.corpus.debian_packages is empty: list at least one package (or use source=folder)"
        )
    sources = []
    for deb in debian.fetch_debs(list(corpus.debian_packages), corpus.cache_dir):
        file = f"{deb.name}.jsonl.gz"
        docs, chars = write_jsonl_gz(
            out / file, debian.deb_documents(deb, corpus.min_chars, corpus.max_docs_per_source)
        )
        log.info("%s %s: %d documents, %d characters", deb.name, deb.version, docs, chars)
        if docs == 0:
            raise DataError(
                f"package {deb.name}: no page has data.corpus.min_chars={corpus.min_chars} characters"
            )
        sources.append(
            {
                "name": deb.name,
                "file": file,
                "version": deb.version,
                "sha256": deb.sha256,
                "license": debian.LICENSES.get(deb.name, debian.UNKNOWN_LICENSE),
                "docs": docs,
                "chars": chars,
            }
        )
    return sources


def _prepare_folder(cfg: ZayaConfig, out: Path) -> list[dict]:
    corpus = cfg.data.corpus
    sources = []
    for f in folder.list_inputs(corpus.input_dir):
        file = f"{f.name}.jsonl.gz"
        docs, chars = write_jsonl_gz(
            out / file, folder.file_documents(f, corpus.text_key, corpus.id_key, corpus.max_docs_per_source)
        )
        log.info("%s: %d documents, %d characters", f.rel, docs, chars)
        if docs == 0:  # an input file with only empty texts adds nothing: leave no empty shard behind
            (out / file).unlink()
            continue
        sources.append(
            {
                "name": f.name,
                "file": file,
                "path": f.rel,
                "version": "",
                "sha256": file_sha256(f.path),
                "docs": docs,
                "chars": chars,
            }
        )
    if not sources:
        raise DataError(
            f"data.corpus.input_dir={corpus.input_dir}: every document is empty "
            f"(field '{corpus.text_key}', data.corpus.text_key) in {Path(corpus.input_dir).resolve()}"
        )
    return sources


def prepare(cfg: ZayaConfig) -> dict:
    """Fetch/read the configured corpus into ``paths.raw``; returns a short summary."""
    source = cfg.data.corpus.source
    if source not in SOURCES:
        raise ConfigError(f"data.corpus.source={source!r} is not one of {', '.join(SOURCES)}")
    report = Path(cfg.paths.reports) / "prepare.json"
    remove_outputs(cfg.paths.raw, report)  # a failed run must not leave an older corpus looking current
    with atomic_dir(cfg.paths.raw) as out:
        sources = _prepare_debian(cfg, out) if source == "debian" else _prepare_folder(cfg, out)
        docs, chars = sum(s["docs"] for s in sources), sum(s["chars"] for s in sources)
        write_json(
            out / "manifest.json", {"source": source, "sources": sources, "docs": docs, "chars": chars}
        )
    write_json(
        report,
        {
            "docs": docs,
            "chars": chars,
            "sources": {s["name"]: {"docs": s["docs"], "chars": s["chars"]} for s in sources},
        },
    )
    return {"raw": cfg.paths.raw, "sources": len(sources), "docs": docs, "chars": chars}
