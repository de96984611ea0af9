"""Held Work over the API: the needs-you list, approve/refuse a human-gate hold, release a
budget hold. The CLI calls the same functions on the store when no daemon runs.

Routes are declared here as plain tuples and registered by ``_app`` (``APPROVAL_ROUTES``,
``APPROVAL_HANDLERS``), so this module does not import the app.
"""

from __future__ import annotations

from typing import Any

import msgspec

from conduit_core.http._tokens import actor_of
from conduit_core.runtime import HUMAN_GATE, NeedsYou, needs_you

__all__ = [
    "APPROVAL_HANDLERS",
    "APPROVAL_ROUTES",
    "NeedsYouView",
    "SettleRequest",
    "SettledView",
    "approve",
    "list_needs_you",
    "refuse",
    "release",
]


class SettleRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Why the person settled the hold (recorded on the settlement event)."""

    reason: str = ""


class SettledView(msgspec.Struct, frozen=True, kw_only=True):
    work_id: str
    status: str
    #: ``approved``, ``refused`` (the Work is cancelled) or ``released``.
    action: str
    #: The name of the token that settled it (recorded on the settlement event).
    actor: str | None = None


class NeedsYouView(msgspec.Struct, frozen=True, kw_only=True):
    items: list[NeedsYou]


async def list_needs_you(svc: Any) -> NeedsYouView:
    return NeedsYouView(items=await needs_you(svc.store))


async def approve(
    svc: Any, work_id: str, req: SettleRequest, *, actor: str | None = None
) -> SettledView:
    work = await svc.scheduler.settle_gate_hold(
        work_id, HUMAN_GATE, admit=True, reason=req.reason, actor=actor
    )
    svc.host.wake()
    return SettledView(work_id=work.id, status=str(work.status), action="approved", actor=actor)


async def refuse(
    svc: Any, work_id: str, req: SettleRequest, *, actor: str | None = None
) -> SettledView:
    work = await svc.scheduler.settle_gate_hold(
        work_id, HUMAN_GATE, admit=False, reason=req.reason, actor=actor
    )
    return SettledView(work_id=work.id, status=str(work.status), action="refused", actor=actor)


async def release(
    svc: Any, work_id: str, req: SettleRequest, *, actor: str | None = None
) -> SettledView:
    work = await svc.scheduler.release_hold(work_id, reason=req.reason, actor=actor)
    svc.host.wake()
    return SettledView(work_id=work.id, status=str(work.status), action="released", actor=actor)


async def _needs_you(svc: Any, request: Any, body: Any) -> msgspec.Struct:
    return await list_needs_you(svc)


async def _approve(svc: Any, request: Any, body: Any) -> msgspec.Struct:
    return await approve(svc, request.path_params["id"], body, actor=actor_of(request))


async def _refuse(svc: Any, request: Any, body: Any) -> msgspec.Struct:
    return await refuse(svc, request.path_params["id"], body, actor=actor_of(request))


async def _release(svc: Any, request: Any, body: Any) -> msgspec.Struct:
    return await release(svc, request.path_params["id"], body, actor=actor_of(request))


#: (method, path, summary, response, status, body) — ``_app`` makes them ``ApiRoute``s.
_Route = tuple[str, str, str, type[msgspec.Struct], int, type[msgspec.Struct] | None]
APPROVAL_ROUTES: tuple[_Route, ...] = (
    ("GET", "/v1/needs-you", "Held Work (budget and gate holds): why, and how to settle it",
     NeedsYouView, 200, None),
    ("POST", "/v1/work/{id}/approve", "Approve the human gate's hold (the next start skips the "
     "gates once)", SettledView, 200, SettleRequest),
    ("POST", "/v1/work/{id}/refuse", "Refuse the human gate's hold: cancels the Work",
     SettledView, 200, SettleRequest),
    ("POST", "/v1/work/{id}/release", "Release a budget hold: lets one more start through",
     SettledView, 200, SettleRequest),
)  # fmt: skip

APPROVAL_HANDLERS = {
    ("GET", "/v1/needs-you"): _needs_you,
    ("POST", "/v1/work/{id}/approve"): _approve,
    ("POST", "/v1/work/{id}/refuse"): _refuse,
    ("POST", "/v1/work/{id}/release"): _release,
}
