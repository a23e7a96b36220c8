"""The project's one JSONL reader: plain, ``.gz`` or ``.zst`` files, one JSON object per line.

Two ways to read, with the same wording for every problem (``<file>:<line>: <what>``):

* ``read_jsonl`` is strict: the first bad line raises ``DataError`` (curated shards, eval task files, where a
  bad line means a bug upstream);
* ``scan_jsonl`` is tolerant: a bad line comes back as a ``BadLine`` with its reason and raw bytes, and
  reading goes on (the prepare stage, where user input is counted and survives).

Lines are read as bytes and decoded one by one, so a line of invalid UTF-8, or of JSON that Python's parser
refuses (nested too deep, a number of thousands of digits), spoils only itself; a file that cannot be read
further (truncated gzip, not a gzip file at all) ends with one ``unreadable_file`` line. Blank lines are
skipped. Everything is one pass over the bytes: a 50 MB line costs what reading it costs. ``scan_jsonl`` can
bound a line's length: a longer line is read on in pieces of ``CHUNK_BYTES`` and dropped, never held whole
(what comes back is its length and sha256), so memory stays bounded whatever a (decompressed) line holds.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from zaya_pipeline.errors import DataError

SNIFF_BYTES = 8192  # how much of a file's (decompressed) start decides whether it is text at all
CHUNK_BYTES = 1 << 20  # the rest of a line over the length limit is read and dropped in pieces of this size

# Reasons a line is bad, as reported (reports/prepare.json counts by these names).
MALFORMED_JSON = "malformed_json"
NOT_AN_OBJECT = "not_an_object"
INVALID_UTF8 = "invalid_utf8"
UNREADABLE_FILE = "unreadable_file"
TOO_DEEP = "too_deep"  # JSON nested deeper than Python's recursion limit lets it parse or write
TOO_LONG = "too_long"


def open_binary(path: str | Path) -> BinaryIO:
    """The decompressed bytes of ``path`` (by suffix: ``.gz``, ``.zst``, else plain); a missing file raises
    ``FileNotFoundError`` here, a corrupt one only when read."""
    path = Path(path)
    if path.name.endswith(".gz"):
        return gzip.open(path, "rb")
    if path.name.endswith(".zst"):
        import zstandard  # comes with datatrove[io]

        raw = open(path, "rb")  # noqa: SIM115 (closed with the reader the caller closes)
        reader = zstandard.ZstdDecompressor().stream_reader(raw, closefd=True)
        return io.BufferedReader(reader)
    return open(path, "rb")


def read_errors() -> tuple[type[BaseException], ...]:
    """What reading a damaged compressed file raises (``zstandard.ZstdError`` is not an ``OSError``)."""
    import zstandard

    return (OSError, EOFError, zstandard.ZstdError)


def looks_binary(head: bytes) -> bool:
    """NUL bytes do not occur in text (UTF-8 JSON or prose); they do in images, archives, executables."""
    return b"\x00" in head


def sniff(path: str | Path) -> bytes:
    """The first ``SNIFF_BYTES`` decompressed bytes of a file (less if it is shorter or unreadable)."""
    try:
        with open_binary(path) as f:
            return f.read(SNIFF_BYTES)
    except read_errors():
        return b""


@dataclass(frozen=True)
class BadLine:
    lineno: int
    reason: str  # MALFORMED_JSON | NOT_AN_OBJECT | INVALID_UTF8 | TOO_DEEP | TOO_LONG | UNREADABLE_FILE
    message: str  # "<file>:<line>: ...", the text of the strict reader's DataError
    raw: bytes  # the line as read (empty for UNREADABLE_FILE and TOO_LONG)


def parse_line(path: str | Path, lineno: int, raw: bytes) -> dict | BadLine:
    """One line's JSON object, or why it is not one."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        where = f"{path}:{lineno}: invalid UTF-8 ({exc.reason} at byte {exc.start})"
        return BadLine(lineno, INVALID_UTF8, where, raw)
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"{path}:{lineno}: malformed JSON ({exc.msg} at column {exc.colno})"
        return BadLine(lineno, MALFORMED_JSON, where, raw)
    except RecursionError:
        where = f"{path}:{lineno}: JSON nested deeper than Python's parser allows"
        return BadLine(lineno, TOO_DEEP, where, raw)
    except ValueError as exc:  # valid JSON Python will not hold: an integer of over 4300 digits
        where = f"{path}:{lineno}: malformed JSON ({str(exc).split(':')[0]})"
        return BadLine(lineno, MALFORMED_JSON, where, raw)
    if not isinstance(obj, dict):
        where = f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}"
        return BadLine(lineno, NOT_AN_OBJECT, where, raw)
    return obj


@dataclass(frozen=True)
class Dropped:
    """A line over the length limit, read and dropped."""

    size: int  # bytes, with the newline (as in the raw line of other rejects: `sed -n Np | wc -c`)
    sha256: str


def read_lines(f: BinaryIO, max_bytes: int = 0) -> Iterator[bytes | Dropped]:
    """Every line of ``f``, newline included; with ``max_bytes`` > 0 a line longer than that is read on in
    pieces of ``CHUNK_BYTES`` up to its newline and comes back as ``Dropped``, so no more is ever held."""
    if not max_bytes:
        yield from f
        return
    while line := f.readline(max_bytes + 1):
        if len(line) <= max_bytes or line.endswith(b"\n"):
            yield line
            continue
        digest, size = hashlib.sha256(line), len(line)
        while not line.endswith(b"\n") and (line := f.readline(CHUNK_BYTES)):
            digest.update(line)
            size += len(line)
        yield Dropped(size, digest.hexdigest())


def scan_jsonl(
    path: str | Path, max_line_bytes: int = 0, why: str = ""
) -> Iterator[tuple[int, dict | BadLine]]:
    """(line number from 1, object or ``BadLine``) for every non-blank line of ``path``; with
    ``max_line_bytes`` > 0 a longer line is a ``TOO_LONG`` ``BadLine`` (``why`` says why in its message)."""
    lineno = 0
    with open_binary(path) as f:
        try:
            for lineno, raw in enumerate(read_lines(f, max_line_bytes), start=1):
                if isinstance(raw, Dropped):
                    where = f"{path}:{lineno}: a line of {raw.size} bytes > {max_line_bytes} bytes{why}"
                    yield lineno, BadLine(lineno, TOO_LONG, f"{where}; not parsed (sha256 {raw.sha256})", b"")
                elif raw.strip():
                    yield lineno, parse_line(path, lineno, raw)
        except read_errors() as exc:
            bad = lineno + 1
            yield bad, BadLine(bad, UNREADABLE_FILE, f"{path}:{bad}: cannot read ({exc})", b"")


def read_jsonl(path: str | Path) -> Iterator[tuple[int, dict]]:
    """(line number from 1, object) for every non-blank line; the first bad line raises ``DataError``."""
    for lineno, obj in scan_jsonl(path):
        if isinstance(obj, BadLine):
            raise DataError(obj.message)
        yield lineno, obj
