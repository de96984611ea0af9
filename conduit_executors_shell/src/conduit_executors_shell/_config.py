"""The binding config of the shell executor, as an operator writes it in ``conduit.toml``."""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping
from typing import Annotated, Any

import msgspec

from conduit_core.extension import OperationError

__all__ = ["DEFAULT_OUTPUT_LIMIT_BYTES", "ShellConfig", "decode_config"]

#: How much of stdout and of stderr is kept by default (the tail is kept).
DEFAULT_OUTPUT_LIMIT_BYTES = 1024 * 1024

Argv = Annotated[list[str], msgspec.Meta(min_length=1)]
ShellLine = Annotated[str, msgspec.Meta(min_length=1)]
PositiveSeconds = Annotated[float, msgspec.Meta(gt=0)]
NonNegativeSeconds = Annotated[float, msgspec.Meta(ge=0)]
ByteLimit = Annotated[int, msgspec.Meta(ge=0)]


class ShellConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One shell binding. A string ``command`` runs through ``/bin/sh -c``; a list is an argv."""

    command: Argv | ShellLine
    cwd: str | None = None
    env: dict[str, str] = {}
    timeout_seconds: PositiveSeconds | None = None
    stop_signal: str = "SIGTERM"
    stop_grace_seconds: NonNegativeSeconds = 10.0
    max_stdout_bytes: ByteLimit = DEFAULT_OUTPUT_LIMIT_BYTES
    max_stderr_bytes: ByteLimit = DEFAULT_OUTPUT_LIMIT_BYTES
    accept_input: bool = False

    def argv(self) -> list[str]:
        if isinstance(self.command, str):
            return ["/bin/sh", "-c", self.command]
        return list(self.command)

    def signal(self) -> signal.Signals:
        return _parse_signal(self.stop_signal)


def decode_config(raw: Mapping[str, Any]) -> ShellConfig:
    """Decode a binding config; refuse a bad one as permanent ``invalid_config`` with its $.path."""
    try:
        config = msgspec.convert(dict(raw), ShellConfig)
        config.signal()
    except msgspec.ValidationError as exc:
        raise OperationError(
            "invalid_config", f"shell binding config: {_with_path(str(exc))}", permanent=True
        ) from exc
    return config


def _with_path(message: str) -> str:
    """msgspec leaves the path off errors about the top-level object; name the field there too."""
    if " - at `$" in message:
        return message
    field = re.search(r"field `([^`]+)`", message)
    return f"{message} - at `$.{field.group(1)}`" if field else f"{message} - at `$`"


def _parse_signal(name: str) -> signal.Signals:
    candidate = name.upper()
    if not candidate.startswith("SIG"):
        candidate = "SIG" + candidate
    try:
        return signal.Signals[candidate]
    except KeyError:
        # A ValidationError so decode_config reports it like every other bad field.
        raise msgspec.ValidationError(f"unknown signal {name!r} - at `$.stop_signal`") from None
