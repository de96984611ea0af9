"""``conduit approve``, ``conduit refuse``, ``conduit release`` and ``conduit needs-you``.

Through the running daemon's API when there is one, else directly on the store (the daemon
sharing it picks the change up on its next pass).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from conduit_core.cli._context import config_option, json_option, open_api, print_json, run

if TYPE_CHECKING:
    from conduit_core.http._approvals import NeedsYouView, SettledView

__all__ = ["approve_command", "needs_you_command", "refuse_command", "release_command"]


async def _settle(config_path: Path | None, action: str, work_id: str, reason: str) -> SettledView:
    from conduit_core.http import ApiClient
    from conduit_core.http._approvals import SettledView, SettleRequest, approve, refuse, release

    req = SettleRequest(reason=reason)
    async with open_api(config_path) as api:
        if isinstance(api, ApiClient):
            return api.request("POST", f"/v1/work/{_quote(work_id)}/{action}", req, SettledView)
        do = {"approve": approve, "refuse": refuse, "release": release}[action]
        result: SettledView = await do(api, work_id, req)
        return result


def _quote(part: str) -> str:
    from urllib.parse import quote

    return quote(part, safe="")


def _print(view: SettledView, as_json: bool) -> None:
    from conduit_core.cli._render import console

    if as_json:
        print_json(view)
    else:
        console().print(f"{view.action} {view.work_id} (now {view.status})")


@click.command("approve")
@click.argument("work_id")
@click.option("--reason", default="", help="Why (recorded with the approval).")
@config_option
@json_option
def approve_command(work_id: str, reason: str, config_path: Path | None, as_json: bool) -> None:
    """Approve WORK_ID held by the human gate: its start goes on (once)."""
    _print(run(lambda: _settle(config_path, "approve", work_id, reason)), as_json)


@click.command("refuse")
@click.argument("work_id")
@click.option("--reason", required=True, help="Why (recorded with the refusal).")
@config_option
@json_option
def refuse_command(work_id: str, reason: str, config_path: Path | None, as_json: bool) -> None:
    """Refuse WORK_ID held by the human gate: the Work is cancelled."""
    _print(run(lambda: _settle(config_path, "refuse", work_id, reason)), as_json)


@click.command("release")
@click.argument("work_id")
@click.option("--reason", default="", help="Why (recorded with the release).")
@config_option
@json_option
def release_command(work_id: str, reason: str, config_path: Path | None, as_json: bool) -> None:
    """Release WORK_ID's budget hold: one more start goes through, over budget or not."""
    _print(run(lambda: _settle(config_path, "release", work_id, reason)), as_json)


@click.command("needs-you")
@config_option
@json_option
def needs_you_command(config_path: Path | None, as_json: bool) -> None:
    """Every held Work (budget and gate holds, held recoveries, unverified stops), why, and
    how to settle it."""

    from conduit_core.cli._render import console
    from conduit_core.http import ApiClient
    from conduit_core.http._approvals import NeedsYouView, list_needs_you

    async def go() -> NeedsYouView:
        async with open_api(config_path) as api:
            if isinstance(api, ApiClient):
                return api.request("GET", "/v1/needs-you", None, NeedsYouView)
            view: NeedsYouView = await list_needs_you(api)
            return view

    view = run(go)
    if as_json:
        print_json(view)
        return
    if not view.items:
        console().print("nothing needs you: no Work is held")
        return
    for item in view.items:
        _line(item)


def _line(item: Any) -> None:
    from rich.text import Text

    from conduit_core.cli._render import console

    console().print(
        Text.assemble(
            (item.work_id, "bold"),
            f" ({item.binding}, scope {item.scope}) held by {item.kind} {item.holder!r}: "
            f"{item.reason}\n  settle: {item.settle}",
        )
    )
