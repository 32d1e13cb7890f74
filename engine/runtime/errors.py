"""Errors the engine raises on purpose, each with the CLI exit code it maps to.

Every message is one line naming the bad value and what is allowed, so that the
CLI can print it as is and the dashboard can show it in an `st.error` box.
"""


class EngineError(Exception):
    """Base class; `exit_code` is what `python -m engine` exits with."""

    exit_code = 1


class BadInput(EngineError, ValueError):
    """An argument is out of range or unknown (exit code 2)."""

    exit_code = 2


class DataMissing(EngineError):
    """A data set's files are absent and cannot be downloaded here (exit code 3)."""

    exit_code = 3


class DataCorrupt(EngineError):
    """A data file exists but cannot be parsed (exit code 3)."""

    exit_code = 3


class CacheCorrupt(EngineError):
    """A cache entry cannot be decoded; the entry is dropped and recomputed."""

    exit_code = 1


class CacheError(EngineError):
    """The cache folder cannot be used: not a folder, not private, not writable (exit code 2)."""

    exit_code = 2


class Cancelled(EngineError):
    """A long run was cancelled through its cancel flag."""

    exit_code = 130


class CacheWarning(UserWarning):
    """A corrupt entry was dropped or a damaged database was moved aside."""
