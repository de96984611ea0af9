"""The daemons on the store and drain, over the API: ``GET /v1/daemons`` (the registry each
daemon writes, see ``daemon/_registry``), ``POST /v1/daemon/drain`` (the daemon that answers
stops claiming, lets its attempts finish, then exits 0) and the "waiting for label" answer
of a Work no live daemon can start.

Routes are declared here as plain tuples and registered by ``_app``, like ``_approvals``.
"""

from __future__ import annotations

from typing import Any

import msgspec

from conduit_core.model import DAEMON_LOST_AFTER_MS, DaemonRecord, DaemonState, Work

__all__ = [
    "DAEMON_HANDLERS",
    "DAEMON_ROUTES",
    "DaemonList",
    "DaemonView",
    "DrainView",
    "daemon_views",
    "drain",
    "list_daemons",
    "missing_labels",
]


class DaemonView(msgspec.Struct, frozen=True, kw_only=True):
    """One daemon on the store, as its registry row says (``lost``: no heartbeat lately)."""

    id: str
    host: str
    pid: int
    labels: list[str]
    #: ``running``, ``draining``, ``stopped`` or ``lost``.
    state: str
    #: Attempts it ran when it last wrote its row.
    load: int
    started_at_ms: int
    last_seen_ms: int


class DaemonList(msgspec.Struct, frozen=True, kw_only=True):
    daemons: list[DaemonView]
    #: A running or draining daemon not seen for longer than this is ``lost``.
    lost_after_ms: int = DAEMON_LOST_AFTER_MS


class DrainView(msgspec.Struct, frozen=True, kw_only=True):
    """The daemon that took the drain: it claims nothing new and exits 0 once its
    ``running_attempts`` have ended."""

    owner: str
    state: str
    running_attempts: int


def daemon_views(records: list[DaemonRecord], now_ms: int) -> list[DaemonView]:
    return [_view(r, now_ms) for r in records]


def _view(r: DaemonRecord, now_ms: int) -> DaemonView:
    return DaemonView(
        id=r.id, host=r.host, pid=r.pid, labels=list(r.labels), state=str(r.state_at(now_ms)),
        load=r.load, started_at_ms=r.started_at_ms, last_seen_ms=r.last_seen_ms,
    )  # fmt: skip


async def list_daemons(svc: Any) -> DaemonList:
    records = await svc.store.list_daemons()
    return DaemonList(daemons=daemon_views(records, svc.scheduler.clock.now_ms()))


async def drain(svc: Any) -> DrainView:
    svc.host.drain()  # the CLI's direct mode (no daemon): refused, daemon_not_running
    return DrainView(
        owner=svc.scheduler.options.owner,
        state=str(DaemonState.DRAINING),
        running_attempts=svc.host.running_count(),
    )


async def missing_labels(svc: Any, work: Work) -> list[str] | None:
    """The labels ``work``'s binding requires that no live, claiming daemon has all of
    (``None``: some daemon can start it, or the binding requires none). A daemon that drains,
    stopped or is lost starts nothing, so it does not count."""
    binding = svc.config.bindings.get(work.binding)
    if binding is None or not binding.requires:
        return None
    needed = set(binding.requires)
    now = svc.scheduler.clock.now_ms()
    live = [
        set(r.labels)
        for r in await svc.store.list_daemons()
        if r.state_at(now) is DaemonState.RUNNING
    ]
    if any(needed <= labels for labels in live):
        return None
    # The labels no live daemon has; when each is somewhere but never all on one, all of them.
    held = set().union(*live) if live else set()
    return sorted(needed - held) or sorted(needed)


async def _daemons(svc: Any, request: Any, body: Any) -> msgspec.Struct:
    return await list_daemons(svc)


async def _drain(svc: Any, request: Any, body: Any) -> msgspec.Struct:
    return await drain(svc)


#: (method, path, summary, response, status, body) — ``_app`` makes them ``ApiRoute``s.
_Route = tuple[str, str, str, type[msgspec.Struct], int, type[msgspec.Struct] | None]
DAEMON_ROUTES: tuple[_Route, ...] = (
    ("GET", "/v1/daemons", "The daemons on the store: host, labels, state, load, last seen",
     DaemonList, 200, None),
    ("POST", "/v1/daemon/drain", "Drain the daemon that answers: no new claims, its running "
     "attempts finish, then it exits 0", DrainView, 202, None),
)  # fmt: skip

DAEMON_HANDLERS = {
    ("GET", "/v1/daemons"): _daemons,
    ("POST", "/v1/daemon/drain"): _drain,
}
