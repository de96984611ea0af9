"""``conduit config check`` for a python binding: import the callable in the binding's own
interpreter (a subprocess, with the binding's ``cwd`` and ``env``, bounded by a timeout) and check
that its signature takes an input (the registration's ``check_binding``)."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Mapping
from typing import Any

import msgspec

from conduit_core.extension import OperationError
from conduit_executors_python._config import decode_config

__all__ = ["CHECK_TIMEOUT_SECONDS", "check_binding"]

#: How long the interpreter may take to import the function (a slow import, a hung module).
CHECK_TIMEOUT_SECONDS = 60.0
_MARK = "conduit-check: "


def check_binding(raw: Mapping[str, Any]) -> None:
    """Raise ``OperationError`` ``function_not_importable`` or ``function_signature``."""
    config = decode_config(raw)
    ref, interpreter = config.function, config.interpreter()
    with tempfile.TemporaryDirectory(prefix="conduit-check-") as empty:
        # An unset cwd runs the job in a fresh workspace: nothing to import from there either.
        cwd = config.cwd if config.cwd is not None else empty
        try:
            done = subprocess.run(
                [interpreter, "-m", "conduit_executors_python._inspect", ref],
                cwd=cwd, env={**os.environ, **config.env}, stdin=subprocess.DEVNULL,
                capture_output=True, timeout=CHECK_TIMEOUT_SECONDS, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            raise OperationError(
                "function_not_importable",
                f"$.function: importing {ref!r} in {interpreter} took over "
                f"{CHECK_TIMEOUT_SECONDS:g} s",
            ) from exc
        except OSError as exc:
            raise OperationError(
                "function_not_importable",
                f"$.function: cannot run {interpreter!r} (cwd {cwd!r}) to import {ref!r}: {exc}",
            ) from exc
    report = _report(done.stdout)
    if report is None:
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise OperationError(
            "function_not_importable",
            f"$.function: {interpreter} could not check {ref!r} (exit status {done.returncode}; "
            f"is conduit-executors-python installed there?): {' | '.join(tail)}",
        )
    if report["code"] != "ok":
        raise OperationError(report["code"], report["message"])


def _report(stdout: bytes) -> dict[str, str] | None:
    lines = stdout.decode(errors="replace").splitlines()
    if not lines or not lines[-1].startswith(_MARK):
        return None
    try:
        return msgspec.json.decode(lines[-1][len(_MARK) :], type=dict[str, str])
    except msgspec.DecodeError:
        return None
