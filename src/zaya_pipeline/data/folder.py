"""Read a user's corpus: folders, files or globs of JSONL, Parquet, plain text and WARC.

Formats, by suffix: ``*.jsonl``, ``*.jsonl.gz``, ``*.jsonl.zst`` (one JSON object per line), ``*.parquet``
(one row per document), ``*.txt`` (one document per file, id = its path) and ``*.warc`` / ``*.warc.gz``
(datatrove's ``WarcReader``: HTML responses, their text extracted by ``html_text.py`` or, with
``data.corpus.html_extractor=trafilatura``, by datatrove's Trafilatura extractor). Other files in a folder
are ignored (and counted).

A corpus reads only itself: under a folder or a glob's fixed leading folders (the input's root), a symlink
that resolves outside that root is never opened, but rejected (``outside_corpus``) with its path; symlinked
folders are never entered (one inside the root holds files read through their own paths). A file named by
itself in ``data.corpus.inputs`` is read wherever it points (``check_dvc_dep`` has checked its target).

Bad input is counted and survives: a record that cannot become a document (malformed JSON, invalid UTF-8,
no text field, empty or whitespace-only text, longer than ``data.corpus.max_doc_chars``, a binary or
unreadable file, JSON nested too deep for Python, a Parquet value Python cannot hold, ...) is skipped,
counted by reason with its file and line, and its raw line is written to the rejects file, so nothing is
lost. An id that comes more than once is kept by none of its copies: they become ``<id>#1``, ``<id>#2``, ...
in input order (files by path, then line), so a document cannot take another's id by being read first;
counted, since later stages (the train/val split, dedup bookkeeping) key on ids. A missing id becomes
``<file>:<line>``. Only a run with no usable document at all is an error (``prepare.py``).

Memory is bounded whatever a file holds: a JSONL line or a text file longer than any record of
``max_doc_chars`` characters can be is read on in pieces (decompressed as it goes) and dropped, never held
whole; its rejects entry has its size and sha256 instead of its bytes. Parquet is read a batch at a time.

DVC sees the inputs through ``data.corpus.dvc_dep``, the one path dvc.yaml's prepare stage depends on
(templated from params.yaml; DVC cannot depend on a glob or a list): ``check_dvc_dep`` refuses, before
anything is read, an input outside it.
"""

from __future__ import annotations

import base64
import fnmatch
import json
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zaya_pipeline.config import CorpusConfig
from zaya_pipeline.data import jsonl
from zaya_pipeline.errors import ConfigError, DataError, first_line
from zaya_pipeline.utils import file_sha256

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
OUTSIDE = "outside"  # the kind of a symlink out of its input's root: rejected, never opened
OUTSIDE_CORPUS = "outside_corpus"
BAD_VALUE = "bad_value"  # a Parquet value Python cannot hold (a date after the year 9999)
# A JSON line whose text has at most max_doc_chars characters is at most 12 bytes a character long (the
# longest JSON spelling of one, "\ud83d\ude00"), plus its other fields: a longer line is dropped unparsed.
JSON_BYTES_PER_CHAR = 12
OTHER_FIELDS_BYTES = 1 << 20
UTF8_BYTES_PER_CHAR = 4  # a .txt file longer than 4 x max_doc_chars bytes is dropped undecoded
EXAMPLES_PER_REASON = 10  # rejected_examples in reports/prepare.json; the rejects file holds every one
EXTRACT_TIMEOUT_S = 10.0  # per WARC page; a page trafilatura cannot finish in this is rejected
REJECTS_FILE = "rejects/rejects.jsonl.zst"  # under paths.raw; not *.jsonl.gz, so curate never reads it


@dataclass(frozen=True)
class InputFile:
    name: str  # output name: the path under its input root, "/" → "__", data suffix dropped
    rel: str  # path under its input root (POSIX); the "source" of its documents
    path: Path
    kind: str  # a value of KINDS, or OUTSIDE
    root: Path  # the input's root: its folder, a glob's fixed leading folders, a named file's folder


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


def _expand(key: str, spec: str) -> list[tuple[Path, Path, bool]]:
    """(root, path, outside) of every file of one input, and of every symlink under a folder or glob
    (``outside``: it resolves out of the root); the root is what output names and sources are relative to."""
    path = Path(spec).expanduser()
    if _is_glob(spec):
        root = _glob_root(str(path))
        found = list(_walk(root, path.parts[len(root.parts) :])) if root.is_dir() else []
        if not found:
            raise DataError(f"{key}={spec}: the pattern matches no file or folder")
        return [(root, p, _leaves(root, p)) for p in found]
    if path.is_dir():
        return [(path, p, _leaves(path, p)) for p in _walk(path, None)]
    if path.is_file():  # named by itself: read wherever it points
        return [(path.parent, path, False)]
    raise DataError(f"{key}={spec}: no such folder or file ({path.resolve()})")


def _leaves(root: Path, path: Path) -> bool:
    return path.is_symlink() and not _inside(path.resolve(), root.resolve())


def _walk(top: Path, pattern: tuple[str, ...] | None, parts: tuple[str, ...] = ()) -> Iterator[Path]:
    """In sorted order, the files below ``top`` whose path from it matches ``pattern`` (a glob's parts after
    its root; None: all), whole folders it matches, and the symlinks among them or (folders) on the way to a
    match. Symlinked folders are never entered, so a link cannot lead the walk out of the root or round in
    a loop."""
    if pattern is not None and _matches(pattern, parts):
        pattern = None
    try:
        with os.scandir(top) as it:
            entries = sorted(it, key=lambda e: e.name)
    except OSError:  # an unreadable folder, as glob and rglob skip it
        return
    for entry in entries:
        here, path = (*parts, entry.name), top / entry.name
        whole = pattern is None or _matches(pattern, here)
        if entry.is_symlink():
            if whole or (entry.is_dir() and _matches(pattern, here, partial=True)):
                yield path
        elif entry.is_dir():
            if whole or _matches(pattern, here, partial=True):
                yield from _walk(path, pattern, here)
        elif whole and entry.is_file():
            yield path


def _matches(pattern: tuple[str, ...], parts: tuple[str, ...], partial: bool = False) -> bool:
    """Whether a path below a glob's root matches the rest of the glob as ``glob.glob`` reads it (``**``: any
    folders; a wildcard matches no name that starts with "."), or with ``partial`` may lead to a match."""
    if not parts:
        return partial or all(p == "**" for p in pattern)
    if not pattern:
        return False
    head, rest, name = pattern[0], pattern[1:], parts[0]
    if head == "**":
        deeper = not name.startswith(".") and _matches(pattern, parts[1:], partial)
        return deeper or _matches(rest, parts, partial)
    visible = not name.startswith(".") or head.startswith(".")
    return visible and fnmatch.fnmatchcase(name, head) and _matches(rest, parts[1:], partial)


def list_inputs(corpus: CorpusConfig) -> tuple[list[InputFile], list[str]]:
    """The data files of every configured input (each file once, and each symlink out of its input's root,
    kind ``OUTSIDE``) and the ignored files' paths."""
    specs = input_specs(corpus)
    seen: set[Path] = set()
    chosen: list[tuple[str, Path, str, Path]] = []
    outside: list[InputFile] = []
    ignored: list[str] = []
    for key, spec in specs:
        for root, path, leaves in _expand(key, spec):
            rel = path.relative_to(root).as_posix()
            if leaves:  # keyed by the link itself: its target is never looked at again
                if path.absolute() not in seen:
                    seen.add(path.absolute())
                    outside.append(InputFile("", rel, path, OUTSIDE, root))
                continue
            if not path.is_file() or path.resolve() in seen:  # a folder or broken link inside; a repeat
                continue
            seen.add(path.resolve())
            suffix = _suffix(path)
            if suffix is None:
                ignored.append(str(path))
                continue
            chosen.append((rel, path, suffix, root))
    if not chosen and not outside:
        where = ", ".join(f"{k}={v}" for k, v in specs)
        raise DataError(
            f"{where}: no {FORMATS} files in {', '.join(str(Path(v).resolve()) for _, v in specs)}"
        )
    names = [rel[: -len(suffix)].replace("/", "__") for rel, _, suffix, _ in chosen]
    # a.jsonl beside a.parquet would collide: those keep their suffix; the same path under two roots, a number
    clash = {n for n in names if names.count(n) > 1}
    names = [rel.replace("/", "__") if n in clash else n for n, (rel, *_) in zip(names, chosen, strict=True)]
    taken: Counter = Counter()
    files = []
    for name, (rel, path, suffix, root) in zip(names, chosen, strict=True):
        taken[name] += 1
        unique = name if taken[name] == 1 else f"{name}-{taken[name]}"
        files.append(InputFile(unique, rel, path, KINDS[suffix], root))
    return files + outside, ignored


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
            return self._reject(f, line, jsonl.TOO_LONG, msg, raw)
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:  # a JSON "\ud800" escape: valid JSON, not writable as UTF-8
            msg = f"{where}: invalid UTF-8 (lone surrogate at character {exc.start})"
            return self._reject(f, line, jsonl.INVALID_UTF8, msg, raw)
        if unwritable := _unwritable({"id": doc_id, "text": text, "metadata": metadata}):
            return self._reject(f, line, unwritable[0], f"{where}: {unwritable[1]}", raw)
        return {"id": self.ledger.unique_id(f, line, doc_id), "text": text, "metadata": metadata}

    def _reject(self, f: InputFile, line: int | None, reason: str, message: str, raw: Any) -> None:
        self.ledger.reject(f, line, reason, message, raw)
        return None

    def _reject_file(self, f: InputFile, reason: str, message: str) -> None:
        size, digest = f.path.stat().st_size, file_sha256(f.path)
        self._reject(f, None, reason, f"{message} ({size} bytes, sha256 {digest})", None)

    def reject_outside(self, f: InputFile) -> None:
        """Count a symlink out of its input's root; what it points to is never opened."""
        target, root = f.path.resolve(), f.root.resolve()
        msg = f"{f.path}: a symlink to {target}, outside the input's root {root}; not read"
        self._reject(f, None, OUTSIDE_CORPUS, msg, None)

    # -- one file, by kind ----------------------------------------------------------------------------------
    def _jsonl_records(self, f: InputFile) -> Iterator[dict]:
        if jsonl.looks_binary(jsonl.sniff(f.path)):
            return self._reject_file(f, "binary_file", f"{f.path}: binary data (NUL bytes), not JSON lines")
        cap = self.corpus.max_doc_chars
        limit = cap * JSON_BYTES_PER_CHAR + OTHER_FIELDS_BYTES if cap else 0
        why = f", the most a record of data.corpus.max_doc_chars={cap} characters takes"
        for line, row in jsonl.scan_jsonl(f.path, limit, why):
            if isinstance(row, jsonl.BadLine):
                self._reject(f, line, row.reason, row.message, row.raw or None)
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
        first = 1
        for group in range(pf.num_row_groups):
            yield from self._row_group(f, pf, group, first)
            first += pf.metadata.row_group(group).num_rows

    def _row_group(self, f: InputFile, pf: Any, group: int, first: int) -> Iterator[dict]:
        """The records of one row group (rows ``first``...); a damaged group costs only its unread rows."""
        import pyarrow as pa

        row_no = first - 1
        try:
            for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS, row_groups=[group]):
                for row, bad in _batch_rows(batch):
                    row_no += 1
                    if bad is not None:
                        self._reject(f, row_no, bad[0], f"{f.path}:{row_no}: {bad[1]}", bad[2])
                    elif (rec := self._from_row(f, row_no, row, None)) is not None:
                        yield rec
        except (OSError, pa.ArrowException) as exc:  # a damaged row group
            last, groups = first + pf.metadata.row_group(group).num_rows - 1, pf.num_row_groups
            what = f"rows {row_no + 1}-{last} (row group {group + 1} of {groups}) cannot be read"
            msg = f"{f.path}:{row_no + 1}: {what} ({first_line(exc)})"
            self._reject(f, row_no + 1, jsonl.UNREADABLE_FILE, msg, None)

    def _text_records(self, f: InputFile) -> Iterator[dict]:
        cap = self.corpus.max_doc_chars
        limit = cap * UTF8_BYTES_PER_CHAR if cap else -1
        with open(f.path, "rb") as fh:
            data = fh.read(limit + 1 if cap else -1)
        if jsonl.looks_binary(data[: jsonl.SNIFF_BYTES]):
            return self._reject_file(f, "binary_file", f"{f.path}: binary data (NUL bytes), not text")
        if cap and len(data) > limit:
            del data
            msg = f"{f.path}: over {limit} bytes, more than data.corpus.max_doc_chars={cap} characters take"
            return self._reject_file(f, jsonl.TOO_LONG, f"{msg} in UTF-8; not decoded")
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


def _unwritable(record: dict) -> tuple[str, str] | None:
    """(reason, message) when a record cannot become a UTF-8 JSON line as prepare writes it, else None."""
    try:
        json.dumps(record, ensure_ascii=False, default=str).encode("utf-8")
    except UnicodeEncodeError as exc:  # a "\udc80" escape in the id or another field
        return jsonl.INVALID_UTF8, f"invalid UTF-8 in a field (lone surrogate at {exc.start} of the record)"
    except RecursionError:
        return jsonl.TOO_DEEP, "fields nested deeper than Python's JSON writer allows"
    return None


def _batch_rows(batch: Any) -> list[tuple[dict, tuple[str, str, bytes | None] | None]]:
    """The rows of a Parquet batch as dicts, each with why it is bad ((reason, message, raw)) or None: a
    value Python cannot hold (bytes that are not UTF-8, a date after 9999) spoils only its row."""
    try:
        return [(row, None) for row in batch.to_pylist()]
    except (ValueError, OverflowError):  # UnicodeDecodeError is a ValueError
        pass
    names, columns, bad = batch.schema.names, [], {}
    for name, column in zip(names, batch.columns, strict=True):
        values = []
        for i in range(len(column)):
            try:
                values.append(column[i].as_py())
            except (ValueError, OverflowError) as exc:
                values.append(None)
                bad.setdefault(i, _bad_value(name, column, i, exc))
        columns.append(values)
    return [
        (dict(zip(names, row, strict=True)), bad.get(i)) for i, row in enumerate(zip(*columns, strict=True))
    ]


def _bad_value(name: str, column: Any, i: int, exc: Exception) -> tuple[str, str, bytes | None]:
    import pyarrow as pa

    if not isinstance(exc, UnicodeDecodeError):
        return BAD_VALUE, f"column '{name}': not a Python value ({first_line(exc)})", None
    binary = {pa.string(): pa.binary(), pa.large_string(): pa.large_binary()}.get(column.type)
    raw = column.view(binary)[i].as_py() if binary else None
    return jsonl.INVALID_UTF8, f"column '{name}': invalid UTF-8 ({exc.reason} at byte {exc.start})", raw


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
