"""Project error types: user mistakes raise these, with the config key, file or line in the message."""


class ZayaError(ValueError):
    """A user-facing error: the CLI prints its message and exits non-zero, without a traceback."""


class ConfigError(ZayaError):
    """A bad configuration value, key, group or file."""


class DataError(ZayaError):
    """A missing, empty or malformed input (corpus folder, JSONL line, tokenizer file, shard)."""


class TrainingError(ZayaError):
    """Training cannot go on (e.g. the loss stayed NaN/Inf or spiking for too many steps in a row)."""
