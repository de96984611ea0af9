"""The exceptions a function raises to steer its attempt's retry (stdlib only: the runner and the
user's code import them without loading conduit)."""

from __future__ import annotations

__all__ = ["Permanent", "Retry"]


class Retry(Exception):
    """Fail this attempt and ask for the next one after ``after`` seconds (``None``: the default
    delay). The hint still spends the failure budget, like any retry hint."""

    def __init__(self, message: str = "", *, after: float | None = None) -> None:
        super().__init__(message)
        if after is not None and not after >= 0:
            raise ValueError(f"Retry(after=...) must be >= 0 seconds, got {after!r}")
        self.after = after


class Permanent(Exception):
    """Fail this attempt permanently: no retry is armed."""
