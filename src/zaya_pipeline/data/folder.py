"""Read a user's corpus folder: ``*.jsonl``, ``*.jsonl.gz`` and ``*.parquet`` files, searched recursively.

Validation is strict so that a mistake shows up here, with the file and line, rather than as an empty or
garbled model later: a malformed JSON line, a record without the text field or a folder without documents
raises ``DataError``. Records whose text is empty or only whitespace are skipped.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from zaya_pipeline.errors import DataError

SUFFIXES = (".jsonl.gz", ".jsonl", ".parquet")
PARQUET_BATCH_ROWS = 4096


@dataclass(frozen=True)
class InputFile:
    name: str  # output name: the path inside the folder, "/" → "__", data suffix dropped
    rel: str  # path inside the folder (POSIX)
    path: Path


def _suffix(path: Path) -> str | None:
    return next((s for s in SUFFIXES if path.name.endswith(s)), None)


def list_inputs(input_dir: str) -> list[InputFile]:
    if not input_dir:
        raise DataError(
            "data.corpus.input_dir is empty: set it to a folder of *.jsonl / *.jsonl.gz / *.parquet"
        )
    root = Path(input_dir).expanduser()
    if not root.is_dir():
        raise DataError(f"data.corpus.input_dir={input_dir}: no such folder ({root.resolve()})")
    files = sorted(p for p in root.rglob("*") if p.is_file() and _suffix(p))
    if not files:
        raise DataError(
            f"data.corpus.input_dir={input_dir}: no *.jsonl, *.jsonl.gz or *.parquet files in {root}"
        )
    rels = [p.relative_to(root).as_posix() for p in files]
    names = [rel[: -len(_suffix(p))].replace("/", "__") for rel, p in zip(rels, files, strict=True)]
    # a.jsonl beside a.parquet would collide: those keep their suffix in the name
    clash = {n for n in names if names.count(n) > 1}
    names = [rel.replace("/", "__") if n in clash else n for n, rel in zip(names, rels, strict=True)]
    return [InputFile(n, rel, p) for n, rel, p in zip(names, rels, files, strict=True)]


def _jsonl_rows(f: InputFile) -> Iterator[tuple[int, dict]]:
    opener = gzip.open if f.path.name.endswith(".gz") else open
    try:
        with opener(f.path, "rt", encoding="utf-8") as fh:
            for lineno, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise DataError(
                        f"{f.path}:{lineno}: invalid JSON ({exc.msg} at column {exc.colno})"
                    ) from None
                if not isinstance(row, dict):
                    raise DataError(f"{f.path}:{lineno}: expected a JSON object, got {type(row).__name__}")
                yield lineno, row
    except (OSError, EOFError, UnicodeDecodeError) as exc:
        raise DataError(f"{f.path}: cannot read ({exc})") from None


def _parquet_rows(f: InputFile, text_key: str) -> Iterator[tuple[int, dict]]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(f.path)
    except Exception as exc:  # pyarrow raises several types for a file that is not Parquet
        raise DataError(f"{f.path}: not a readable Parquet file ({exc})") from None
    if text_key not in pf.schema_arrow.names:
        raise DataError(
            f"{f.path}: no column '{text_key}' (data.corpus.text_key); columns: {pf.schema_arrow.names}"
        )
    row_no = 0
    for batch in pf.iter_batches(batch_size=PARQUET_BATCH_ROWS):
        for row in batch.to_pylist():
            row_no += 1
            yield row_no, row


def file_documents(f: InputFile, text_key: str, id_key: str, max_docs: int) -> Iterator[dict]:
    """Records ``{id, text, metadata}`` of one input file, in file order; ``max_docs`` > 0 caps them."""
    rows = _parquet_rows(f, text_key) if f.path.name.endswith(".parquet") else _jsonl_rows(f)
    kept = 0
    for lineno, row in rows:
        where = f"{f.path}:{lineno}"
        if text_key not in row:
            raise DataError(f"{where}: no field '{text_key}' (data.corpus.text_key)")
        text = row.pop(text_key)
        if text is not None and not isinstance(text, str):
            raise DataError(f"{where}: field '{text_key}' is a {type(text).__name__}, not a string")
        if not text or not text.strip():
            continue
        if id_key:
            if id_key not in row:
                raise DataError(
                    f"{where}: no field '{id_key}' (data.corpus.id_key; set it to '' to number lines)"
                )
            doc_id = str(row.pop(id_key))
        else:
            doc_id = f"{f.rel}:{lineno}"
        nested = row.pop("metadata", None)
        metadata = {"source": f.rel, "line": lineno, **row}
        if isinstance(nested, dict):
            metadata.update(nested)
        elif nested is not None:
            metadata["metadata"] = nested
        yield {"id": doc_id, "text": text, "metadata": metadata}
        kept += 1
        if max_docs and kept >= max_docs:
            return
