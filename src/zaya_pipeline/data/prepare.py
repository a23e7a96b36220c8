"""``zaya prepare``: obtain the raw corpus and write it as JSONL.gz, byte-for-byte reproducibly.

Sources (``data.corpus.source``):

* ``debian`` (default): the Debian documentation packages of ``data.corpus.debian_packages``, one document
  per HTML page (see ``debian.py`` and ``html_text.py``);
* ``folder``: the user's JSONL / Parquet / text / WARC files under ``data.corpus.input_dir`` and
  ``data.corpus.inputs`` (folders, files or globs; see ``folder.py``). Bad records are skipped and counted.
  Every input must lie under ``data.corpus.dvc_dep`` (by default ``input_dir``), the path dvc.yaml's prepare
  stage depends on, so that ``dvc status`` sees an edit to the corpus.

Output (``paths.raw``, built in a temporary folder and moved into place only when complete)::

    <raw>/<source-name>.jsonl.gz  {"id", "text", "metadata"} per line; gzip header without time or name
    <raw>/manifest.json           {source, sources: [{name, file, version, sha256, docs, chars}], docs, chars,
                                   rejected_docs, rejected: {reason: n}, rejected_examples, renamed_ids, ...}
    <raw>/rejects/rejects.jsonl.zst  source=folder, when anything was rejected: one line per rejected record,
                                   {file, line, reason, message, raw | raw_base64}

and the DVC metrics file ``<reports>/prepare.json`` ({docs, chars, sources: {name: {docs, chars}}} and the
same rejected_* / renamed_* keys as the manifest).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable
from pathlib import Path

from zaya_pipeline.config import ZayaConfig
from zaya_pipeline.data import debian, folder
from zaya_pipeline.errors import ConfigError, DataError
from zaya_pipeline.utils import atomic_dir, file_sha256, get_logger, write_json

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


def _rename_ids(path: Path, renames: dict[str, str]) -> None:
    """Rewrite shard ``path`` with the ids in ``renames`` replaced (same bytes otherwise)."""
    tmp = path.with_name(f".{path.name}.renaming")
    with gzip.open(path, "rt", encoding="utf-8") as src:
        rows = (json.loads(line) for line in src)
        write_jsonl_gz(tmp, ({**r, "id": renames.get(r["id"], r["id"])} for r in rows))
    tmp.replace(path)


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


def _prepare_folder(cfg: ZayaConfig, out: Path) -> tuple[list[dict], dict]:
    """One output shard per input file; returns the sources and what was rejected or renamed."""
    corpus = cfg.data.corpus
    files, ignored = folder.list_inputs(corpus)
    ledger = folder.Ledger(out / folder.REJECTS_FILE)
    reader = folder.Reader(corpus, ledger)
    sources = []
    try:
        for f in files:
            if f.kind == folder.OUTSIDE:  # never opened, not even hashed
                reader.reject_outside(f)
                log.info("%s: a symlink out of the corpus, not read", f.rel)
                continue
            file = f"{f.name}.jsonl.gz"
            before = ledger.rejected.total()
            docs, chars = write_jsonl_gz(out / file, reader.documents(f))
            rejected = ledger.rejected.total() - before
            log.info("%s: %d documents, %d characters, %d rejected", f.rel, docs, chars, rejected)
            if docs == 0:  # an input file without a usable document adds nothing: leave no empty shard
                (out / file).unlink()
            sources.append(
                {
                    "name": f.name,
                    "file": file if docs else "",
                    "path": f.rel,
                    "format": f.kind,
                    "version": "",
                    "sha256": file_sha256(f.path),
                    "docs": docs,
                    "chars": chars,
                    "rejected": rejected,
                }
            )
        for shard, renames in ledger.first_copy_renames().items():  # no copy keeps a repeated id
            _rename_ids(out / f"{shard}.jsonl.gz", renames)
    finally:
        ledger.close()
        folder.close_extractors()
    rejects = ledger.summary() | {
        "rejects_file": folder.REJECTS_FILE if ledger.rejected else "",
        "ignored_files": len(ignored),
        "ignored_examples": ignored[: folder.EXAMPLES_PER_REASON],
    }
    if not any(s["docs"] for s in sources):
        where = ", ".join(f"{k}={v}" for k, v in folder.input_specs(corpus))
        counts = ", ".join(f"{k}: {n}" for k, n in rejects["rejected"].items())
        first = "; ".join(
            f"{e['file']}:{e['line']} {e['reason']}" if e["line"] else f"{e['file']} {e['reason']}"
            for e in rejects["rejected_examples"][:5]
        )
        raise DataError(
            f"{where}: no usable document, every document is empty or rejected "
            f"(field '{corpus.text_key}', data.corpus.text_key) in "
            f"{', '.join(str(Path(v).resolve()) for _, v in folder.input_specs(corpus))}. "
            f"Rejected: {counts}. First: {first}"
        )
    return [s for s in sources if s["docs"]], rejects


NO_REJECTS = {"rejected_docs": 0, "rejected": {}, "rejected_examples": [], "renamed_ids": {}}


def prepare(cfg: ZayaConfig) -> dict:
    """Fetch/read the configured corpus into ``paths.raw``; returns a short summary."""
    source = cfg.data.corpus.source
    if source not in SOURCES:
        raise ConfigError(f"data.corpus.source={source!r} is not one of {', '.join(SOURCES)}")
    report = Path(cfg.paths.reports) / "prepare.json"
    if source == "folder":
        folder.check_dvc_dep(cfg.data.corpus)  # before anything is written: DVC must see the inputs change
    with atomic_dir(cfg.paths.raw) as out:
        if source == "debian":
            sources, rejects = _prepare_debian(cfg, out), dict(NO_REJECTS)
        else:
            sources, rejects = _prepare_folder(cfg, out)
        docs, chars = sum(s["docs"] for s in sources), sum(s["chars"] for s in sources)
        write_json(
            out / "manifest.json",
            {"source": source, "sources": sources, "docs": docs, "chars": chars, **rejects},
        )
    write_json(
        report,
        {
            "docs": docs,
            "chars": chars,
            "sources": {s["name"]: {"docs": s["docs"], "chars": s["chars"]} for s in sources},
            **rejects,
        },
    )
    return {
        "raw": cfg.paths.raw,
        "sources": len(sources),
        "docs": docs,
        "chars": chars,
        "rejected": rejects["rejected_docs"],
    }
