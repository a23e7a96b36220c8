"""Reading the curated corpus: datatrove ``JsonlWriter`` output, one JSON document per line, gzip'd.

The tokenizer stage reads documents here (plain Python, in a fixed order, so training is reproducible); the
tokenize stage reads the same files with datatrove's ``JsonlReader`` and the same ``CURATED_GLOB``. Lines are
parsed by ``jsonl.read_jsonl``, the project's one JSONL reader.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from zaya_pipeline.data.jsonl import read_jsonl
from zaya_pipeline.errors import DataError

CURATED_GLOB = "*.jsonl.gz"


def curated_files(folder: str | Path) -> list[Path]:
    """The curated shards in sorted name order; a missing or empty folder is a user error."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(
            f"curated corpus folder {folder} (paths.curated) does not exist: run `zaya curate` first"
        )
    files = sorted(folder.glob(CURATED_GLOB))
    if not files:
        raise DataError(f"no {CURATED_GLOB} files in {folder} (paths.curated): run `zaya curate` first")
    return files


def iter_documents(folder: str | Path, limit: int = 0) -> Iterator[dict]:
    """Yield the curated documents (dicts with at least "text") in file order; ``limit`` > 0 stops after N."""
    count = 0
    for path in curated_files(folder):
        for lineno, doc in read_jsonl(path):
            if not isinstance(doc.get("text"), str):
                raise DataError(f'{path}:{lineno}: a curated document needs a string "text" field')
            yield doc
            count += 1
            if limit and count >= limit:
                return
