"""Set-based writes of many new rows in one transaction: Work with their first inputs, events.

A Routine claim pass fires up to a thousand Routines at once; writing each fire's Work, input and
observability events with the one-row operations costs ~8 round trips per Work and per event on
a server. These do the same writes with one existence check, one block of event sequence
numbers (``next_event_seqs``) and one statement per table (set-based over arrays on PostgreSQL,
``write_rows``; ``executemany`` on SQLite). Their results equal
the one-row operations' (``create_work``, ``accept_event``) applied in order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from conduit_core.errors import ConduitError
from conduit_core.model import Event, Work
from conduit_core.storage._cx import chunks
from conduit_core.storage._key_parking import parked_on_insert
from conduit_core.storage._ops_dependencies import plan_dependencies
from conduit_core.storage._ops_work import accept_event
from conduit_core.storage._sql import (
    WORK_COLUMNS,
    WORK_MARKS,
    Cx,
    SetWrite,
    dump,
    is_claimable,
    next_event_seqs,
    ready_rank,
    work_params,
    write_rows,
)

__all__ = ["accept_events", "create_works"]

#: Ids per ``IN (…)`` list (well under both backends' parameter limits).
_CHUNK = 1_000

#: New Work rows, ``work_params`` each (one set-based statement where the backend has arrays).
_INSERT_WORK = SetWrite(
    f"INSERT INTO conduit_work ({WORK_COLUMNS}) VALUES {WORK_MARKS}",
    f"INSERT INTO conduit_work ({WORK_COLUMNS}) "
    "SELECT * FROM unnest(%b::text[], %b::text[], %b::text[], %b::int[], %b::bigint[], "
    "%b::text[], %b::text[], %b::bigint[], %b::text[], %b::text[], %b::int[], %b::int[])",
)
#: New event rows, ``_event_row`` each.
_INSERT_EVENT = SetWrite(
    "INSERT INTO conduit_event (id, delivery_id, seq, work_id, pending, data) "
    "VALUES (?, ?, ?, ?, ?, ?)",
    "INSERT INTO conduit_event (id, delivery_id, seq, work_id, pending, data) "
    "SELECT * FROM unnest(%b::text[], %b::text[], %b::bigint[], %b::text[], %b::int[], "
    "%b::text[])",
)


def _existing(cx: Cx, table: str, column: str, values: Sequence[str]) -> set[str]:
    found: set[str] = set()
    for chunk in chunks(sorted(set(values)), _CHUNK):
        marks = ", ".join("?" for _ in chunk)
        rows = cx.rows(f"SELECT {column} FROM {table} WHERE {column} IN ({marks})", chunk)
        found.update(str(r[0]) for r in rows)
    return found


def _event_row(event: Event) -> tuple[Any, ...]:
    return (event.id, event.delivery_id, event.seq, event.work_id, int(event.pending), dump(event))


def create_works(cx: Cx, items: Sequence[tuple[Work, Event | None]]) -> list[Work | ConduitError]:
    """``create_work`` for each ``(work, first_input)`` in order: the Work as stored, or a
    ``work_exists`` error for an id already taken (nothing is written for that item)."""
    taken = _existing(cx, "conduit_work", "id", [work.id for work, _ in items])
    delivered = _existing(
        cx, "conduit_event", "delivery_id", [e.delivery_id for _, e in items if e is not None]
    )
    results: list[Work | ConduitError | None] = []
    fresh_items: list[tuple[Work, Event | None]] = []
    for work, first_input in items:
        if work.id in taken:
            results.append(ConduitError(f"work {work.id!r} already exists", code="work_exists"))
            continue
        taken.add(work.id)
        results.append(None)
        fresh_items.append((work, first_input))
    plan = plan_dependencies(cx, [work for work, _ in fresh_items])
    decided = iter(fresh_items)
    works: list[tuple[Work, Event | None]] = []
    inputs: list[Event] = []
    for index, result in enumerate(results):
        if result is not None:
            continue
        work, first_input = next(decided)
        planned = work if plan is None else plan.items[work.id]
        if isinstance(planned, ConduitError):
            results[index] = planned
            continue
        fresh = first_input is not None and first_input.delivery_id not in delivered
        if fresh:
            assert first_input is not None
            delivered.add(first_input.delivery_id)
            inputs.append(msgspec.structs.replace(first_input, work_id=work.id, pending=True))
        stored = msgspec.structs.replace(planned, pending_inputs=int(fresh), last_attempt=0)
        works.append((stored, first_input if fresh else None))
        results[index] = stored
    if plan is not None:
        plan.write(cx)
    if works:
        ready = sorted((w for w, _ in works if is_claimable(w)), key=_claim_order)
        parked = parked_on_insert(cx, ready, ready_rank)
        rows = [work_params(w, e, parked=w.id in parked) for w, e in works]
        write_rows(cx, _INSERT_WORK, rows)
    _insert_numbered(cx, inputs)
    return [r for r in results if r is not None]


def _claim_order(work: Work) -> tuple[int, str]:
    return ready_rank(work), work.id


def accept_events(cx: Cx, events: Sequence[Event]) -> None:
    """``accept_event`` for each event, in order. Events that feed no Work (``pending`` false or
    no ``work_id``: observability records) are written set-based; the others one by one."""
    delivered = _existing(
        cx, "conduit_event", "delivery_id", [e.delivery_id for e in events if not _feeds(e)]
    )
    plain: list[Event] = []
    for event in events:
        if _feeds(event):
            accept_event(cx, event)
        elif event.delivery_id not in delivered:
            delivered.add(event.delivery_id)
            plain.append(msgspec.structs.replace(event, pending=False))
    _insert_numbered(cx, plain)


def _insert_numbered(cx: Cx, events: list[Event]) -> None:
    """Number ``events`` in order from the store's one source and insert them (one round trip)."""
    if not events:
        return
    seqs = next_event_seqs(cx, len(events))
    write_rows(
        cx,
        _INSERT_EVENT,
        [_event_row(msgspec.structs.replace(e, seq=n)) for e, n in zip(events, seqs, strict=True)],
    )


def _feeds(event: Event) -> bool:
    return event.pending and event.work_id is not None
