"""Collecting log lines in tests (the ``zaya`` loggers do not propagate to the root, so pytest's caplog
does not see them)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator


class _Collect(logging.Handler):
    def __init__(self, lines: list[str]):
        super().__init__()
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextlib.contextmanager
def log_lines(name: str, level: int = logging.INFO) -> Iterator[list[str]]:
    """The messages logged to logger ``name`` (and its children) at ``level`` or above, inside the block."""
    lines: list[str] = []
    logger, handler = logging.getLogger(name), _Collect(lines)
    saved = logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved)
