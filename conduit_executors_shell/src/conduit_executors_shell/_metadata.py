"""Recovery metadata: how a later daemon finds a launched job again, per executor generation.

Generation 1 wrote flat keys; generation 2 groups the process identity and tags the layout;
generation 3 adds the launch marker, and records a *launch intent* (``LaunchIntent``: the
workspace and the marker) before it starts anything, so that a recovery without metadata can
discover the job. Each generation's executor reads and writes only its own layout, because the
core recovers an attempt with exactly the generation that launched it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol, TypeVar

import msgspec

from conduit_core.extension import OperationError

__all__ = ["JobRecord", "LaunchIntent", "MetadataFormat", "decode_intent", "metadata_format"]

_Layout = TypeVar("_Layout")


class JobRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What identifies one launched job, whatever the layout it was stored in.

    ``pid`` is the supervising wrapper's pid, which leads the job's session and process group
    (``pgid``). ``create_time`` (psutil, seconds since the epoch) tells that process from a later
    one that reuses its pid. ``launched_at`` is the wall-clock launch instant. ``marker`` is the
    per-launch ``CONDUIT_LAUNCH_MARKER`` every process of the job carries (generation 3 on).
    """

    pid: int
    pgid: int
    create_time: float
    workspace: str
    launched_at: float
    marker: str | None = None


class LaunchIntent(msgspec.Struct, frozen=True, kw_only=True):
    """What generation 3 records before it creates the workspace or starts a process."""

    layout: Literal["shell/3-intent"] = "shell/3-intent"
    workspace: str
    marker: str


class MetadataFormat(Protocol):
    generation: int

    def encode(self, record: JobRecord) -> dict[str, Any]: ...

    def decode(self, metadata: Mapping[str, Any]) -> JobRecord: ...


class _ProcessIdentity(msgspec.Struct, frozen=True, kw_only=True):
    pid: int
    pgid: int
    create_time: float


class _LayoutV2(msgspec.Struct, frozen=True, kw_only=True):
    layout: Literal["shell/2"]
    process: _ProcessIdentity
    workspace: str
    launched_at: float


class _LayoutV3(msgspec.Struct, frozen=True, kw_only=True):
    layout: Literal["shell/3"]
    process: _ProcessIdentity
    workspace: str
    launched_at: float
    marker: str


class _LayoutV1(msgspec.Struct, frozen=True, kw_only=True):
    pid: int
    pgid: int
    started: float  # the process create time
    workdir: str
    launched: float


class _FormatV2:
    generation = 2

    def encode(self, record: JobRecord) -> dict[str, Any]:
        layout = _LayoutV2(
            layout="shell/2",
            process=_ProcessIdentity(
                pid=record.pid, pgid=record.pgid, create_time=record.create_time
            ),
            workspace=record.workspace,
            launched_at=record.launched_at,
        )
        return msgspec.to_builtins(layout)  # type: ignore[no-any-return]

    def decode(self, metadata: Mapping[str, Any]) -> JobRecord:
        stored = _convert(metadata, _LayoutV2, self.generation)
        return JobRecord(
            pid=stored.process.pid,
            pgid=stored.process.pgid,
            create_time=stored.process.create_time,
            workspace=stored.workspace,
            launched_at=stored.launched_at,
        )


class _FormatV3:
    generation = 3

    def encode(self, record: JobRecord) -> dict[str, Any]:
        if record.marker is None:
            raise ValueError("a generation 3 job record carries its launch marker")
        layout = _LayoutV3(
            layout="shell/3",
            process=_ProcessIdentity(
                pid=record.pid, pgid=record.pgid, create_time=record.create_time
            ),
            workspace=record.workspace,
            launched_at=record.launched_at,
            marker=record.marker,
        )
        return msgspec.to_builtins(layout)  # type: ignore[no-any-return]

    def decode(self, metadata: Mapping[str, Any]) -> JobRecord:
        stored = _convert(metadata, _LayoutV3, self.generation)
        return JobRecord(
            pid=stored.process.pid,
            pgid=stored.process.pgid,
            create_time=stored.process.create_time,
            workspace=stored.workspace,
            launched_at=stored.launched_at,
            marker=stored.marker,
        )


class _FormatV1:
    generation = 1

    def encode(self, record: JobRecord) -> dict[str, Any]:
        layout = _LayoutV1(
            pid=record.pid,
            pgid=record.pgid,
            started=record.create_time,
            workdir=record.workspace,
            launched=record.launched_at,
        )
        return msgspec.to_builtins(layout)  # type: ignore[no-any-return]

    def decode(self, metadata: Mapping[str, Any]) -> JobRecord:
        stored = _convert(metadata, _LayoutV1, self.generation)
        return JobRecord(
            pid=stored.pid,
            pgid=stored.pgid,
            create_time=stored.started,
            workspace=stored.workdir,
            launched_at=stored.launched,
        )


_FORMATS: dict[int, MetadataFormat] = {1: _FormatV1(), 2: _FormatV2(), 3: _FormatV3()}


def metadata_format(generation: int) -> MetadataFormat:
    try:
        return _FORMATS[generation]
    except KeyError:
        raise ValueError(f"shell executor has no generation {generation}") from None


def decode_intent(intent: Mapping[str, Any]) -> LaunchIntent:
    """Read a generation 3 launch intent; one we cannot read proves nothing (fail closed)."""
    return _convert(intent, LaunchIntent, 3)


def _convert(metadata: Mapping[str, Any], layout: type[_Layout], generation: int) -> _Layout:
    try:
        return msgspec.convert(dict(metadata), layout)
    except msgspec.ValidationError as exc:
        # Metadata we cannot read proves nothing about the job: fail closed.
        raise OperationError(
            "recovery_unprovable",
            f"recovery metadata is not in shell generation {generation} layout: {exc}",
        ) from exc
