"""Finding the container a recovery adopts, from its metadata or, failing that, its labels."""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import docker

from conduit_core.extension import OperationError
from conduit_executors_container import _containers as containers
from conduit_executors_container._config import RESULT_MOUNT
from conduit_executors_container._engine import EPOCH_LABEL, EXECUTION_LABEL
from conduit_executors_container._metadata import ContainerRecord

__all__ = ["engine_time", "locate_for_recovery", "record_from_engine"]

_RUNNING_STATES = frozenset({"running", "restarting", "paused"})


def locate_for_recovery(
    client: docker.APIClient, execution_id: str, record: ContainerRecord | None
) -> dict[str, Any] | None:
    """The engine's record of the container to adopt, or ``None`` when there is none."""
    if record is not None:
        state = containers.inspect(client, record.container_id)
        if state is not None and _labels(state).get(EXECUTION_LABEL) != execution_id:
            raise OperationError(
                "recovery_unprovable",
                f"container {record.container_id[:12]} is not labelled with execution "
                f"{execution_id!r}",
            )
        return state
    found = containers.execution_containers(client, execution_id)
    if not found:
        return None
    running = [s for s in found if s.get("State") in _RUNNING_STATES]
    if len(running) > 1:
        raise OperationError(
            "recovery_unprovable",
            f"{len(running)} containers of execution {execution_id!r} are running; "
            "no metadata says which one was pinned",
        )
    # The running one, else the newest epoch's: older epochs' leftovers never started anything.
    chosen = running[0] if running else found[-1]
    return containers.inspect(client, chosen["Id"])


def record_from_engine(state: dict[str, Any]) -> ContainerRecord:
    """Rebuild the recovery record of a pinned container from the engine's record of it."""
    result_dir = next(
        (m["Source"] for m in state.get("Mounts", []) if m.get("Destination") == RESULT_MOUNT),
        None,
    )
    if result_dir is None:
        raise OperationError(
            "recovery_unprovable",
            f"container {state['Id'][:12]} has no {RESULT_MOUNT} mount; it was not made by "
            "this executor",
        )
    return ContainerRecord(
        container_id=state["Id"],
        name=str(state.get("Name", "")).lstrip("/"),
        epoch=int(_labels(state).get(EPOCH_LABEL, "0")),
        result_dir=result_dir,
        launched_at=engine_time(state["State"].get("StartedAt")) or time.time(),
    )


def engine_time(value: object) -> float | None:
    """An engine timestamp (RFC 3339, nanoseconds) as epoch seconds; ``None`` for "never"."""
    if not isinstance(value, str) or not value or value.startswith("0001-"):
        return None
    text = value.replace("Z", "+00:00")
    head, dot, rest = text.partition(".")
    if dot:
        # Python parses microseconds at most; the engine writes nanoseconds.
        digits = "".join(ch for ch in rest if ch.isdigit())
        zone = rest[len(digits) :]
        text = f"{head}.{digits[:6].ljust(6, '0')}{zone}"
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def _labels(state: dict[str, Any]) -> dict[str, str]:
    labels = (state.get("Config") or {}).get("Labels") or {}
    return labels if isinstance(labels, dict) else {}
