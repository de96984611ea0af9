"""Templates and responses: one Jinja2 environment that escapes everything, and the headers every
console answer carries.

Autoescaping is on for every template whatever its name (not only ``*.html``), so text a job or a
user wrote (ids, reasons, payloads, job output) is always data, never markup. The Content Security
Policy allows scripts and styles from the console's own static files only: no inline script, no
``eval`` (htmx runs with ``allowEval`` off), so even a missed escape could not run code.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import msgspec
from jinja2 import Environment, PackageLoader, StrictUndefined
from starlette.responses import HTMLResponse, Response

__all__ = ["SECURITY_HEADERS", "page", "when"]

SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}

#: Longest payload shown on a page; the rest is cut with a note (the API has all of it).
MAX_SHOWN_JSON = 16 * 1024


def when(ms: int | None, zone: str | None = None) -> str:
    """An instant in ``zone`` (default UTC) as ``YYYY-MM-DD HH:MM:SS ZONE``; ``-`` for none."""
    if ms is None:
        return "-"
    try:
        tz = ZoneInfo(zone) if zone else UTC
    except (ZoneInfoNotFoundError, ValueError):
        tz = UTC
    try:
        moment = datetime.fromtimestamp(ms / 1000, tz)
    except (OverflowError, OSError, ValueError):
        return f"{ms} ms (out of range)"
    return moment.strftime("%Y-%m-%d %H:%M:%S ") + (zone or "UTC")


def _pretty(value: Any) -> str:
    try:
        text = json.dumps(msgspec.to_builtins(value), indent=2, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):
        text = repr(value)
    if len(text) > MAX_SHOWN_JSON:
        text = text[:MAX_SHOWN_JSON] + f"\n… ({len(text) - MAX_SHOWN_JSON} more characters)"
    return text


def _segment(value: str) -> str:
    """One URL path segment: every reserved character (``/`` too) percent-encoded."""
    return quote(value, safe="")


def _duration(start: int | None, end: int | None) -> str:
    if start is None or end is None:
        return "-"
    return f"{(end - start) / 1000:.1f} s"


#: A budget window in a hold's key or reason: ``day:1796169600000``, ``window from 1796… ms``.
_WINDOW_KEY = re.compile(r"\b(life|day|week):(\d{10,15})\b")
_WINDOW_FROM = re.compile(r"\bwindow from (\d{10,15}) ms\b")


def _day(ms: str) -> str:
    return when(int(ms)).removesuffix(" 00:00:00 UTC").replace(" UTC", "Z")


def humanize(text: str | None) -> str:
    """Raw epoch milliseconds in budget hold keys and reasons as dates (``day:2026-12-03``)."""
    if not text:
        return ""
    text = _WINDOW_KEY.sub(lambda m: f"{m.group(1)} of {_day(m.group(2))}", text)
    return _WINDOW_FROM.sub(lambda m: f"window from {when(int(m.group(1)))}", text)


_ENV = Environment(
    loader=PackageLoader("conduit_core.console", "templates"),
    autoescape=True,
    undefined=StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_ENV.filters.update(when=when, pretty=_pretty, seg=_segment, duration=_duration, human=humanize)


def page(name: str, *, status: int = 200, **context: Any) -> Response:
    """Render template ``name`` with the security headers."""
    body = _ENV.get_template(name).render(**context)
    return HTMLResponse(body, status_code=status, headers=SECURITY_HEADERS)
