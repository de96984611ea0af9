"""What the tests ask the engine directly, to check the executor rather than trust it."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import docker
import docker.errors

from conduit_core.extension import Result
from conduit_executors_container import EXECUTION_LABEL

_T = TypeVar("_T")


def inspect_or_none(api: docker.APIClient, container: str) -> dict[str, Any] | None:
    try:
        record: dict[str, Any] = api.inspect_container(container)
    except docker.errors.NotFound:
        return None
    return record


def labelled(api: docker.APIClient, execution_id: str) -> list[dict[str, Any]]:
    """Every container of the execution, exited ones included."""
    found: list[dict[str, Any]] = api.containers(
        all=True, filters={"label": f"{EXECUTION_LABEL}={execution_id}"}
    )
    return found


def events(
    api: docker.APIClient, execution_id: str, since: float, action: str
) -> list[dict[str, Any]]:
    """The engine's ``action`` events (create, start, destroy…) for the execution since ``since``."""
    stream = api.events(
        since=f"{since:.9f}",
        until=f"{time.time():.9f}",
        filters={
            "type": "container",
            "event": action,
            "label": f"{EXECUTION_LABEL}={execution_id}",
        },
        decode=True,
    )
    return list(stream)


def poll(check: Callable[[], _T | None], *, timeout: float = 30.0, what: str = "condition") -> _T:
    """Call ``check`` until it returns something other than ``None``/``False``, or fail."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value is not None and value is not False:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def release(result_dir: str) -> None:
    """Let a job started with :data:`WAIT_FOR_GO` end (it waits for ``/conduit/go``)."""
    Path(result_dir, "go").touch()


#: A job command that runs until the test calls :func:`release`.
WAIT_FOR_GO = "while [ ! -e /conduit/go ]; do sleep 0.02; done"


def artifact_text(result: Result, name: str) -> str:
    """The content of one of the result's artifacts (stdout, stderr), read from the host."""
    return Path(next(a.ref for a in result.artifacts if a.name == name)).read_text()
