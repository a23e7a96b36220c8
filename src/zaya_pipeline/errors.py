"""Project error types: user mistakes raise these, with the config key, file or line in the message."""


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
