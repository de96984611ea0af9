"""The job side: ``python -m conduit_executors_python._runner package.module:callable``.

Runs in the attempt's own interpreter (its process group, led by the shell executor's wrapper).
It imports the callable, decodes the latest input's payload (stdin holds the input batch as JSON
lines) into the callable's parameters with msgspec from their annotations, calls it (``async def``
too) and writes the typed result file (``CONDUIT_RESULT``): the return value, encoded with msgspec,
as ``Result.data["return"]``. An exception fails the attempt with its type and message; its
traceback goes to stderr. Only the standard library and msgspec are loaded here, never conduit.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import time
import traceback
import typing
from collections.abc import Callable
from typing import Any

import msgspec

from conduit_executors_python._signals import Permanent, Retry

__all__ = ["main"]

#: How much of an exception's message the result carries (a result file is at most 1 MiB).
_MAX_MESSAGE_CHARS = 4000


#: The core's retry events: a retry attempt's batch holds the input it retries, then one of these
#: (whose payload, the retry's bookkeeping, is not the function's input).
_RETRY_TYPES = frozenset({"core.retry", "core.manual.retry"})


class _Event(msgspec.Struct):
    """One line of the input batch; only the payload matters here, kept undecoded."""

    type: str = ""
    payload: msgspec.Raw = msgspec.Raw(b"null")


class _Refused(Exception):
    """The attempt fails before or after the call, with a stable code."""

    def __init__(self, code: str, message: str, *, permanent: bool) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.permanent = permanent


def main(argv: list[str]) -> int:
    result_path = os.environ.get("CONDUIT_RESULT")
    if len(argv) != 1 or not result_path:
        print("usage: CONDUIT_RESULT=PATH python -m conduit_executors_python._runner "
              "package.module:callable", file=sys.stderr)  # fmt: skip
        return 2
    try:
        result = _run(argv[0], sys.stdin.buffer.read())
        status = 0 if result["outcome"] == "completed" else 1
    except _Refused as exc:
        print(f"{exc.code}: {exc.message}", file=sys.stderr)
        result, status = _failed(exc.code, exc.message, permanent=exc.permanent), 1
    _write(result_path, result)
    return status


def _run(ref: str, batch: bytes) -> dict[str, Any]:
    function, hints = _load_typed(ref)
    kwargs = _arguments(function, hints, _latest_payload(batch))
    try:
        value = function(**kwargs)
        if inspect.isawaitable(value):
            import asyncio  # only for async functions: its import costs more than the rest

            value = asyncio.run(_awaited(value))
    except Exception as exc:
        traceback.print_exc()
        return _raised(exc)
    return _returned(value, hints)


# The steps the warm worker (_warm.py) shares with this cold runner, so both decode, call and
# encode alike: _load_typed, _latest_payload + _arguments, then _returned / _raised / _failed.


def _load_typed(ref: str) -> tuple[Callable[..., Any], dict[str, Any]]:
    """The callable and its resolved annotations (raises ``_Refused``)."""
    function = _load(ref)
    return function, _hints(function)


def _returned(value: Any, hints: dict[str, Any]) -> dict[str, Any]:
    """The result of a call that returned ``value`` (raises ``_Refused`` for a bad value)."""
    data = {"return": _encoded(value, hints)}
    return {"outcome": "completed", "summary": "returned", "data": data}


def _load(ref: str) -> Callable[..., Any]:
    module_name, _, qualname = ref.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            target = getattr(target, part)
    except Exception as exc:
        traceback.print_exc()
        raise _Refused(
            "invalid_config",
            f"$.function: cannot import {ref!r}: {type(exc).__name__}: {exc}",
            permanent=True,
        ) from exc
    if not callable(target):
        raise _Refused("invalid_config", f"$.function: {ref!r} is not callable", permanent=True)
    return typing.cast(Callable[..., Any], target)


def _hints(function: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(function, include_extras=True)
    except Exception as exc:
        raise _Refused(
            "invalid_config",
            f"$.function: the annotations of {function.__qualname__} cannot be resolved: {exc}",
            permanent=True,
        ) from exc


def _latest_payload(batch: bytes) -> msgspec.Raw:
    lines = [line for line in batch.splitlines() if line.strip()]
    try:
        events = [msgspec.json.decode(line, type=_Event) for line in lines]
    except msgspec.DecodeError as exc:  # the daemon wrote it: not the caller's input
        message = f"the input batch is unreadable: {exc}"
        raise _Refused("invalid_input", message, permanent=False) from exc
    inputs = [event for event in events if event.type not in _RETRY_TYPES]
    return inputs[-1].payload if inputs else msgspec.Raw(b"null")


def _arguments(
    function: Callable[..., Any], hints: dict[str, Any], payload: msgspec.Raw
) -> dict[str, Any]:
    """The keyword arguments the payload (a JSON object of parameter names) decodes into."""
    try:
        fields = msgspec.json.decode(payload, type=dict[str, msgspec.Raw] | None) or {}
    except msgspec.ValidationError as exc:
        raise _Refused(
            "invalid_input",
            f"the input payload must be a JSON object of {function.__qualname__}'s parameters "
            f"(or null): {exc}",
            permanent=True,
        ) from exc
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError) as exc:
        raise _Refused(
            "invalid_config", f"$.function: its signature cannot be read: {exc}", permanent=True
        ) from exc
    named = {
        name: p for name, p in parameters.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }  # fmt: skip
    rest = next((p for p in parameters.values() if p.kind is p.VAR_KEYWORD), None)
    kwargs: dict[str, Any] = {}
    for name, raw in fields.items():
        if name in named:
            annotation = hints.get(name, Any)
        elif rest is not None:
            annotation = hints.get(rest.name, Any)
        else:
            raise _Refused(
                "invalid_input",
                f"parameter {name!r}: {function.__qualname__} has no such parameter",
                permanent=True,
            )
        try:
            kwargs[name] = msgspec.json.decode(raw, type=annotation)
        except (msgspec.ValidationError, TypeError) as exc:
            raise _Refused("invalid_input", f"parameter {name!r}: {exc}", permanent=True) from exc
    for name, p in parameters.items():
        if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            if name not in kwargs:
                raise _Refused(
                    "invalid_input", f"parameter {name!r}: missing from the input", permanent=True
                )
        elif p.kind is p.POSITIONAL_ONLY and p.default is p.empty:
            raise _Refused(
                "invalid_config",
                f"$.function: parameter {name!r} is positional-only; inputs are passed by name",
                permanent=True,
            )
    return kwargs


async def _awaited(value: Any) -> Any:
    return await value


def _encoded(value: Any, hints: dict[str, Any]) -> Any:
    """The return value as JSON builtins, checked against the return annotation."""
    try:
        encoded = msgspec.json.encode(value)
        annotation = hints.get("return", Any)
        if annotation is not Any:
            msgspec.json.decode(encoded, type=annotation)
    except (msgspec.ValidationError, TypeError) as exc:
        raise _Refused(
            "invalid_result", f"the return value: {exc}", permanent=False
        ) from exc
    return msgspec.json.decode(encoded)


def _raised(exc: Exception) -> dict[str, Any]:
    kind = type(exc)
    name = kind.__qualname__
    if kind.__module__ != "builtins":
        name = f"{kind.__module__}.{name}"
    message = _clipped(str(exc))
    summary = f"{name}: {message}" if message else name
    data = {"code": "exception", "exception": {"type": name, "message": message}}
    result: dict[str, Any] = {"outcome": "failed", "summary": summary, "data": data}
    if isinstance(exc, Permanent):
        result["permanent"] = True
    elif isinstance(exc, Retry):
        if exc.after is None:
            result["retry_hint"] = {"unknown_reset": True, "reason": summary}
        else:
            reset = int((time.time() + exc.after) * 1000)
            result["retry_hint"] = {"reset_at_ms": reset, "reason": summary}
    return result


def _clipped(message: str) -> str:
    """An exception's message as the summary carries it: the whole is in the traceback."""
    if len(message) <= _MAX_MESSAGE_CHARS:
        return message
    return message[:_MAX_MESSAGE_CHARS] + f"… ({len(message)} characters, see stderr)"


def _failed(code: str, message: str, *, permanent: bool) -> dict[str, Any]:
    return {
        "outcome": "failed",
        "summary": f"{code}: {message}",
        "permanent": permanent,
        "data": {"code": code},
    }


def _write(path: str, result: dict[str, Any]) -> None:
    partial = f"{path}.partial"
    with open(partial, "wb") as out:
        out.write(msgspec.json.encode(result))
    os.replace(partial, path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
