"""Project error types: user mistakes raise these, with the config key, file or line in the message."""

import errno
import os


class ZayaError(ValueError):
    """A user-facing error: the CLI prints its message and exits with ``exit_code``, without a traceback."""

    exit_code = 2


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (for a one-line error), else its type's name."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class ConfigError(ZayaError):
    """A bad configuration value, key, group or file."""


class DataError(ZayaError):
    """A missing, empty or malformed input (corpus folder, JSONL line, tokenizer file, shard)."""


class TrainingError(ZayaError):
    """Training cannot go on (e.g. the loss stayed NaN/Inf or spiking for too many steps in a row)."""


class Preempted(TrainingError):
    """Training stopped on SIGTERM after saving a checkpoint; resume with ``train.resume=auto``."""

    exit_code = 143  # 128 + SIGTERM, what schedulers expect of a terminated job


class Terminated(BaseException):
    """SIGTERM arrived while a stage had an MLflow run open (``tracking.ending_run``): raised there so the
    stage unwinds and its run ends KILLED. Like KeyboardInterrupt, not an Exception: nothing swallows it."""

    exit_code = 143


class MachineError(ZayaError):
    """The machine refused (a full disk, a read-only or corrupt file, a name too long): not a bug of ours and
    not a config mistake, so one line and exit code 1 (``environment_error``)."""

    exit_code = 1


# OSErrors that describe the machine or a path the user gave, not a bug: one line is all they need.
_MACHINE_ERRNOS = frozenset(
    getattr(errno, name)
    for name in ("ENOSPC", "EDQUOT", "EROFS", "EACCES", "EPERM", "ENAMETOOLONG", "EIO", "EMFILE", "ENFILE")
    if hasattr(errno, name)
)


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _short(path, limit: int = 160) -> str:
    text = str(path)
    return text if len(text) <= limit else f"{text[: limit // 2]}…{text[-limit // 2 :]} ({len(text)} chars)"


def environment_error(exc: BaseException) -> MachineError | None:
    """``exc`` (or what it wraps) as one line when the machine refused: an OSError such as a full disk or a
    read-only file, with the file it names, or a SQLite store that cannot be read or written; else None."""
    import sqlite3

    for e in _chain(exc):
        if isinstance(e, OSError) and e.errno in _MACHINE_ERRNOS:
            where = f": {_short(e.filename)}" if e.filename else ""
            hint = " (free some space; the previous outputs are kept)" if e.errno == errno.ENOSPC else ""
            return MachineError(f"{e.strerror or os.strerror(e.errno)}{where}{hint}")
        if isinstance(e, sqlite3.Error):
            return MachineError(f"the MLflow store (SQLite) failed: {first_line(e)}")
    return None
