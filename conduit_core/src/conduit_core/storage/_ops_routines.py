"""The Routine ledger's SQL operations, each inside one write transaction.

The ``status`` and ``next_run_at_ms`` columns and the JSON ``data`` are always written together,
so both backends read the same record. Transitions are pure functions the caller passes in
(``conduit_core.routines.ledger``), applied here to the freshly read row: storage never imports
the routines layer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from conduit_core.errors import ConduitError
from conduit_core.model import Event, Routine, RoutineStatus, Work
from conduit_core.storage._ops_misc import get_routine
from conduit_core.storage._ops_work import accept_event
from conduit_core.storage._sql import Codec, Cx, dump, find_work, first, save_work

__all__ = [
    "BoundWorkCheck",
    "RoutineChange",
    "RoutineRun",
    "apply_routine",
    "claim_queued",
    "create_routine",
    "due_pass",
    "heal_routines",
    "next_due_at",
    "put_routines",
    "routine_history",
    "routines_in",
]

S = RoutineStatus

#: A pure transition of one Routine row (may raise to refuse it; nothing is written then).
RoutineChange = Callable[[Routine], Routine]
#: Checks a new Routine against the existing Work it binds (``None`` when that Work is missing);
#: returns the Work to save (stamped with its firing owner) or ``None`` to leave it; raises to
#: refuse the Routine.
BoundWorkCheck = Callable[[Routine, Work | None], Work | None]


class RoutineRun(msgspec.Struct, frozen=True, kw_only=True):
    """One fire of a Routine: its occurrence, the Work it fed, and how it ended."""

    routine_id: str
    scheduled_for_ms: int
    work_id: str | None = None
    #: ``running``, ``completed``, ``failed`` or ``error`` (the fire itself could not dispatch).
    outcome: str
    error: str | None = None
    started_at_ms: int
    ended_at_ms: int | None = None


_run_decoder = msgspec.json.Decoder(RoutineRun)


def _params(routine: Routine) -> tuple[str, int | None, str, str]:
    return (str(routine.status), routine.next_run_at_ms, dump(routine), routine.id)


def _save(cx: Cx, routine: Routine) -> None:
    cx.run(
        "UPDATE conduit_routine SET status = ?, next_run_at_ms = ?, data = ? WHERE id = ?",
        _params(routine),
    )


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
    before = get_routine(cx, routine_id)
    after = change(before)
    if after is not before:
        _save(cx, msgspec.structs.replace(after, id=before.id))
    if run is not None:
        _put_run(cx, run)
    for event in events:
        accept_event(cx, event)
    return after


def _put_run(cx: Cx, run: RoutineRun) -> None:
    cx.run(
        "INSERT INTO conduit_routine_run "
        "(routine_id, scheduled_for_ms, work_id, outcome, started_at_ms, data) "
        "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (routine_id, scheduled_for_ms) DO UPDATE SET "
        "work_id = excluded.work_id, outcome = excluded.outcome, data = excluded.data",
        (
            run.routine_id,
            run.scheduled_for_ms,
            run.work_id,
            run.outcome,
            run.started_at_ms,
            dump(run),
        ),
    )


def due_pass(cx: Cx, now_ms: int) -> int:
    """idle -> queued for every armed row with ``next_run_at <= now``, decided in SQL."""
    rows = cx.rows(
        "UPDATE conduit_routine SET status = 'queued' WHERE status = 'idle' "
        "AND next_run_at_ms IS NOT NULL AND next_run_at_ms <= ? RETURNING id, data",
        (now_ms,),
    )
    if rows:
        cx.many(
            "UPDATE conduit_routine SET data = ? WHERE id = ?",
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


def claim_queued(cx: Cx, change: RoutineChange, limit: int, due_at_ms: int | None) -> list[Routine]:
    """Claim up to ``limit`` queued rows, each only while it is still queued (a lost row is
    dropped, never retried). With ``due_at_ms`` the due-pass runs first in the same transaction,
    so a row due now is written (and committed) once, not twice."""
    fresh: dict[str, Routine] = {}
    if due_at_ms is not None:
        rows = cx.rows(
            "UPDATE conduit_routine SET status = 'queued' WHERE status = 'idle' "
            "AND next_run_at_ms IS NOT NULL AND next_run_at_ms <= ? RETURNING id, data",
            (due_at_ms,),
        )
        fresh = {
            routine_id: msgspec.structs.replace(
                Codec.routine.decode(data), status=S.QUEUED, updated_at_ms=due_at_ms
            )
            for routine_id, data in rows
        }
    rows = cx.rows(
        "SELECT id, data FROM conduit_routine WHERE status = 'queued' "
        "ORDER BY next_run_at_ms, id LIMIT ?",
        (limit,),
    )
    won: list[Routine] = []
    for routine_id, data in rows:
        queued = fresh.pop(routine_id, None) or Codec.routine.decode(data)
        claimed = change(queued)
        if cx.run(
            "UPDATE conduit_routine SET status = ?, next_run_at_ms = ?, data = ? "
            "WHERE id = ? AND status = 'queued'",
            _params(claimed),
        ):
            won.append(claimed)
    if fresh:  # queued now, claimed by a later pass: keep the record in step with its column
        cx.many(
            "UPDATE conduit_routine SET data = ? WHERE id = ?",
            [(dump(routine), routine_id) for routine_id, routine in fresh.items()],
        )
    return won


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
