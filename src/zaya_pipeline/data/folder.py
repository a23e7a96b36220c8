"""Read a user's corpus: folders, files or globs of JSONL, Parquet, plain text and WARC.

Formats, by suffix: ``*.jsonl``, ``*.jsonl.gz``, ``*.jsonl.zst`` (one JSON object per line), ``*.parquet``
(one row per document), ``*.txt`` (one document per file, id = its path) and ``*.warc`` / ``*.warc.gz``
(datatrove's ``WarcReader``: HTML responses, their text extracted by ``html_text.py`` or, with
``data.corpus.html_extractor=trafilatura``, by datatrove's Trafilatura extractor). Other files in a folder
are ignored (and counted).

Bad input is counted and survives: a record that cannot become a document (malformed JSON, invalid UTF-8,
no text field, empty or whitespace-only text, longer than ``data.corpus.max_doc_chars``, a binary or
unreadable file, ...) is skipped, counted by reason with its file and line, and its raw line is written to
the rejects file, so nothing is lost. An id that comes more than once is kept by none of its copies: they
become ``<id>#1``, ``<id>#2``, ... in input order (files by path, then line), so a document cannot take
another's id by being read first; counted, since later stages (the train/val split, dedup bookkeeping) key
on ids. A missing id becomes ``<file>:<line>``. Only a run with no usable document at all is an error
(``prepare.py``).

DVC sees the inputs through ``data.corpus.dvc_dep``, the one path dvc.yaml's prepare stage depends on
(templated from params.yaml; DVC cannot depend on a glob or a list): ``check_dvc_dep`` refuses, before
anything is read, an input outside it.
"""

from __future__ import annotations

import base64
import glob
import hashlib
import json
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zaya_pipeline.config import CorpusConfig
from zaya_pipeline.data import jsonl
from zaya_pipeline.errors import ConfigError, DataError

KINDS = {  # suffix → reader; longer suffixes first
    ".jsonl.gz": "jsonl",
    ".jsonl.zst": "jsonl",
    ".jsonl": "jsonl",
    ".parquet": "parquet",
    ".txt": "text",
    ".warc.gz": "warc",
    ".warc": "warc",
}
FORMATS = "*.jsonl(.gz|.zst), *.parquet, *.txt or *.warc(.gz)"
GLOB_CHARS = "*?["
HTML_EXTRACTORS = ("trafilatura", "builtin")
PARQUET_BATCH_ROWS = 4096
EXAMPLES_PER_REASON = 10  # rejected_examples in reports/prepare.json; the rejects file holds every one
EXTRACT_TIMEOUT_S = 10.0  # per WARC page; a page trafilatura cannot finish in this is rejected
REJECTS_FILE = "rejects/rejects.jsonl.zst"  # under paths.raw; not *.jsonl.gz, so curate never reads it


@dataclass(frozen=True)
class InputFile:
    name: str  # output name: the path under its input root, "/" → "__", data suffix dropped
    rel: str  # path under its input root (POSIX); the "source" of its documents
    path: Path
    kind: str  # a value of KINDS


def _suffix(path: Path) -> str | None:
    return next((s for s in KINDS if path.name.endswith(s)), None)


def input_specs(corpus: CorpusConfig) -> list[tuple[str, str]]:
    """(config key, folder / file / glob) of every configured input, in reading order."""
    specs = [("data.corpus.input_dir", corpus.input_dir)] if corpus.input_dir else []
    specs += [(f"data.corpus.inputs[{i}]", str(s)) for i, s in enumerate(corpus.inputs)]
    if not specs:
        raise DataError(
            f"data.corpus.input_dir and data.corpus.inputs are empty: set one to a folder, file or glob "
            f"of {FORMATS} files"
        )
    return specs


def _is_glob(spec: str) -> bool:
    return any(c in spec for c in GLOB_CHARS)


def _glob_root(pattern: str) -> Path:
    """The fixed leading folders of a glob: what its matches' names are relative to."""
    parts = Path(pattern).parts
    fixed = next(i for i, p in enumerate(parts) if _is_glob(p))
    return Path(*parts[:fixed]) if fixed else Path(".")


def _base(spec: str) -> Path:
    """The folder or file an input reads from: the spec itself, or a glob's fixed leading folders."""
    path = Path(spec).expanduser()
    return (_glob_root(str(path)) if _is_glob(spec) else path).resolve()


def check_dvc_dep(corpus: CorpusConfig) -> None:
    """Every input lies under ``data.corpus.dvc_dep``, the path dvc.yaml's prepare stage depends on, so DVC
    sees a change to any input file (a glob counts by its fixed leading folders)."""
    specs, dep = input_specs(corpus), corpus.dvc_dep
    root = None if _is_glob(dep) else Path(dep).expanduser().resolve()
    outside = [f"{k}={v}" for k, v in specs if root is None or not _inside(_base(v), root)]
    if not outside:
        return
    why = "is a glob" if root is None else f"does not hold {outside[0]}"
    common = os.path.commonpath([str(_base(v)) for _, v in specs])
    raise ConfigError(
        f"data.corpus.dvc_dep={dep} {why}: dvc.yaml's prepare stage depends on that path, so DVC would not "
        f"see your corpus change. Set data.corpus.dvc_dep={common} (a folder or file holding every input)"
    )


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _expand(key: str, spec: str) -> list[tuple[Path, Path]]:
    """(root, file) pairs of one input; the root is what output names and sources are relative to."""
    if _is_glob(spec):
        pattern = str(Path(spec).expanduser())
        root = _glob_root(pattern)
        matches = sorted(Path(m) for m in glob.glob(pattern, recursive=True))
        if not matches:
            raise DataError(f"{key}={spec}: the pattern matches no file or folder")
        pairs = []
        for m in matches:
            pairs += [(root, p) for p in sorted(m.rglob("*")) if p.is_file()] if m.is_dir() else [(root, m)]
        return pairs
    path = Path(spec).expanduser()
    if path.is_dir():
        return [(path, p) for p in sorted(path.rglob("*")) if p.is_file()]
    if path.is_file():
        return [(path.parent, path)]
    raise DataError(f"{key}={spec}: no such folder or file ({path.resolve()})")


def list_inputs(corpus: CorpusConfig) -> tuple[list[InputFile], list[str]]:
    """The data files of every configured input (each file once) and the ignored files' paths."""
    specs = input_specs(corpus)
    seen: set[Path] = set()
    chosen: list[tuple[str, Path, str]] = []
    ignored: list[str] = []
    for key, spec in specs:
        for root, path in _expand(key, spec):
            if path.resolve() in seen:
                continue
            seen.add(path.resolve())
            suffix = _suffix(path)
            if suffix is None:
                ignored.append(str(path))
                continue
            chosen.append((path.relative_to(root).as_posix(), path, suffix))
    if not chosen:
        where = ", ".join(f"{k}={v}" for k, v in specs)
        raise DataError(
            f"{where}: no {FORMATS} files in {', '.join(str(Path(v).resolve()) for _, v in specs)}"
        )
    names = [rel[: -len(suffix)].replace("/", "__") for rel, _, suffix in chosen]
    # a.jsonl beside a.parquet would collide: those keep their suffix; the same path under two roots, a number
    clash = {n for n in names if names.count(n) > 1}
    names = [
        rel.replace("/", "__") if n in clash else n for n, (rel, _, _) in zip(names, chosen, strict=True)
    ]
    taken: Counter = Counter()
    files = []
    for name, (rel, path, suffix) in zip(names, chosen, strict=True):
        taken[name] += 1
        unique = name if taken[name] == 1 else f"{name}-{taken[name]}"
        files.append(InputFile(unique, rel, path, KINDS[suffix]))
    return files, ignored


@dataclass
class Ledger:
    """What the folder source did not pass on unchanged: rejected records and renamed ids."""

    rejects_path: Path  # written only once something is rejected
    rejected: Counter = field(default_factory=Counter)  # reason → records
    renamed: Counter = field(default_factory=Counter)  # duplicate_id / missing_id → documents
    examples: list[dict] = field(default_factory=list)  # first EXAMPLES_PER_REASON per reason
    renamed_examples: list[dict] = field(default_factory=list)
    ids: dict[str, int] = field(default_factory=dict)  # id → how often it came
    first: dict[str, tuple[str, str, int | None]] = field(default_factory=dict)  # id → (shard, file, line)
    _out: Any = None
    _raw: Any = None

    def reject(self, f: InputFile, line: int | None, reason: str, message: str, raw: bytes | str | None):
        """Count a rejected record (a whole file: ``line`` None); keep its raw bytes in the rejects file."""
        self.rejected[reason] += 1
        entry = {"file": f.rel, "line": line, "reason": reason, "message": message}
        if self.rejected[reason] <= EXAMPLES_PER_REASON:
            self.examples.append(dict(entry))
        if isinstance(raw, bytes):
            try:
                entry["raw"] = raw.decode("utf-8")
            except UnicodeDecodeError:
                entry["raw_base64"] = base64.b64encode(raw).decode("ascii")
        elif raw is not None:
            entry["raw"] = raw
        self._write(json.dumps(entry, ensure_ascii=True) + "\n")

    def unique_id(self, f: InputFile, line: int | None, doc_id: str | None) -> str:
        default = f"{f.rel}:{line}" if line is not None else f.rel
        if doc_id is None:
            self._rename(f.rel, line, "missing_id", "", default)
            doc_id = default
        n = self.ids.get(doc_id, 0) + 1
        self.ids[doc_id] = n
        if n == 1:
            self.first[doc_id] = (f.name, f.rel, line)
            return doc_id
        new = f"{doc_id}#{n}"
        while new in self.ids:  # "<id>#2" may itself be an id of the input
            n += 1
            new = f"{doc_id}#{n}"
        self.ids[doc_id] = n
        self.ids[new] = 1
        self._rename(f.rel, line, "duplicate_id", doc_id, new)
        return new

    def first_copy_renames(self) -> dict[str, dict[str, str]]:
        """After the last file: the new ids (``<id>#1``, or the next free number) of the first copies of
        repeated ids, by the name of the shard that holds them; counted like the other renames."""
        out: dict[str, dict[str, str]] = {}
        for doc_id, (shard, rel, line) in self.first.items():
            if self.ids[doc_id] < 2:
                continue
            n, new = self.ids[doc_id], f"{doc_id}#1"
            while new in self.ids:
                n += 1
                new = f"{doc_id}#{n}"
            self.ids[doc_id], self.ids[new] = n, 1
            self._rename(rel, line, "duplicate_id", doc_id, new)
            out.setdefault(shard, {})[doc_id] = new
        return out

    def _rename(self, rel: str, line: int | None, reason: str, old: str, new: str) -> None:
        self.renamed[reason] += 1
        if self.renamed[reason] <= EXAMPLES_PER_REASON:
            self.renamed_examples.append(
                {"file": rel, "line": line, "reason": reason, "id": old, "new_id": new}
            )

    def _write(self, text: str) -> None:
        if self._out is None:
            import zstandard

            self.rejects_path.parent.mkdir(parents=True, exist_ok=True)
            self._raw = open(self.rejects_path, "wb")  # noqa: SIM115 (closed in close())
            self._out = zstandard.ZstdCompressor(level=3).stream_writer(self._raw)
        self._out.write(text.encode("utf-8"))

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._raw.close()
            self._out = self._raw = None

    def summary(self) -> dict:
        return {
            "rejected_docs": sum(self.rejected.values()),
            "rejected": dict(sorted(self.rejected.items())),
            "rejected_examples": self.examples,
            "renamed_ids": dict(sorted(self.renamed.items())),
            "renamed_examples": self.renamed_examples,
        }


@dataclass
class Reader:
    """Turns the rows of one input file into ``{id, text, metadata}`` records, or rejects them."""

    corpus: CorpusConfig
    ledger: Ledger

    def documents(self, f: InputFile) -> Iterator[dict]:
        """Records of one input file in file order; ``data.corpus.max_docs_per_source`` > 0 caps them."""
        rows = getattr(self, f"_{f.kind}_records")(f)
        cap = self.corpus.max_docs_per_source
        for kept, rec in enumerate(rows, start=1):
            yield rec
            if cap and kept >= cap:
                return

    # -- one record -----------------------------------------------------------------------------------------
    def _from_row(self, f: InputFile, line: int, row: dict, raw: bytes | str | None) -> dict | None:
        where, key = f"{f.path}:{line}", self.corpus.text_key
        if raw is None:
            raw = json.dumps(row, ensure_ascii=False, default=str)
        if key not in row:
            return self._reject(
                f, line, "missing_text", f"{where}: no field '{key}' (data.corpus.text_key)", raw
            )
        row = dict(row)
        text = row.pop(key)
        if text is not None and not isinstance(text, str):
            msg = f"{where}: field '{key}' is a {type(text).__name__}, not a string"
            return self._reject(f, line, "text_not_string", msg, raw)
        doc_id = None
        if self.corpus.id_key and row.get(self.corpus.id_key) not in (None, ""):
            doc_id = str(row.pop(self.corpus.id_key))
        elif not self.corpus.id_key:
            doc_id = f"{f.rel}:{line}"
        nested = row.pop("metadata", None)
        metadata = {"source": f.rel, "line": line, **row}
        if isinstance(nested, dict):
            metadata.update(nested)
        elif nested is not None:
            metadata["metadata"] = nested
        return self._document(f, line, text or "", doc_id, metadata, raw)

    def _document(
        self, f: InputFile, line: int | None, text: str, doc_id: str | None, metadata: dict, raw: Any
    ) -> dict | None:
        where = f"{f.path}:{line}" if line is not None else str(f.path)
        if not text:
            return self._reject(f, line, "empty", f"{where}: empty text", raw)
        if text.isspace():
            return self._reject(f, line, "whitespace_only", f"{where}: text is only whitespace", raw)
        cap = self.corpus.max_doc_chars
        if cap and len(text) > cap:
            msg = f"{where}: {len(text)} characters > data.corpus.max_doc_chars={cap}"
            return self._reject(f, line, "too_long", msg, raw)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # a JSON "\ud800" escape: valid JSON, not writable as UTF-8
            msg = f"{where}: invalid UTF-8 (lone surrogate at character {exc.start})"
            return self._reject(f, line, jsonl.INVALID_UTF8, msg, raw)
        return {"id": self.ledger.unique_id(f, line, doc_id), "text": text, "metadata": metadata}

    def _reject(self, f: InputFile, line: int | None, reason: str, message: str, raw: Any) -> None:
        self.ledger.reject(f, line, reason, message, raw)
        return None

    def _reject_file(self, f: InputFile, reason: str, message: str) -> None:
        size = f.path.stat().st_size
        digest = hashlib.sha256(f.path.read_bytes()).hexdigest()
        self._reject(f, None, reason, f"{message} ({size} bytes, sha256 {digest})", None)

    # -- one file, by kind ----------------------------------------------------------------------------------
    def _jsonl_records(self, f: InputFile) -> Iterator[dict]:
        if jsonl.looks_binary(jsonl.sniff(f.path)):
            return self._reject_file(f, "binary_file", f"{f.path}: binary data (NUL bytes), not JSON lines")
        for line, row in jsonl.scan_jsonl(f.path):
            if isinstance(row, jsonl.BadLine):
                self._reject(f, line, row.reason, row.message, row.raw)
            elif (rec := self._from_row(f, line, row, None)) is not None:
                yield rec

    def _parquet_records(self, f: InputFile) -> Iterator[dict]:
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(f.path)
        except Exception as exc:  # pyarrow raises several types for a file that is not Parquet
            return self._reject_file(
                f, jsonl.UNREADABLE_FILE, f"{f.path}: not a readable Parquet file ({exc})"
            )
        names = pf.schema_arrow.names
        if self.corpus.text_key not in names:
            msg = f"{f.path}: no column '{self.corpus.text_key}' (data.corpus.text_key); columns: {names}"
            return self._reject_file(f, "missing_text", msg)
        row_no = 0
        try:
            for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS):
                for row in batch.to_pylist():
                    row_no += 1
                    if (rec := self._from_row(f, row_no, row, None)) is not None:
                        yield rec
        except OSError as exc:  # a damaged row group
            msg = f"{f.path}:{row_no + 1}: cannot read ({exc})"
            self._reject(f, row_no + 1, jsonl.UNREADABLE_FILE, msg, None)

    def _text_records(self, f: InputFile) -> Iterator[dict]:
        data = f.path.read_bytes()
        if jsonl.looks_binary(data[: jsonl.SNIFF_BYTES]):
            return self._reject_file(f, "binary_file", f"{f.path}: binary data (NUL bytes), not text")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            msg = f"{f.path}: invalid UTF-8 ({exc.reason} at byte {exc.start})"
            return self._reject(f, None, jsonl.INVALID_UTF8, msg, data)
        if (rec := self._document(f, None, text, f.rel, {"source": f.rel}, data)) is not None:
            yield rec

    def _warc_records(self, f: InputFile) -> Iterator[dict]:
        from datatrove.pipeline.readers import WarcReader

        extract = html_extractor(self.corpus.html_extractor)
        reader = WarcReader(str(f.path.parent), glob_pattern=f.path.name, recursive=False)
        record = 0
        try:
            for doc in reader.read_file(f.path.name):
                record += 1
                text, reason, message = extract(doc.text)
                where = f"{f.path}:{record}"
                if reason:
                    self._reject(f, record, reason, f"{where}: {message}", doc.text)
                    continue
                meta = {"source": f.rel, "line": record, **doc.metadata}
                if (rec := self._document(f, record, text, doc.id, meta, doc.text)) is not None:
                    yield rec
        except Exception as exc:  # warcio's ArchiveLoadFailed and gzip errors on a damaged archive
            msg = f"{f.path}:{record + 1}: cannot read the WARC file ({type(exc).__name__}: {exc})"
            self._reject(f, record + 1, jsonl.UNREADABLE_FILE, msg, None)


def html_extractor(name: str):
    """A function html → (text, reject reason, message) for ``data.corpus.html_extractor``."""
    if name not in HTML_EXTRACTORS:
        raise ConfigError(f"data.corpus.html_extractor={name!r} is not one of {', '.join(HTML_EXTRACTORS)}")
    if name == "builtin":
        from zaya_pipeline.data.html_text import html_to_text

        return lambda html: (html_to_text(html), "", "")
    try:  # in this process first: the sandbox's child would only log the failure and time out
        import trafilatura  # noqa: F401
    except ImportError as exc:  # trafilatura 1.x with lxml >= 5.2 also needs lxml_html_clean
        why = " ".join(str(exc).split())
        raise ConfigError(
            f"data.corpus.html_extractor=trafilatura cannot be used ({why}); use builtin"
        ) from None
    return _trafilatura


_SANDBOX: dict = {}


def _trafilatura(html: str) -> tuple[str, str, str]:
    """datatrove's Trafilatura extractor in datatrove's sandbox process (which enforces the time limit)."""
    from datatrove.pipeline.extractors import Trafilatura
    from datatrove.pipeline.extractors.base import ExtractorSandbox

    if not _SANDBOX:
        _SANDBOX["extractor"] = Trafilatura(timeout=EXTRACT_TIMEOUT_S)
        _SANDBOX["sandbox"] = ExtractorSandbox(timeout=EXTRACT_TIMEOUT_S)
    try:
        text = _SANDBOX["sandbox"].process_document(html, _SANDBOX["extractor"].extract)
    except TimeoutError:
        return "", "extraction_timeout", f"HTML extraction took over {EXTRACT_TIMEOUT_S} s"
    except Exception as exc:  # trafilatura's own errors, or its process died
        return "", "extraction_failed", f"HTML extraction failed ({type(exc).__name__}: {exc})"
    if not text:
        return "", "no_text_extracted", "no main text in the HTML page"
    return text, "", ""


def close_extractors() -> None:
    """Stop the extraction process, if one was started."""
    if _SANDBOX:
        _SANDBOX.pop("sandbox").__exit__(None, None, None)
        _SANDBOX.clear()
