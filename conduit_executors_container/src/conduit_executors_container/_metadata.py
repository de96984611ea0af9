"""Recovery metadata: how a later daemon finds a launched container again.

The container id is the proof; the name and epoch let ``stop`` and ``reconcile`` name it, and
``result_dir`` is where its result file and captured logs live on this host.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import msgspec

from conduit_core.extension import OperationError

__all__ = ["ContainerRecord", "decode_record", "encode_record"]


class ContainerRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One launched container. ``launched_at`` (wall clock) is when this executor started it."""

    layout: Literal["container/1"] = "container/1"
    container_id: str
    name: str
    epoch: int
    result_dir: str
    launched_at: float


def encode_record(record: ContainerRecord) -> dict[str, Any]:
    return msgspec.to_builtins(record)  # type: ignore[no-any-return]


def decode_record(metadata: Mapping[str, Any]) -> ContainerRecord:
    try:
        return msgspec.convert(dict(metadata), ContainerRecord)
    except msgspec.ValidationError as exc:
        # Metadata we cannot read proves nothing about the container: fail closed.
        raise OperationError(
            "recovery_unprovable", f"recovery metadata is not in container/1 layout: {exc}"
        ) from exc
