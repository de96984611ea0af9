"""The console's pages (reads only): each asks the API's service layer, as the HTTP API does.

Fragments (``…/rows``, ``…/live``, ``needs-you/count``) are what htmx polls to keep a page live
without a reload; each is the same template block the full page renders first.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import anyio
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from conduit_core.console._render import SECURITY_HEADERS, page
from conduit_core.console._session import Session
from conduit_core.errors import ConduitError, NotFoundError
from conduit_core.http import (
    BULK_ACTIONS,
    LISTED_STATES,
    OUTPUT_STREAMS,
    ApiService,
    WorkFilter,
    WorkPage,
    check_stream,
    list_needs_you,
)
from conduit_core.http.describe import (
    attempt_outcome,
    latest_artifacts,
    launch_trail,
    segment_marks,
    work_note,
)
from conduit_core.routines import ConduitRoutineSource, ScheduleMultiplexer

__all__ = ["MAX_ARTIFACT_BYTES", "NEEDS_SHOWN", "ConsolePages", "Schedules", "routine_source"]

#: The schedule surface of the running daemon (replaced on reload, hence a callable).
Schedules = Callable[[], ScheduleMultiplexer]
#: The tail of a job's output a page shows (the file on disk has all of it).
MAX_ARTIFACT_BYTES = 256 * 1024
#: The tail of a running attempt's stdout and stderr the Work page shows (refreshed every 2 s).
LIVE_TAIL_BYTES = 16 * 1024
#: History entries the Work page shows (newest first); its history page pages through all.
HISTORY_SHOWN = 30
_PAGE_SIZES = (25, 50, 100, 200)
#: Held items the Needs-you page lists (it is polled; `conduit needs-you` lists them all).
NEEDS_SHOWN = 100
#: Helpers every template may call: the CLI's own wording of a Work, an attempt and a segment.
_DESCRIBE: dict[str, Any] = {
    "work_note": work_note,
    "attempt_outcome": attempt_outcome,
    "launch_trail": launch_trail,
    "segment_marks": segment_marks,
}


def routine_source(schedules: ScheduleMultiplexer) -> ConduitRoutineSource:
    for source in schedules.sources:
        if isinstance(source, ConduitRoutineSource):
            return source
    raise ConduitError("this daemon serves no conduit Routines", code="not_found")


def _list_filters(request: Request) -> tuple[WorkFilter, int, str | None]:
    """The work list's filter (the API's query model: every filter a deep link), page size and
    cursor. The form's ``input`` field (``KEY=VALUE``) stands for ``input.KEY=VALUE``."""
    params = {k: v.strip() for k, v in request.query_params.items() if k not in ("input",)}
    typed = request.query_params.get("input", "").strip()
    if typed:
        key, _, value = typed.partition("=")
        params[f"input.{key}"] = value
    filters = WorkFilter.from_query(params, also=("limit", "after"))
    limit = params.get("limit", "50")
    if not limit.isdigit() or int(limit) not in _PAGE_SIZES:
        raise ConduitError(
            f"limit {limit!r} is not one of {', '.join(map(str, _PAGE_SIZES))}",
            code="invalid_query",
        )
    return filters, int(limit), params.get("after") or None


def _queries(filters: WorkFilter, limit: int, after: str | None,
             page_view: WorkPage) -> dict[str, str]:  # fmt: skip
    """This page's query (what its rows poll), the next page's, and the filter's alone (a deep
    link, and what a bulk action over "all matching" sends)."""
    base = {**filters.to_query(), "limit": str(limit)}
    this = {**base, **({"after": after} if after else {})}
    following = {**base, **({"after": page_view.next} if page_view.next else {})}
    return {"query": urlencode(this), "next_query": urlencode(following),
            "filter_query": urlencode(filters.to_query())}  # fmt: skip


class ConsolePages:
    """Read-only pages over the API's service layer and the daemon's schedule surface."""

    def __init__(self, service: ApiService, schedules: Schedules) -> None:
        self.service = service
        self.schedules = schedules

    def _page(self, name: str, session: Session, nav: str, **context: Any) -> Response:
        return page(name, session=session, flashes=session.take_flashes(), nav=nav,
                    **_DESCRIBE, **context)  # fmt: skip

    def _fragment(self, name: str, session: Session, **context: Any) -> Response:
        return page(name, session=session, **_DESCRIBE, **context)

    # --- needs you ------------------------------------------------------------------------------

    async def needs_you(self, request: Request, session: Session) -> Response:
        view = await list_needs_you(self.service)
        return self._page("needs_you.html", session, "needs", items=view.items[:NEEDS_SHOWN],
                          total=len(view.items))  # fmt: skip

    async def needs_you_list(self, request: Request, session: Session) -> Response:
        view = await list_needs_you(self.service)
        return self._fragment("_needs_list.html", session, items=view.items[:NEEDS_SHOWN],
                              total=len(view.items))  # fmt: skip

    async def needs_you_count(self, request: Request, session: Session) -> Response:
        view = await list_needs_you(self.service)
        return self._fragment("_needs_count.html", session, count=len(view.items))

    # --- work -----------------------------------------------------------------------------------

    async def _work_page(self, request: Request) -> dict[str, Any]:
        filters, limit, after = _list_filters(request)
        page_view = await self.service.list_work(filters, limit=limit, after=after)
        return {"filters": filters, "limit": limit, "after": after, "page": page_view,
                "input_text": filters.input or "",
                **_queries(filters, limit, after, page_view)}  # fmt: skip

    async def work_list(self, request: Request, session: Session) -> Response:
        if "input" in request.query_params:  # the form's KEY=VALUE: redirect to the deep link
            filters, limit, _ = _list_filters(request)
            query = urlencode({**filters.to_query(), "limit": str(limit)})
            return RedirectResponse(f"/ui/work?{query}", status_code=303,
                                    headers=SECURITY_HEADERS)  # fmt: skip
        context = await self._work_page(request)
        config = self.service.config
        return self._page(
            "work_list.html", session, "work", statuses=list(LISTED_STATES),
            scopes=sorted(config.scopes), bindings=sorted(config.bindings), sizes=_PAGE_SIZES,
            actions=BULK_ACTIONS, **context,
        )  # fmt: skip

    async def work_rows(self, request: Request, session: Session) -> Response:
        return self._fragment("_work_rows.html", session, **await self._work_page(request))

    async def _work_context(self, work_id: str) -> dict[str, Any]:
        """Everything the Work page's live part shows: it is re-rendered whole every 2 s, so its
        actions, inputs, live output and history follow the Work's state."""
        svc = self.service
        detail = await svc.show(work_id)
        live = [
            await svc.output(work_id, a.attempt, stream, LIVE_TAIL_BYTES)
            for a in detail.attempts if a.status.live
            for stream in OUTPUT_STREAMS
        ]  # fmt: skip
        return {
            "detail": detail, "inputs": await svc.inputs(work_id),
            "outputs": latest_artifacts(detail), "live_output": live,
            "live_tail_kib": LIVE_TAIL_BYTES // 1024,
            "history": await svc.history(work_id, limit=HISTORY_SHOWN, newest=True),
        }  # fmt: skip

    async def work_detail(self, request: Request, session: Session) -> Response:
        context = await self._work_context(request.path_params["id"])
        return self._page("work_detail.html", session, "work", **context)

    async def work_live(self, request: Request, session: Session) -> Response:
        context = await self._work_context(request.path_params["id"])
        return self._fragment("_work_live.html", session, **context)

    async def work_history(self, request: Request, session: Session) -> Response:
        after = request.query_params.get("after") or None
        history = await self.service.history(request.path_params["id"], limit=200, after=after)
        return self._page("work_history.html", session, "work", history=history)

    async def output(self, request: Request, session: Session) -> Response:
        """An attempt's stdout/stderr as its executor keeps it (a cancelled attempt's too)."""
        stream = check_stream(request.path_params["stream"])
        tail = await self.service.output(request.path_params["id"], request.path_params["attempt"],
                                         stream, MAX_ARTIFACT_BYTES)  # fmt: skip
        return self._page("output.html", session, "work", tail=tail,
                          max_kib=MAX_ARTIFACT_BYTES // 1024)  # fmt: skip

    async def artifact(self, request: Request, session: Session) -> Response:
        """A job's output file, only if an attempt's result names it and it lies in the daemon's
        state directory (an artifact reference is never a way to read any file)."""
        work_id: str = request.path_params["id"]
        number: int = request.path_params["attempt"]
        name: str = request.path_params["name"]
        detail = await self.service.show(work_id)
        attempt = next((a for a in detail.attempts if a.attempt == number), None)
        if attempt is None:
            raise NotFoundError("attempt", f"{work_id}#{number}")
        found = [a for a in (attempt.result.artifacts if attempt.result else []) if a.name == name]
        if not found:
            raise NotFoundError("artifact", f"{work_id}#{number}/{name}")
        text, note = await anyio.to_thread.run_sync(self._read_artifact, found[0].ref)
        return self._page("artifact.html", session, "work", detail=detail, attempt=attempt,
                          artifact=found[0], text=text, note=note)  # fmt: skip

    def _read_artifact(self, ref: str) -> tuple[str | None, str | None]:
        state_dir = self.service.scheduler.options.state_dir
        path = Path(ref)
        if state_dir is None or not path.is_absolute():
            return None, "this artifact is not a file of this daemon: not shown"
        root = Path(state_dir).resolve()
        try:
            real = path.resolve(strict=True)
        except (OSError, RuntimeError):
            return None, f"{ref} is not on this host (or was removed)"
        if not real.is_relative_to(root) or not real.is_file():
            return None, f"{ref} is outside the daemon's state directory: not shown"
        size = real.stat().st_size
        with real.open("rb") as file:
            if size > MAX_ARTIFACT_BYTES:
                file.seek(size - MAX_ARTIFACT_BYTES, os.SEEK_SET)
            data = file.read(MAX_ARTIFACT_BYTES)
        note = (
            f"the last {MAX_ARTIFACT_BYTES // 1024} KiB of {size} bytes"
            if size > MAX_ARTIFACT_BYTES
            else None
        )
        return data.decode("utf-8", errors="replace"), note

    # --- routines and schedules -----------------------------------------------------------------

    async def routines(self, request: Request, session: Session) -> Response:
        merged = await self.schedules().read()
        records = [r for r in merged.records if r.domain == "conduit"]
        bindings = sorted(self.service.config.bindings)
        return self._page("routines.html", session, "routines", records=records,
                          example_binding=bindings[0] if bindings else "BINDING")  # fmt: skip

    async def routine(self, request: Request, session: Session) -> Response:
        routine_id: str = request.path_params["id"]
        source = routine_source(self.schedules())
        routine = await source.get(routine_id)
        runs = await source.history(routine_id, limit=50)
        return self._page("routine.html", session, "routines", routine=routine, runs=runs,
                          schedule_id=f"{source.name}:{routine.id}")  # fmt: skip

    async def schedules_page(self, request: Request, session: Session) -> Response:
        merged = await self.schedules().read()
        return self._page("schedules.html", session, "schedules", merged=merged)

    # --- capacity -------------------------------------------------------------------------------

    async def capacity(self, request: Request, session: Session) -> Response:
        view = await self.service.capacity()
        daemons = await self.service.daemons()
        return self._page("capacity.html", session, "capacity", view=view, daemons=daemons)

    async def capacity_live(self, request: Request, session: Session) -> Response:
        view = await self.service.capacity()
        daemons = await self.service.daemons()
        return self._fragment("_capacity_live.html", session, view=view, daemons=daemons)
