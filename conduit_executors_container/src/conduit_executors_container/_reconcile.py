"""Containers labelled by conduit, for ``conduit doctor`` to show the ones no live attempt owns."""

from __future__ import annotations

from collections.abc import Collection

import docker
import msgspec

from conduit_executors_container._engine import EPOCH_LABEL, EXECUTION_LABEL, WORK_LABEL

__all__ = ["LabelledContainer", "reconcile"]


class LabelledContainer(msgspec.Struct, frozen=True, kw_only=True):
    """A container carrying conduit's labels, as the engine lists it."""

    id: str
    name: str
    execution_id: str
    epoch: int | None
    work_id: str | None
    state: str
    status: str


def reconcile(
    client: docker.APIClient | docker.DockerClient,
    *,
    live_executions: Collection[str] = (),
) -> list[LabelledContainer]:
    """Every container labelled with a conduit execution not in ``live_executions``.

    Blocking (call it from a worker thread). Passing no live executions lists them all.
    """
    api = client.api if isinstance(client, docker.DockerClient) else client
    found = []
    for summary in api.containers(all=True, filters={"label": EXECUTION_LABEL}):
        labels = summary.get("Labels") or {}
        execution_id = labels.get(EXECUTION_LABEL, "")
        if execution_id in live_executions:
            continue
        epoch = labels.get(EPOCH_LABEL, "")
        names = summary.get("Names") or [""]
        found.append(
            LabelledContainer(
                id=summary["Id"],
                name=names[0].lstrip("/"),
                execution_id=execution_id,
                epoch=int(epoch) if epoch.isdigit() else None,
                work_id=labels.get(WORK_LABEL),
                state=summary.get("State", ""),
                status=summary.get("Status", ""),
            )
        )
    return sorted(found, key=lambda c: (c.execution_id, c.epoch or 0, c.id))
