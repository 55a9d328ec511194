"""The one exception root of plaita. Pure: never imports redis."""

from __future__ import annotations


class PlaitaError(Exception):
    """Root of every exception plaita raises on purpose."""


class ConfigError(PlaitaError):
    """Raised when a flag, environment variable or URL cannot be used (exit code 2)."""


class BadTaskError(PlaitaError):
    """Raised when a stream entry cannot be a task: it goes to the DLQ with ``reason``."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class HandlerLoadError(ConfigError):
    """Raised when ``--handler MODULE:CALLABLE`` cannot be imported or is not callable."""
