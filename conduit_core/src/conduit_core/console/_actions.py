"""The console's actions (``POST``): each is one call of the API's service layer.

A form's fields become the same request Struct the HTTP API decodes, through ``msgspec.convert``,
so a field is checked exactly as ``POST /v1/...`` checks it (a refusal names the field and has
the same code, and nothing changes). The session and CSRF checks ran before any of this.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qsl, quote

import msgspec
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from conduit_core.console._pages import Schedules
from conduit_core.console._render import SECURITY_HEADERS, page
from conduit_core.console._session import Session, action_role
from conduit_core.errors import ConduitError
from conduit_core.http import (
    BULK_ACTIONS,
    DEFAULT_BULK_CAP,
    ApiService,
    BulkRequest,
    CancelRequest,
    ConfirmStoppedRequest,
    InputRequest,
    InterruptRequest,
    RetryRequest,
    SettleRequest,
    WorkFilter,
    approve,
    refuse,
    release,
    require,
)
from conduit_core.routines import ScheduleChange

__all__ = ["ConsoleActions", "WORK_ACTIONS", "SCHEDULE_ACTIONS", "next_page"]

#: Who the audit records for a stop a person confirmed in the console.
CONSOLE_ACTOR = "console"
WORK_ACTIONS = ("approve", "refuse", "release", "confirm-stopped", "cancel", "retry",
                "interrupt", "inject")  # fmt: skip
SCHEDULE_ACTIONS = ("pause", "resume", "run")


def next_page(form: dict[str, str], default: str) -> str:
    """Where to go after an action: the form's ``next`` if it is a console path, else default."""
    value = form.get("next", "")
    if value.startswith("/ui/") and not value.startswith("//") and "\\" not in value:
        return value
    return default


def _convert(fields: dict[str, Any], kind: type[Any]) -> Any:
    try:
        return msgspec.convert(fields, kind)
    except msgspec.ValidationError as exc:
        raise ConduitError(f"invalid form: {exc}", code="invalid_body") from exc


def _payload(form: dict[str, str]) -> Any:
    text = form.get("payload", "").strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConduitError(f"payload is not JSON: {exc.msg} (at character {exc.pos})",
                           code="invalid_json") from exc  # fmt: skip


class ConsoleActions:
    """State-changing actions of the console, over the API's service layer."""

    def __init__(self, service: ApiService, schedules: Schedules) -> None:
        self.service = service
        self.schedules = schedules

    async def work_action(self, request: Request, session: Session) -> Response:
        work_id: str = request.path_params["id"]
        action: str = request.path_params["action"]
        form: dict[str, str] = request.state.form
        if action not in WORK_ACTIONS:
            raise ConduitError(f"no Work action {action!r} (one of {', '.join(WORK_ACTIONS)})",
                               code="not_found")  # fmt: skip
        require(session.principal, action_role(action), f"the console's {action}")
        actor = session.principal.name
        reason = form.get("reason", "").strip()
        svc = self.service
        if action in ("approve", "refuse", "release"):
            if action == "refuse" and not reason:
                raise ConduitError("reason: say why you refuse (it is recorded)",
                                   code="invalid_body")  # fmt: skip
            settle = {"approve": approve, "refuse": refuse, "release": release}[action]
            done = await settle(
                svc, work_id, _convert({"reason": reason}, SettleRequest), actor=actor
            )
            message = f"{done.action} {work_id} (now {done.status})"
        elif action == "confirm-stopped":
            epoch = form.get("epoch", "")
            if not epoch.isdigit():
                raise ConduitError(f"epoch: {epoch!r} is not a whole number",
                                   code="invalid_body")  # fmt: skip
            fields = {"epoch": int(epoch), "reason": reason, "by": CONSOLE_ACTOR}
            await svc.confirm_stopped(
                work_id, _convert(fields, ConfirmStoppedRequest), actor=actor
            )
            message = f"stop confirmed for {work_id} (epoch {epoch})"
        elif action == "inject":
            fields = {"payload": _payload(form), "type": form.get("type") or "core.input"}
            event = await svc.inject(work_id, _convert(fields, InputRequest), actor=actor)
            where = "delivered to the running attempt" if event.control_id else "queued"
            message = f"input {event.id} {where}"
        else:
            why = {"reason": reason}
            if action == "cancel":
                detail = await svc.cancel(work_id, _convert(why, CancelRequest), actor=actor)
            elif action == "retry":
                detail = await svc.retry(work_id, _convert(why, RetryRequest), actor=actor)
            else:
                detail = await svc.interrupt(
                    work_id, _convert(why, InterruptRequest), actor=actor
                )
            message = f"{action} requested for {work_id} (now {detail.work.status})"
        session.flash("ok", message)
        return _redirect(next_page(form, f"/ui/work/{_quote(work_id)}"))

    async def work_bulk(self, request: Request, session: Session) -> Response:
        """A bulk action over the selected rows or everything matching the list's filter: first
        a dry run (the count, the first ids, a confirm button), then, confirmed, per-item
        results. The API's bulk operation does both (``http/_bulk``)."""
        form: dict[str, str] = request.state.form
        action = form.get("action", "")
        if action not in BULK_ACTIONS:
            raise ConduitError(f"action: {action!r} is not one of {', '.join(BULK_ACTIONS)}",
                               code="invalid_body")  # fmt: skip
        require(session.principal, action_role(action), f"the console's bulk {action}")
        target = form.get("target", "selected")
        filter_query = form.get("filter", "")
        reason = form.get("reason", "").strip()
        fields: dict[str, Any] = {"reason": reason, "dry_run": form.get("confirm") != "1"}
        if form.get("cap", "").isdigit():
            fields["cap"] = int(form["cap"])
        ids = [i for i in form.get("ids", "").split("\n") if i]
        if target == "filter":
            fields["filter"] = WorkFilter.from_query(dict(parse_qsl(filter_query)))
        elif ids:
            fields["ids"] = ids
        else:
            raise ConduitError("select rows first, or act on all Work matching the filter",
                               code="invalid_body")  # fmt: skip
        if action == "refuse" and not reason and not fields["dry_run"]:
            raise ConduitError("reason: say why you refuse (it is recorded)", code="invalid_body")
        result = await self.service.bulk(action, _convert(fields, BulkRequest),
                                         actor=session.principal.name)  # fmt: skip
        return page("work_bulk.html", session=session, flashes=session.take_flashes(),
                    nav="work", result=result, action=action, target=target,
                    filter_query=filter_query, ids=ids, reason=reason,
                    cap=fields.get("cap", DEFAULT_BULK_CAP))  # fmt: skip

    async def schedule_action(self, request: Request, session: Session) -> Response:
        schedule_id: str = request.path_params["id"]
        action: str = request.path_params["action"]
        form: dict[str, str] = request.state.form
        if action not in SCHEDULE_ACTIONS:
            raise ConduitError(
                f"no schedule action {action!r} (one of {', '.join(SCHEDULE_ACTIONS)})",
                code="not_found",
            )
        require(session.principal, action_role(action), f"the console's schedule {action}")
        change = _convert({"action": action}, ScheduleChange)
        record = await self.schedules().change(
            schedule_id, change, actor=session.principal.name
        )
        verb = {"pause": "paused", "resume": "resumed", "run": "fired"}[action]
        session.flash("ok", f"{verb} {record.id} (now {record.status})")
        return _redirect(next_page(form, "/ui/routines"))


def _quote(value: str) -> str:
    return quote(value, safe="")


def _redirect(to: str) -> Response:
    return RedirectResponse(to, status_code=303, headers=SECURITY_HEADERS)
