"""The Routine ledger's SQL operations, each inside one write transaction.

The ``status`` and ``next_run_at_ms`` columns and the JSON ``data`` are always written together,
so both backends read the same record. Transitions are pure functions the caller passes in
(``conduit_core.routines.ledger``), applied here to the freshly read row: storage never imports
the routines layer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from conduit_core.errors import ConduitError, NotFoundError
from conduit_core.model import Event, Routine, RoutineStatus, Work
from conduit_core.storage._cx import chunks
from conduit_core.storage._ops_bulk import accept_events
from conduit_core.storage._ops_work import accept_event
from conduit_core.storage._routine_records import (
    BoundWorkCheck,
    RoutineChange,
    RoutineRun,
    RoutineUpdate,
)
from conduit_core.storage._sql import (
    STILL_PENDING,
    Codec,
    Cx,
    SetWrite,
    as_columns,
    dump,
    find_work,
    first,
    save_work,
    write_rows,
)

__all__ = [
    "BoundWorkCheck",
    "RoutineChange",
    "RoutineRun",
    "RoutineUpdate",
    "apply_routine",
    "apply_routines",
    "claim_queued",
    "create_routine",
    "due_pass",
    "heal_routines",
    "next_due_at",
    "put_routines",
    "routine_history",
    "routines_in",
    "running_fires",
]

S = RoutineStatus

_run_decoder = msgspec.json.Decoder(RoutineRun)


def _params(routine: Routine) -> tuple[str, int | None, str, str]:
    return (str(routine.status), routine.next_run_at_ms, dump(routine), routine.id)


def _save(cx: Cx, routine: Routine) -> None:
    cx.run(_SAVE_ROUTINE.one, _params(routine))


def _insert_sql() -> str:
    return "INSERT INTO conduit_routine (id, status, next_run_at_ms, data) VALUES (?, ?, ?, ?)"


def create_routine(cx: Cx, routine: Routine, check: BoundWorkCheck) -> Routine:
    if first(cx, "SELECT 1 FROM conduit_routine WHERE id = ?", (routine.id,)) is not None:
        raise ConduitError(f"routine {routine.id!r} already exists", code="routine_exists")
    bound = routine.target.work_id
    work = find_work(cx, bound) if bound is not None else None
    stamped = check(routine, work)
    if stamped is not None:
        save_work(cx, stamped)
    status, next_run, data, _ = _params(routine)
    cx.run(_insert_sql(), (routine.id, status, next_run, data))
    return routine


def put_routines(cx: Cx, routines: Sequence[Routine]) -> None:
    cx.many(_insert_sql(), [(r.id, *_params(r)[:3]) for r in routines])


def apply_routine(
    cx: Cx,
    routine_id: str,
    change: RoutineChange,
    run: RoutineRun | None,
    events: Sequence[Event],
) -> Routine:
    before = _routines_by_id(cx, (routine_id,), lock=True).get(routine_id)
    if before is None:
        raise NotFoundError("routine", routine_id)
    after = change(before)
    if after is not before:
        _save(cx, msgspec.structs.replace(after, id=before.id))
    if run is not None:
        _put_run(cx, run)
    for event in events:
        accept_event(cx, event)
    return after


_PUT_RUN = SetWrite(
    "INSERT INTO conduit_routine_run "
    "(routine_id, scheduled_for_ms, work_id, outcome, started_at_ms, data) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (routine_id, scheduled_for_ms) DO UPDATE SET "
    "work_id = excluded.work_id, outcome = excluded.outcome, data = excluded.data",
    "INSERT INTO conduit_routine_run "
    "(routine_id, scheduled_for_ms, work_id, outcome, started_at_ms, data) "
    "SELECT * FROM unnest(%b::text[], %b::bigint[], %b::text[], %b::text[], %b::bigint[], "
    "%b::text[]) ON CONFLICT (routine_id, scheduled_for_ms) DO UPDATE SET "
    "work_id = excluded.work_id, outcome = excluded.outcome, data = excluded.data",
)
#: A Routine row, ``_params`` each (the rows of one statement are distinct Routines).
_SAVE_ROUTINE = SetWrite(
    "UPDATE conduit_routine SET status = ?, next_run_at_ms = ?, data = ? WHERE id = ?",
    "UPDATE conduit_routine SET status = v.status, next_run_at_ms = v.next_run_at_ms, "
    "data = v.data FROM unnest(%b::text[], %b::bigint[], %b::text[], %b::text[]) "
    "AS v(status, next_run_at_ms, data, id) WHERE conduit_routine.id = v.id",
)


def _run_row(run: RoutineRun) -> tuple[str, int, str | None, str, int, str]:
    return (
        run.routine_id,
        run.scheduled_for_ms,
        run.work_id,
        run.outcome,
        run.started_at_ms,
        dump(run),
    )


def _put_run(cx: Cx, run: RoutineRun) -> None:
    cx.run(_PUT_RUN.one, _run_row(run))


#: Ids per ``IN (…)`` list and rows per set-based write.
_CHUNK = 1_000


def _routines_by_id(cx: Cx, ids: Sequence[str], *, lock: bool) -> dict[str, Routine]:
    """The rows ``ids`` (missing ones left out); ``lock``: row-locked in id order till commit."""
    found: dict[str, Routine] = {}
    for chunk in chunks(sorted(set(ids)), _CHUNK):
        marks = ", ".join("?" for _ in chunk)
        sql = f"SELECT id, data FROM conduit_routine WHERE id IN ({marks}) ORDER BY id"
        for routine_id, data in cx.rows(sql + (" FOR UPDATE" if lock else ""), chunk):
            found[routine_id] = Codec.routine.decode(data)
    return found


def apply_routines(cx: Cx, updates: Sequence[RoutineUpdate]) -> list[Routine | ConduitError]:
    """``apply_routine`` for each update, in order, in one transaction: one read of the rows,
    one pipelined write per table. An update whose change refuses (or whose row is gone) is
    returned as its error and writes nothing; the others are written."""
    current = _routines_by_id(cx, [u.routine_id for u in updates], lock=True)
    results: list[Routine | ConduitError] = []
    changed: dict[str, Routine] = {}
    runs: dict[tuple[str, int], RoutineRun] = {}
    events: list[Event] = []
    for update in updates:
        before = current.get(update.routine_id)
        if before is None:
            results.append(NotFoundError("routine", update.routine_id))
            continue
        try:
            after = update.change(before)
        except ConduitError as exc:
            results.append(exc)
            continue
        if after is not before:
            after = msgspec.structs.replace(after, id=before.id)
            current[before.id] = changed[before.id] = after
        if update.run is not None:
            runs[(update.run.routine_id, update.run.scheduled_for_ms)] = update.run
        events.extend(update.events)
        results.append(after)
    if changed:
        write_rows(cx, _SAVE_ROUTINE, [_params(r) for r in changed.values()])
    if runs:
        write_rows(cx, _PUT_RUN, [_run_row(r) for r in runs.values()])
    if events:
        accept_events(cx, events)
    return results


_SAVE_ROUTINE_DATA = SetWrite(
    "UPDATE conduit_routine SET data = ? WHERE id = ?",
    "UPDATE conduit_routine SET data = v.data FROM unnest(%b::text[], %b::text[]) AS v(data, id) "
    "WHERE conduit_routine.id = v.id",
)


def due_pass(cx: Cx, now_ms: int) -> int:
    """idle -> queued for every armed row with ``next_run_at <= now``, decided in SQL."""
    rows = cx.rows(
        "UPDATE conduit_routine SET status = 'queued' WHERE status = 'idle' "
        "AND next_run_at_ms IS NOT NULL AND next_run_at_ms <= ? RETURNING id, data",
        (now_ms,),
    )
    if rows:
        write_rows(
            cx,
            _SAVE_ROUTINE_DATA,
            [
                (
                    dump(
                        msgspec.structs.replace(
                            Codec.routine.decode(data), status=S.QUEUED, updated_at_ms=now_ms
                        )
                    ),
                    routine_id,
                )
                for routine_id, data in rows
            ],
        )
    return len(rows)


_CANDIDATES_QUEUED = (
    "SELECT id, status, next_run_at_ms, data FROM conduit_routine WHERE status = 'queued'"
)
_CANDIDATES_DUE = (
    "SELECT id, status, next_run_at_ms, data FROM conduit_routine WHERE status = 'idle' "
    "AND next_run_at_ms IS NOT NULL AND next_run_at_ms <= ?"
)
#: Rows per set-based claim statement (5 parameters each; well under both backends' limits).
_CLAIM_CHUNK = 1_000


#: ``_claim_sql`` with one array per column (``Cx.has_arrays``): one text for any count, so it
#: stays prepared; 5 x 1,000 parameters in a ``VALUES`` list were parsed afresh each time.
_CLAIM_ARRAYS_SQL = (
    "UPDATE conduit_routine SET status = v.status, next_run_at_ms = v.next_run_at_ms, "
    "data = v.data FROM unnest(%b::text[], %b::text[], %b::text[], %b::bigint[], %b::text[]) "
    "AS v(id, was, status, next_run_at_ms, data) "
    "WHERE conduit_routine.id = v.id AND conduit_routine.status = v.was "
    "RETURNING conduit_routine.id"
)


def _claim_sql(count: int) -> str:
    # VALUES columns are named column1.. on both backends. A row is written only while its
    # status is still the one it was read with: the rows not returned were lost.
    values = ", ".join("(?, ?, ?, ?, ?)" for _ in range(count))
    return (
        "UPDATE conduit_routine SET status = v.column3, "
        "next_run_at_ms = CAST(v.column4 AS BIGINT), data = v.column5 "
        f"FROM (VALUES {values}) AS v "
        "WHERE conduit_routine.id = v.column1 AND conduit_routine.status = v.column2 "
        "RETURNING conduit_routine.id"
    )


def claim_queued(cx: Cx, change: RoutineChange, limit: int, due_at_ms: int | None) -> list[Routine]:
    """Claim up to ``limit`` queued rows, oldest due first, each only while it is still queued
    (a lost row is dropped, never retried). With ``due_at_ms`` the due-pass runs in the same
    transaction: an idle row due by then is queued and claimed in one write, and the due rows
    beyond ``limit`` are left queued for a later pass.

    Set-based: one read picks the rows, ``change`` (the pure ledger transition) is applied to
    each record in Python, and one ``UPDATE … FROM (VALUES …) … RETURNING`` per chunk
    (``unnest`` of arrays on PostgreSQL) writes status column and JSON together, guarded by the
    status each row was read with."""
    sql = _CANDIDATES_QUEUED
    params: tuple[int, ...] = ()
    if due_at_ms is not None:
        sql = f"{sql} UNION ALL {_CANDIDATES_DUE}"
        params = (due_at_ms,)
    rows = cx.rows(
        f"SELECT id, status, data FROM ({sql}) AS c ORDER BY next_run_at_ms, id LIMIT ?",
        (*params, limit + 1),  # one more: are there due rows beyond this batch?
    )
    more = len(rows) > limit
    rows = rows[:limit]
    claimed: dict[str, Routine] = {}
    writes: list[tuple[str, str, str, int | None, str]] = []
    for routine_id, status, data in rows:
        routine = Codec.routine.decode(data)
        if status == "idle":  # due now: the due-pass transition, then the claim
            routine = msgspec.structs.replace(routine, status=S.QUEUED, updated_at_ms=due_at_ms)
        after = msgspec.structs.replace(change(routine), id=routine_id)
        claimed[routine_id] = after
        writes.append((routine_id, status, *_params(after)[:3]))
    won: set[str] = set()
    for offset in range(0, len(writes), _CLAIM_CHUNK):
        chunk = writes[offset : offset + _CLAIM_CHUNK]
        if cx.has_arrays:
            columns = as_columns(chunk)
            got = cx.rows(_CLAIM_ARRAYS_SQL, columns)
        else:
            got = cx.rows(_claim_sql(len(chunk)), tuple(v for w in chunk for v in w))
        won.update(r[0] for r in got)
    if due_at_ms is not None and more:
        due_pass(cx, due_at_ms)  # due rows beyond this batch: queued now, claimed later
    return [routine for routine_id, routine in claimed.items() if routine_id in won]


def heal_routines(cx: Cx, heal: Callable[[Routine], Routine | None]) -> list[Routine]:
    """Apply ``heal`` to every claimed or running row; write back what it changes."""
    healed: list[Routine] = []
    for routine in routines_in(cx, (S.CLAIMED, S.RUNNING)):
        after = heal(routine)
        if after is not None:
            _save(cx, after)
            healed.append(after)
    return healed


def routines_in(cx: Cx, statuses: Sequence[RoutineStatus]) -> list[Routine]:
    marks = ", ".join("?" for _ in statuses)
    rows = cx.rows(
        f"SELECT data FROM conduit_routine WHERE status IN ({marks}) ORDER BY id",
        tuple(str(s) for s in statuses),
    )
    return [Codec.routine.decode(r[0]) for r in rows]


def running_fires(
    cx: Cx, input_id: Callable[[Routine], str | None], ids: Sequence[str] | None
) -> list[tuple[Routine, Work | None, bool]]:
    """Every claimed or running Routine (of ``ids`` if given) with the Work its fire fed
    (``None``: none yet, or gone) and whether its fire's input (the event
    ``input_id(routine)``) is still pending; one snapshot, three queries whatever the count."""
    busy = (S.CLAIMED, S.RUNNING)
    if ids is None:
        routines = routines_in(cx, busy)
    else:
        found = _routines_by_id(cx, ids, lock=False)
        routines = [found[i] for i in sorted(found) if found[i].status in busy]
    work_ids = sorted({r.fired_work_id for r in routines if r.fired_work_id is not None})
    inputs = {r.id: input_id(r) for r in routines}
    works: dict[str, Work] = {}
    for chunk in chunks(work_ids, _CHUNK):
        marks = ", ".join("?" for _ in chunk)
        for (data,) in cx.rows(f"SELECT data FROM conduit_work WHERE id IN ({marks})", chunk):
            work = Codec.work.decode(data)
            works[work.id] = work
    pending: set[str] = set()
    for chunk in chunks(sorted({i for i in inputs.values() if i is not None}), _CHUNK):
        marks = ", ".join("?" for _ in chunk)
        sql = f"SELECT e.id FROM conduit_event e WHERE {STILL_PENDING} AND e.id IN ({marks})"
        pending.update(str(r[0]) for r in cx.rows(sql, chunk))
    return [
        (
            r,
            works.get(r.fired_work_id) if r.fired_work_id is not None else None,
            inputs[r.id] in pending,
        )
        for r in routines
    ]


def next_due_at(cx: Cx) -> int | None:
    """The earliest ``next_run_at`` over idle and queued rows (``None``: nothing armed)."""
    found = [
        first(
            cx,
            "SELECT MIN(next_run_at_ms) FROM conduit_routine WHERE status = ? "
            "AND next_run_at_ms IS NOT NULL",
            (status,),
        )
        for status in ("idle", "queued")
    ]
    values = [int(row[0]) for row in found if row is not None and row[0] is not None]
    return min(values) if values else None


def routine_history(cx: Cx, routine_id: str, limit: int) -> list[RoutineRun]:
    rows = cx.rows(
        "SELECT data FROM conduit_routine_run WHERE routine_id = ? "
        "ORDER BY scheduled_for_ms DESC LIMIT ?",
        (routine_id, limit),
    )
    return [_run_decoder.decode(r[0]) for r in rows]
