"""The Docker Engine as the executor sees it: one lazily made client, calls off the event loop.

Every docker SDK call blocks, so each runs in a worker thread under a :class:`CapacityLimiter`;
an engine that cannot be reached becomes the retryable ``engine_unreachable``.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import socket
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
import anyio.to_thread
import docker
import docker.errors
import docker.utils
import requests.exceptions

from conduit_core.extension import OperationError

__all__ = [
    "EPOCH_LABEL",
    "EXECUTION_LABEL",
    "WORK_LABEL",
    "Engine",
    "container_name",
    "labels_for",
    "launch_intent",
    "safe_id",
]

EXECUTION_LABEL = "conduit.execution"
EPOCH_LABEL = "conduit.epoch"
WORK_LABEL = "conduit.work"

#: How many SDK calls (and pooled connections) one executor runs at once.
DEFAULT_CONCURRENCY = 16

_T = TypeVar("_T")
# Any version works for GET /version, which is not versioned; this one every engine still takes.
_PROBE_API_VERSION = "1.24"
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]")
_MAX_NAME_ID = 100
_DIGESTED_NAME = re.compile(r"_[0-9a-f]{12}$")


def labels_for(execution_id: str, epoch: int, work_id: str) -> dict[str, str]:
    return {EXECUTION_LABEL: execution_id, EPOCH_LABEL: str(epoch), WORK_LABEL: work_id}


def launch_intent(execution_id: str, epoch: int, work_id: str, result_dir: str) -> dict[str, Any]:
    """What a launch records before it creates its container: how recovery finds it again."""
    return {
        "layout": "container-intent/1",
        "name": container_name(execution_id, epoch),
        "labels": labels_for(execution_id, epoch, work_id),
        "result_dir": result_dir,
    }


def container_name(execution_id: str, epoch: int) -> str:
    """``conduit-<execution id>-<epoch>``, made safe for the engine's name rules."""
    return f"conduit-{safe_id(execution_id)}-{epoch}"


def safe_id(execution_id: str) -> str:
    """The execution id as a container-name and file-name part.

    A cleaned or shortened id gets a digest of the real one, so two ids never share a name.
    """
    cleaned = _UNSAFE_NAME.sub("_", execution_id)[:_MAX_NAME_ID]
    # An id kept as it is never ends in ``_<12 hex>``, so it cannot equal a digested name.
    if (
        cleaned != execution_id
        or not cleaned
        or cleaned.startswith(".")
        or _DIGESTED_NAME.search(cleaned)
    ):
        digest = hashlib.sha256(execution_id.encode("utf-8", "surrogatepass")).hexdigest()[:12]
        cleaned = f"{cleaned}_{digest}"
    return cleaned


class Engine:
    """A docker ``APIClient`` made on first use, and a limiter for the threads that call it.

    ``base_url`` (say ``unix:///var/run/docker.sock``) overrides ``DOCKER_HOST`` and the other
    ``DOCKER_*`` variables the SDK reads.
    """

    def __init__(self, base_url: str | None = None, *, concurrency: int = DEFAULT_CONCURRENCY):
        self.base_url = base_url
        self._concurrency = concurrency
        self._limiter = anyio.CapacityLimiter(concurrency)
        self._client: docker.APIClient | None = None
        self._client_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Engine(base_url={self.base_url!r})"

    async def call(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """Run ``fn(client, *args, **kwargs)`` in a worker thread; translate an unreachable engine.

        Cancellation waits for the call to return, so a create or a remove is never left
        half-known.
        """
        bound = functools.partial(self._call_blocking, fn, *args, **kwargs)
        return await anyio.to_thread.run_sync(bound, limiter=self._limiter)

    async def call_abandonable(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """Like :meth:`call` for a read-only call (a wait): cancelling returns at once.

        It runs outside the limiter, so long waits never starve the launches and stops.
        """
        bound = functools.partial(self._call_blocking, fn, *args, **kwargs)
        return await anyio.to_thread.run_sync(bound, abandon_on_cancel=True)

    def client(self) -> docker.APIClient:
        """The client, made on first use (blocking: it asks the engine for its API version)."""
        with self._client_lock:
            if self._client is None:
                self._client = self._make_client()
            return self._client

    def close(self) -> None:
        with self._client_lock:
            if self._client is not None:
                self._client.close()
                self._client = None

    def _call_blocking(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        client = self.client()
        try:
            return fn(client, *args, **kwargs)
        except requests.exceptions.ConnectionError as exc:
            raise self._unreachable(exc) from exc

    def _make_client(self) -> docker.APIClient:
        kwargs: dict[str, Any] = (
            {"base_url": self.base_url} if self.base_url else docker.utils.kwargs_from_env()
        )
        try:
            _probe_unix_socket(kwargs.get("base_url"))
        except OSError as exc:
            raise self._unreachable(exc) from exc
        # The SDK's own version="auto" leaks its socket when the engine is not there, so the
        # version is asked with a client this function closes either way.
        probe = docker.APIClient(version=_PROBE_API_VERSION, **kwargs)
        try:
            version = str(probe.version(api_version=False)["ApiVersion"])
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise self._unreachable(exc) from exc
        finally:
            probe.close()
        return docker.APIClient(version=version, max_pool_size=self._concurrency, **kwargs)

    def _unreachable(self, exc: BaseException) -> OperationError:
        where = self.base_url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        return OperationError(
            "engine_unreachable",
            f"the Docker Engine at {where} cannot be reached ({reason})",
            permanent=False,
        )


def _probe_unix_socket(base_url: object) -> None:
    """Connect to a unix-socket engine once, closing the socket whatever happens.

    The SDK leaks the socket of a connection that fails, so an absent engine is found here first.
    """
    if base_url is None:
        path = "/var/run/docker.sock"  # the SDK's default
    elif isinstance(base_url, str) and base_url.startswith(("unix://", "http+unix://")):
        path = base_url.split("://", 1)[1]
    else:
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(10)
        probe.connect(path)
