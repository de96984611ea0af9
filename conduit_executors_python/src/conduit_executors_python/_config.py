"""The binding config of the python executor, and the shell job config each attempt runs as."""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import msgspec

from conduit_core.extension import OperationError
from conduit_executors_shell import decode_config as decode_shell_config

__all__ = ["RUNNER_MODULE", "WARM_MODULE", "PythonConfig", "decode_config", "shell_config"]

#: The module each attempt's interpreter runs: ``<python> -m RUNNER_MODULE <function>``.
RUNNER_MODULE = "conduit_executors_python._runner"
#: The warm worker program: ``<python> -m WARM_MODULE`` (the wire protocol on its stdin/stdout).
WARM_MODULE = "conduit_executors_python._warm"

#: ``package.module:callable`` (the callable may be ``Class.method``).
_FUNCTION = r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$"

FunctionRef = Annotated[str, msgspec.Meta(pattern=_FUNCTION)]
NonEmpty = Annotated[str, msgspec.Meta(min_length=1)]
PositiveSeconds = Annotated[float, msgspec.Meta(gt=0)]
NonNegativeSeconds = Annotated[float, msgspec.Meta(ge=0)]
ByteLimit = Annotated[int, msgspec.Meta(ge=0)]


class PythonConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One python binding: the callable, the interpreter that runs it, and the job's limits."""

    function: FunctionRef
    #: ``cold``: a detached interpreter per attempt (adopted after a daemon crash); ``warm``: a
    #: supervised worker keeps the interpreter and imports loaded (at-least-once, see README).
    mode: Literal["cold", "warm"] = "cold"
    python: NonEmpty | None = None
    cwd: str | None = None
    env: dict[str, str] = {}
    timeout_seconds: PositiveSeconds | None = None
    stop_signal: str = "SIGTERM"
    stop_grace_seconds: NonNegativeSeconds = 10.0
    max_stdout_bytes: ByteLimit = 1024 * 1024
    max_stderr_bytes: ByteLimit = 1024 * 1024

    def interpreter(self) -> str:
        """The binding's interpreter, else the one running this daemon."""
        return self.python if self.python is not None else sys.executable


def decode_config(raw: Mapping[str, Any]) -> PythonConfig:
    """Decode a binding config; refuse a bad one as permanent ``invalid_config`` with its $.path."""
    try:
        config = msgspec.convert(dict(raw), PythonConfig)
    except msgspec.ValidationError as exc:
        raise OperationError(
            "invalid_config", f"python binding config: {_with_path(str(exc))}", permanent=True
        ) from exc
    try:
        decode_shell_config(shell_config(config))  # the limits the shell job checks (stop_signal)
    except OperationError as exc:
        raise OperationError(
            "invalid_config",
            exc.message.replace("shell binding config", "python binding config"),
            permanent=True,
        ) from exc
    return config


def shell_config(config: PythonConfig) -> dict[str, Any]:
    """The shell job config an attempt runs as: the runner in the binding's interpreter."""
    shell: dict[str, Any] = {
        "command": [config.interpreter(), "-m", RUNNER_MODULE, config.function],
        "env": dict(config.env),
        "stop_signal": config.stop_signal,
        "stop_grace_seconds": config.stop_grace_seconds,
        "max_stdout_bytes": config.max_stdout_bytes,
        "max_stderr_bytes": config.max_stderr_bytes,
    }
    if config.cwd is not None:
        shell["cwd"] = config.cwd
    if config.timeout_seconds is not None:
        shell["timeout_seconds"] = config.timeout_seconds
    return shell


def _with_path(message: str) -> str:
    """msgspec leaves the path off errors about the top-level object; name the field there too."""
    if " - at `$" in message:
        return message
    field = re.search(r"field `([^`]+)`", message)
    return f"{message} - at `$.{field.group(1)}`" if field else f"{message} - at `$`"
