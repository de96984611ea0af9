"""Bulk actions: cancel, retry, approve or refuse every Work matching a filter, or a list of ids.

Per item, never all-or-nothing: each Work's action is the single action (``POST
/v1/work/{id}/cancel`` …) with its own transaction, its own fencing and its own audit record
(the token's name as actor), so one Work that changed state meanwhile (completed, already
cancelled, no longer held) fails alone with its code while the rest are done. Holding every
matched Work in one transaction would lock hundreds of rows the scheduler is claiming and
settling, and the cancel of a running attempt stops a process after commit, which no
transaction could roll back anyway.

The match is read before acting, at most ``cap`` + 1 ids, so a filter that matches more than
``cap`` is refused whole (``over_cap``) before anything is done; ``dry_run`` answers the count
and the first ids and does nothing. The run reads the filter again: Work that entered or left
it since the dry run is acted on as it is now (pass ``ids`` to act on exactly a set you saw).

Routes are declared here and registered by ``_app`` (``BULK_ROUTES``, ``BULK_HANDLERS``).
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

import msgspec

from conduit_core.errors import ConduitError
from conduit_core.http._schemas import CancelRequest, Reason, RetryRequest, WorkId
from conduit_core.http._search import WorkFilter

__all__ = [
    "BULK_ACTIONS",
    "BULK_HANDLERS",
    "BULK_ROUTES",
    "DEFAULT_BULK_CAP",
    "MAX_CAP",
    "BulkItem",
    "BulkRequest",
    "BulkResult",
    "run_bulk",
]

log = logging.getLogger("conduit.api")

BULK_ACTIONS = ("cancel", "retry", "approve", "refuse")
DEFAULT_BULK_CAP = 1000
MAX_CAP = 10_000
#: Ids a dry run shows.
SHOWN_IDS = 20


class BulkRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Which Work (``filter`` or ``ids``, exactly one), and how."""

    filter: WorkFilter | None = None
    ids: Annotated[list[WorkId], msgspec.Meta(max_length=MAX_CAP)] | None = None
    dry_run: bool = False
    cap: Annotated[int, msgspec.Meta(ge=1, le=MAX_CAP)] = DEFAULT_BULK_CAP
    reason: Reason = ""


class BulkItem(msgspec.Struct, frozen=True, kw_only=True):
    """One Work's outcome: done (its status after), or failed with a code and why."""

    id: str
    ok: bool
    status: str | None = None
    code: str | None = None
    error: str | None = None


class BulkResult(msgspec.Struct, frozen=True, kw_only=True):
    action: str
    dry_run: bool
    #: How many Work matched (at most ``cap``).
    matched: int
    #: A dry run's first matched ids (at most 20).
    ids: list[str] = []
    #: Per Work, in match order (empty for a dry run).
    results: list[BulkItem] = []
    succeeded: int = 0
    failed: int = 0
    actor: str | None = None


async def _matching(svc: Any, req: BulkRequest) -> list[str]:
    """The ids to act on, refusing a request without exactly one target or over its cap."""
    if (req.filter is None) == (req.ids is None):
        raise ConduitError("give exactly one of 'filter' or 'ids'", code="invalid_bulk")
    if req.ids is not None:
        ids = list(dict.fromkeys(req.ids))
        if len(ids) > req.cap:
            raise _over_cap(len(ids), req.cap)
        return ids
    assert req.filter is not None
    found: list[str] = []
    after: str | None = None
    while True:
        page = await svc.list_work(req.filter, limit=min(500, req.cap + 1 - len(found)),
                                   after=after)  # fmt: skip
        found.extend(w.id for w in page.items)
        if len(found) > req.cap:
            raise _over_cap(len(found), req.cap, more=True)
        if page.next is None:
            return found
        after = page.next


def _over_cap(count: int, cap: int, *, more: bool = False) -> ConduitError:
    many = f"more than {cap}" if more else str(count)
    return ConduitError(
        f"{many} Work match, over the cap of {cap}: narrow the filter or raise 'cap' "
        f"(at most {MAX_CAP}); nothing was done", code="over_cap",
    )  # fmt: skip


async def _act(svc: Any, action: str, work_id: str, reason: str, actor: str | None) -> str:
    """One Work's single action; its status after."""
    if action == "cancel":
        detail = await svc.cancel(work_id, CancelRequest(reason=reason), actor=actor)
        return str(detail.work.state or detail.work.status)
    if action == "retry":
        detail = await svc.retry(work_id, RetryRequest(reason=reason), actor=actor)
        return str(detail.work.state or detail.work.status)
    # Imported here: the runtime they call is the server's, never loaded by the API client.
    from conduit_core.http._approvals import SettleRequest, approve, refuse

    settle = approve if action == "approve" else refuse
    return (await settle(svc, work_id, SettleRequest(reason=reason), actor=actor)).status


async def run_bulk(svc: Any, action: str, req: BulkRequest, *, actor: str | None) -> BulkResult:
    """Match, then (unless a dry run) act on each Work alone; see the module docstring."""
    ids = await _matching(svc, req)
    if req.dry_run:
        return BulkResult(action=action, dry_run=True, matched=len(ids), ids=ids[:SHOWN_IDS],
                          actor=actor)  # fmt: skip
    results: list[BulkItem] = []
    for work_id in ids:
        try:
            status = await _act(svc, action, work_id, req.reason, actor)
        except ConduitError as exc:
            results.append(BulkItem(id=work_id, ok=False, code=exc.code, error=exc.message))
        else:
            results.append(BulkItem(id=work_id, ok=True, status=status))
    done = sum(r.ok for r in results)
    log.info("bulk %s matched=%d done=%d failed=%d reason=%r actor=%s", action, len(ids), done,
             len(ids) - done, req.reason, actor or "-")  # fmt: skip
    return BulkResult(action=action, dry_run=False, matched=len(ids), results=results,
                      succeeded=done, failed=len(ids) - done, actor=actor)  # fmt: skip


def _handler(action: str) -> Any:
    async def handle(svc: Any, request: Any, body: Any) -> msgspec.Struct:
        from conduit_core.http._tokens import actor_of

        return await run_bulk(svc, action, body, actor=actor_of(request))

    return handle


_SUMMARY = {
    "cancel": "Cancel every Work matching a filter or listed (per item; dry run, cap)",
    "retry": "Retry every Work matching a filter or listed (per item; dry run, cap)",
    "approve": "Approve the human gate's hold of every matching Work (per item; dry run, cap)",
    "refuse": "Refuse the human gate's hold of every matching Work (per item; dry run, cap)",
}

#: (method, path, summary, response, status, body) — ``_app`` makes them ``ApiRoute``s.
BULK_ROUTES = tuple(
    ("POST", f"/v1/work/bulk/{action}", _SUMMARY[action], BulkResult, 200, BulkRequest)
    for action in BULK_ACTIONS
)
BULK_HANDLERS = {("POST", f"/v1/work/bulk/{action}"): _handler(action) for action in BULK_ACTIONS}
