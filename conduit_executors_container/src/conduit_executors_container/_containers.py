"""Blocking docker SDK operations on one execution's containers (run them in a worker thread).

Each function takes the ``APIClient`` first, so :meth:`Engine.call` can run it off the loop.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import docker
import docker.errors
import docker.types
import requests.exceptions
import urllib3.exceptions

from conduit_core.extension import OperationError, StopEvidence
from conduit_executors_container._config import RESULT_MOUNT, ContainerConfig
from conduit_executors_container._engine import EPOCH_LABEL, EXECUTION_LABEL
from conduit_executors_container._outcome import read_outcome

__all__ = [
    "capture_logs",
    "log_tail",
    "create_container",
    "discard",
    "execution_containers",
    "halt",
    "image_present",
    "inspect",
    "pull_image",
    "remove_leftovers",
    "remove_verified",
    "start_container",
    "stop_execution",
    "wait_exit",
]

# A remove the engine is still finishing ("removal in progress") is watched this long.
_REMOVE_VERIFY_SECONDS = 30.0
# The engine's own log rotation keeps at least this much, whatever the binding's limit.
_MIN_ENGINE_LOG_BYTES = 64 * 1024
_STOPPED_STATES = frozenset({"created", "exited", "dead"})


def image_present(client: docker.APIClient, image: str) -> bool:
    try:
        client.inspect_image(image)
    except docker.errors.ImageNotFound:
        return False
    return True


def pull_image(client: docker.APIClient, image: str) -> None:
    repository, tag = docker.utils.parse_repository_tag(image)
    try:
        client.pull(repository, tag=tag or "latest")
    except docker.errors.APIError as exc:
        raise OperationError(
            "image_pull_failed", f"pulling image {image!r} failed: {exc.explanation}"
        ) from exc


def execution_containers(client: docker.APIClient, execution_id: str) -> list[dict[str, Any]]:
    """Every container (running or not) labelled with this execution, oldest epoch first."""
    found: list[dict[str, Any]] = client.containers(
        all=True, filters={"label": f"{EXECUTION_LABEL}={execution_id}"}
    )
    return sorted(found, key=_epoch_of)


def remove_leftovers(
    client: docker.APIClient, execution_id: str, epoch: int, name: str
) -> list[str]:
    """Remove the stopped containers older epochs of this execution left; return their ids.

    A launch at an older epoch that lost its lease before its pin never started its container,
    so whatever it left is stopped. A *running* one means something else started it: refuse to
    start a second copy of the work rather than guess; so does one that has run and whose
    outcome is not recorded (removing it would lose that outcome). Newer epochs are left alone:
    their launch owns them, and this one's pin will be refused.
    """
    removed = []
    for summary in execution_containers(client, execution_id):
        same_name = f"/{name}" in summary.get("Names", [])
        if _epoch_of(summary) >= epoch and not same_name:
            continue
        state = summary.get("State")
        if state not in _STOPPED_STATES:
            raise OperationError(
                "container_conflict",
                f"container {summary['Id'][:12]} of execution {execution_id!r} (epoch "
                f"{_epoch_of(summary)}) is {state}; not starting a second one",
            )
        if state != "created" and not _outcome_recorded(summary):
            # It ran, and its end is known only to the engine: removing it would lose the
            # outcome a recovery needs, and starting another would run the job twice.
            raise OperationError(
                "container_conflict",
                f"container {summary['Id'][:12]} of execution {execution_id!r} (epoch "
                f"{_epoch_of(summary)}) has run ({state}) and its outcome is not recorded; "
                "not removing it or starting a second one",
            )
        _remove(client, summary["Id"])
        removed.append(summary["Id"])
    return removed


def create_container(
    client: docker.APIClient,
    config: ContainerConfig,
    *,
    name: str,
    labels: Mapping[str, str],
    environment: Mapping[str, str],
    result_dir: Path,
) -> str:
    mounts = [
        docker.types.Mount(RESULT_MOUNT, str(result_dir), type="bind"),
        *(
            docker.types.Mount(m.target, m.source, type="bind", read_only=m.read_only)
            for m in config.mounts
        ),
    ]
    engine_log_bytes = max(config.log_limit_bytes, _MIN_ENGINE_LOG_BYTES)
    host_config = client.create_host_config(
        mounts=mounts,
        network_mode=config.network,
        nano_cpus=None if config.cpus is None else int(config.cpus * 1e9),
        mem_limit=config.memory,
        # Bounded at the engine too, so a chatty job cannot fill its disk; two files keep at least
        # the last ``engine_log_bytes`` across a rotation.
        log_config=docker.types.LogConfig(
            type="json-file", config={"max-size": str(engine_log_bytes), "max-file": "2"}
        ),
    )
    try:
        created = client.create_container(
            config.image,
            command=config.argv(),
            name=name,
            environment=dict(environment),
            working_dir=config.workdir,
            user=config.user,
            labels=dict(labels),
            stop_signal=config.signal_name(),
            # The engine keeps the grace with the container, so any later stop honours it.
            stop_timeout=config.grace_seconds(),
            host_config=host_config,
            use_config_proxy=False,
        )
    except docker.errors.ImageNotFound as exc:
        raise OperationError(
            "image_missing", f"image {config.image!r} is not present", permanent=True
        ) from exc
    except docker.errors.APIError as exc:
        raise _refused("creating the container", exc) from exc
    return str(created["Id"])


def start_container(client: docker.APIClient, container_id: str) -> None:
    try:
        client.start(container_id)
    except docker.errors.APIError as exc:
        raise _refused("starting the container", exc) from exc


def discard(client: docker.APIClient, container: str) -> None:
    """Remove a container, best effort: what stays is found by a relaunch, a stop or reconcile."""
    with contextlib.suppress(docker.errors.APIError, requests.exceptions.RequestException):
        _remove(client, container)


def inspect(client: docker.APIClient, container_id: str) -> dict[str, Any] | None:
    """The container's engine record, or ``None`` when the engine has no such container."""
    try:
        record: dict[str, Any] = client.inspect_container(container_id)
    except docker.errors.NotFound:
        return None
    return record


def wait_exit(client: docker.APIClient, container_id: str, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for the container to stop running; ``True`` when it has."""
    try:
        client.wait(container_id, timeout=timeout, condition="not-running")
    except requests.exceptions.ReadTimeout:
        return False
    except requests.exceptions.ConnectionError as exc:
        # A timeout while the engine's answer is streaming surfaces as a ConnectionError.
        if any(isinstance(arg, urllib3.exceptions.ReadTimeoutError) for arg in exc.args):
            return False
        raise
    except docker.errors.NotFound:
        return True  # Gone counts as not running; the caller finds out it is gone.
    return True


def capture_logs(
    client: docker.APIClient, container_id: str, result_dir: Path, limit: int
) -> list[str]:
    """Write the tail (``limit`` bytes) of stdout and stderr into the result directory.

    Returns the names of the streams that were cut.
    """
    cut = []
    for stream in ("stdout", "stderr"):
        chunks = client.logs(
            container_id, stdout=stream == "stdout", stderr=stream == "stderr", stream=True
        )
        tail = bytearray()
        total = 0
        for chunk in chunks:
            total += len(chunk)
            tail += chunk
            if len(tail) > 2 * limit + 65536:  # trim now and then, not on every chunk
                del tail[: len(tail) - limit]
        kept = bytes(tail[len(tail) - limit :]) if limit else b""
        if total > len(kept):
            cut.append(stream)
        (result_dir / stream).write_bytes(kept)
    return cut


def log_tail(client: docker.APIClient, container: str, stream: str, limit: int) -> bytes | None:
    """The last ``limit`` bytes of a container's ``stream`` so far; ``None`` when it is gone."""
    try:
        # ``follow`` defaults to ``stream``: a running container's log would never end.
        chunks = client.logs(
            container, stdout=stream == "stdout", stderr=stream == "stderr", stream=True,
            follow=False,
        )  # fmt: skip
        tail = bytearray()
        for chunk in chunks:
            tail += chunk
            if len(tail) > 2 * limit + 65536:
                del tail[: len(tail) - limit]
    except docker.errors.NotFound:
        return None
    return bytes(tail[len(tail) - limit :]) if limit else b""


def halt(client: docker.APIClient, container_id: str, grace_seconds: int | None) -> None:
    """Stop with the container's stop signal and grace, then kill whatever still runs."""
    try:
        client.stop(container_id, timeout=grace_seconds)
    except docker.errors.NotFound:
        return
    try:
        client.kill(container_id)
    except docker.errors.APIError as exc:
        # 409: it is not running any more, which is what the kill was for.
        if exc.status_code not in (404, 409):
            raise


def remove_verified(client: docker.APIClient, container_id: str) -> bool:
    """Remove the container and return ``True`` once the engine says it does not exist."""
    _remove(client, container_id)
    deadline = time.monotonic() + _REMOVE_VERIFY_SECONDS
    while True:
        try:
            client.inspect_container(container_id)
        except docker.errors.NotFound:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)  # a removal the engine is still finishing


def stop_execution(
    client: docker.APIClient, execution_id: str, epoch: int, grace_seconds: int | None
) -> StopEvidence:
    """Stop and remove every container this execution started up to ``epoch``; prove it."""
    gone = []
    for summary in execution_containers(client, execution_id):
        if _epoch_of(summary) > epoch:
            continue  # a newer launch's container is not this attempt's to stop
        halt(client, summary["Id"], grace_seconds)
        if not remove_verified(client, summary["Id"]):
            return StopEvidence(
                verified=False,
                detail=f"container {summary['Id'][:12]} is still known to the engine after remove",
            )
        gone.append(summary["Id"][:12])
    left = [s for s in execution_containers(client, execution_id) if _epoch_of(s) <= epoch]
    if left:
        return StopEvidence(
            verified=False,
            detail=f"containers appeared while stopping: {', '.join(s['Id'][:12] for s in left)}",
        )
    removed = f"removed {', '.join(gone)}" if gone else "no container existed"
    return StopEvidence(
        verified=True, detail=f"{removed}; the engine lists none for execution {execution_id!r}"
    )


def _remove(client: docker.APIClient, container: str) -> None:
    try:
        client.remove_container(container, force=True, v=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:
        if exc.status_code != 409:  # 409: a removal is already in progress
            raise


def _outcome_recorded(summary: Mapping[str, Any]) -> bool:
    """Whether the container's end is recorded beside its result directory (``_outcome``)."""
    mounts = summary.get("Mounts") or []
    sources = [m.get("Source") for m in mounts if m.get("Destination") == RESULT_MOUNT]
    result_dir = sources[0] if sources else None
    if not isinstance(result_dir, str):
        return False
    try:
        return read_outcome(result_dir, container_id=summary["Id"]) is not None
    except OperationError:
        return False  # unreadable: not proven


def _epoch_of(summary: Mapping[str, Any]) -> int:
    try:
        return int((summary.get("Labels") or {}).get(EPOCH_LABEL, "0"))
    except ValueError:
        return 0


def _refused(action: str, exc: docker.errors.APIError) -> OperationError:
    # 4xx: the engine refuses this config (an unknown network, a bad mount, a missing command);
    # trying again will not help. 5xx may be the engine's passing trouble.
    permanent = exc.is_client_error()
    return OperationError(
        "container_refused", f"{action} failed: {exc.explanation}", permanent=permanent
    )
