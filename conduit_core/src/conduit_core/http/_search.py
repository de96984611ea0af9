"""The Work list's query model, shared by ``GET /v1/work``, ``conduit work list``, the bulk
actions and the console's filter form (so every filter is a deep link).

A :class:`WorkFilter` holds the filters as the operator wrote them (query-parameter text);
:meth:`WorkFilter.resolve` checks them, each refusal naming its parameter with a stable code,
and gives the store's :class:`~conduit_core.storage.WorkQuery`. Pages continue from an opaque
cursor (``next``, passed back as ``after``): the last row's (created time, id), never an offset.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from conduit_core.errors import ConduitError
from conduit_core.model import EXHAUSTED, WorkStatus

if TYPE_CHECKING:
    from conduit_core.storage import WorkQuery

__all__ = [
    "FILTER_PARAMS",
    "LISTED_STATES",
    "SEARCH_QUERY",
    "WorkFilter",
    "decode_cursor",
    "encode_cursor",
    "parse_time",
]

#: What ``status`` may be: a Work status, or ``exhausted`` (ready, blocked until a person's retry).
LISTED_STATES = (*(s.value for s in WorkStatus), EXHAUSTED)
#: The filter parameters (besides ``input.KEY``), in the order the docs list them.
FILTER_PARAMS = ("id", "id_prefix", "binding", "status", "scope", "since", "until", "order")

#: ``GET /v1/work``'s query parameters for the OpenAPI document: ``(name, type, description)``.
SEARCH_QUERY: tuple[tuple[str, Any, str], ...] = (
    ("id", str, "exactly this Work id"),
    ("id_prefix", str, "ids starting with this"),
    ("binding", str, "only Work of this binding"),
    ("status", Literal[LISTED_STATES],
     "only Work in this state (`exhausted`: ready, blocked until a person's retry)"),
    ("scope", str, "only Work in this scope"),
    ("since", str, "created at or after: ISO-8601 with an offset, or relative (`-1h`)"),
    ("until", str, "created before: ISO-8601 with an offset, or relative (`-30m`)"),
    ("input.KEY", str, "the first input's top-level `KEY` equals this (as text)"),
    ("order", Literal["newest", "oldest"], "`newest` (default) or `oldest` first"),
    ("limit", int, "page size (1-500, default 100)"),
    ("after", str, "the previous page's `next` (an opaque cursor)"),
)

_PREFIX = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")
_KEY = re.compile(r"[A-Za-z0-9_\-]{1,64}")
_RELATIVE = re.compile(r"-(\d{1,9})([smhd])")
_UNIT_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


class WorkFilter(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Filters as text (``None``: no filter). ``input`` is ``KEY=VALUE``."""

    id: str | None = None
    id_prefix: str | None = None
    binding: str | None = None
    status: str | None = None
    scope: str | None = None
    #: Created at or after: ISO-8601 with an offset (``2026-12-03T12:00:00Z``) or relative to
    #: now (``-1h``; units ``s``, ``m``, ``h``, ``d``).
    since: str | None = None
    #: Created before, written as ``since``.
    until: str | None = None
    input: str | None = None
    #: ``newest`` (default) or ``oldest`` first.
    order: str = "newest"

    @classmethod
    def from_query(cls, params: Mapping[str, str], *, also: tuple[str, ...] = ()) -> WorkFilter:
        """From query parameters (``input.KEY=VALUE`` for the input filter); any name outside
        the filters and ``also`` is refused (``invalid_query``)."""
        fields: dict[str, Any] = {}
        for name, value in params.items():
            if name.startswith("input."):
                if "input" in fields:
                    raise _refuse(name, "one input.KEY filter at a time", "invalid_filter")
                fields["input"] = f"{name[len('input.'):]}={value}"
            elif name in FILTER_PARAMS:
                if value != "" or name == "order":
                    fields[name] = value
            elif name not in also:
                raise ConduitError(f"unknown query parameter {name!r}", code="invalid_query")
        return cls(**fields)

    def to_query(self) -> dict[str, str]:
        """The query parameters that give this filter back (a deep link's)."""
        out = {
            name: value for name in FILTER_PARAMS
            if (value := getattr(self, name)) is not None and not (name == "order"
                                                                  and value == "newest")
        }  # fmt: skip
        if self.input is not None and "=" in self.input:
            key, value = self.input.split("=", 1)
            out[f"input.{key}"] = value
        return out

    @property
    def empty(self) -> bool:
        """No filter at all (every Work matches)."""
        return not any(getattr(self, name) for name in FILTER_PARAMS if name != "order") and (
            self.input is None
        )

    def resolve(self, now_ms: int) -> WorkQuery:
        """The store's query, or a coded error naming the parameter at fault."""
        from conduit_core.storage import WorkQuery  # server side only: the client stays light

        if self.status is not None and self.status not in LISTED_STATES:
            raise _refuse("status", f"{self.status!r} is not one of {', '.join(LISTED_STATES)}",
                          "invalid_status")  # fmt: skip
        if self.order not in ("newest", "oldest"):
            raise _refuse("order", f"{self.order!r} is not newest or oldest", "invalid_filter")
        if self.id_prefix and not _PREFIX.fullmatch(self.id_prefix):
            raise _refuse("id_prefix", f"{self.id_prefix!r} cannot begin a Work id (letters, "
                          "digits, _ . : - up to 128)", "invalid_filter")  # fmt: skip
        key = value = None
        if self.input is not None:
            key, sep, value = self.input.partition("=")
            if not sep or not _KEY.fullmatch(key):
                raise _refuse(
                    "input", f"{self.input!r} is not KEY=VALUE with KEY of letters, digits, "
                    "_ or - (1-64)", "invalid_filter",
                )  # fmt: skip
        return WorkQuery(
            id=self.id, id_prefix=self.id_prefix or None, binding=self.binding,
            status=self.status, scope=self.scope,
            since_ms=None if self.since is None else parse_time("since", self.since, now_ms),
            until_ms=None if self.until is None else parse_time("until", self.until, now_ms),
            input_key=key, input_value=value, newest_first=self.order == "newest",
        )  # fmt: skip


def _refuse(param: str, why: str, code: str) -> ConduitError:
    return ConduitError(f"filter {param!r}: {why}", code=code)


def parse_time(param: str, text: str, now_ms: int) -> int:
    """``text`` as ms since the epoch: ISO-8601 with an offset, or ``-<n><s|m|h|d>`` from now."""
    relative = _RELATIVE.fullmatch(text.strip())
    if relative:
        return now_ms - int(relative.group(1)) * _UNIT_MS[relative.group(2)]
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise _refuse(param, f"{text!r} is neither ISO-8601 with an offset (2026-12-03T12:00:00Z) "
                      "nor relative to now (-1h, -30m, -2d)", "invalid_time")  # fmt: skip
    return int(moment.timestamp() * 1000)


def encode_cursor(position: tuple[int, str] | None) -> str | None:
    if position is None:
        return None
    raw = f"{position[0]}:{position[1]}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(token: str) -> tuple[int, str]:
    """A page cursor back to (created ms, id), or ``invalid_cursor`` naming ``after``."""
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        created, work_id = raw.split(":", 1)
        return int(created), work_id
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConduitError(
            f"query parameter 'after': {token!r} is not a page cursor (pass the previous "
            "page's `next` as it is)", code="invalid_cursor",
        ) from exc  # fmt: skip
