"""Timers, holds, waits, controls, budgets, config generations and routines."""

from __future__ import annotations

import secrets
from collections.abc import Callable

import msgspec

from conduit_core.errors import NotFoundError
from conduit_core.model import (
    BudgetLedger,
    ConfigGeneration,
    ControlIntent,
    ControlStatus,
    Event,
    Hold,
    HoldKind,
    Routine,
    Timer,
    Wait,
    WorkStatus,
)
from conduit_core.storage._contract import NotEligibleError, StaleDispatchError, WorkChange
from conduit_core.storage._ops_work import accept_event
from conduit_core.storage._sql import Codec, Cx, changed_work, dump, first, load_work, save_work

_OPEN_CONTROL = (ControlStatus.PENDING, ControlStatus.DISPATCHING)

# --- Timers ---------------------------------------------------------------------------------


def arm_timer(cx: Cx, timer: Timer) -> None:
    cx.run(
        "INSERT INTO conduit_timer (id, due_at_ms, work_id, data) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (id) DO UPDATE SET due_at_ms = excluded.due_at_ms, "
        "work_id = excluded.work_id, data = excluded.data",
        (timer.id, timer.due_at_ms, timer.work_id, dump(timer)),
    )


def disarm_timer(cx: Cx, timer_id: str) -> bool:
    return cx.count("DELETE FROM conduit_timer WHERE id = ?", (timer_id,)) > 0


def due_timers(cx: Cx, now_ms: int, limit: int) -> list[Timer]:
    rows = cx.rows(
        "SELECT data FROM conduit_timer WHERE due_at_ms <= ? ORDER BY due_at_ms, id LIMIT ?",
        (now_ms, limit),
    )
    return [Codec.timer.decode(r[0]) for r in rows]


def next_timer_due(cx: Cx) -> int | None:
    row = first(cx, "SELECT MIN(due_at_ms) FROM conduit_timer")
    return None if row is None or row[0] is None else int(row[0])


def fire_timer(
    cx: Cx, timer_id: str, accept: Event | None, update_work: WorkChange | None, now_ms: int
) -> Timer | None:
    row = first(cx, "DELETE FROM conduit_timer WHERE id = ? RETURNING data", (timer_id,))
    if row is None:
        return None
    timer = Codec.timer.decode(row[0])
    if accept is not None:
        accept_event(cx, accept)
    if update_work is not None and timer.work_id is not None:
        work = load_work(cx, timer.work_id, lock=True)
        save_work(cx, changed_work(work, update_work(work), now_ms))
    return timer


# --- Holds and waits ------------------------------------------------------------------------


def put_hold(cx: Cx, hold: Hold) -> None:
    work = load_work(cx, hold.work_id)
    cx.run(
        "INSERT INTO conduit_hold (work_id, kind, holder, data) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (work_id, kind, holder) DO UPDATE SET data = excluded.data",
        (hold.work_id, str(hold.kind), hold.holder, dump(hold)),
    )
    if work.status is WorkStatus.READY:
        save_work(cx, msgspec.structs.replace(work, status=WorkStatus.HELD))


def list_holds(cx: Cx, work_id: str | None) -> list[Hold]:
    if work_id is None:
        rows = cx.rows("SELECT data FROM conduit_hold ORDER BY work_id, kind, holder")
    else:
        rows = cx.rows(
            "SELECT data FROM conduit_hold WHERE work_id = ? ORDER BY kind, holder", (work_id,)
        )
    return [Codec.hold.decode(r[0]) for r in rows]


def delete_hold(cx: Cx, work_id: str, kind: HoldKind, holder: str) -> bool:
    deleted = cx.count(
        "DELETE FROM conduit_hold WHERE work_id = ? AND kind = ? AND holder = ?",
        (work_id, str(kind), holder),
    )
    if deleted and first(cx, "SELECT 1 FROM conduit_hold WHERE work_id = ?", (work_id,)) is None:
        work = load_work(cx, work_id)
        if work.status is WorkStatus.HELD:
            save_work(cx, msgspec.structs.replace(work, status=WorkStatus.READY))
    return deleted > 0


def register_wait(cx: Cx, wait: Wait) -> None:
    cx.run(
        "INSERT INTO conduit_wait (execution_id, work_id, event_type, correlation_key, data) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT (execution_id) DO UPDATE SET "
        "work_id = excluded.work_id, event_type = excluded.event_type, "
        "correlation_key = excluded.correlation_key, data = excluded.data",
        (wait.execution_id, wait.work_id, wait.event_type, wait.correlation_key, dump(wait)),
    )


def matching_waits(cx: Cx, event_type: str | None, correlation_key: str | None) -> list[Wait]:
    rows = cx.rows(
        "SELECT data FROM conduit_wait WHERE (event_type IS NULL OR event_type = ?) "
        "AND (correlation_key IS NULL OR correlation_key = ?) ORDER BY execution_id",
        (event_type, correlation_key),
    )
    return [Codec.wait.decode(r[0]) for r in rows]


def remove_wait(cx: Cx, execution_id: str) -> bool:
    return cx.count("DELETE FROM conduit_wait WHERE execution_id = ?", (execution_id,)) > 0


# --- Control intents ------------------------------------------------------------------------


def _save_control(cx: Cx, intent: ControlIntent) -> None:
    cx.run(
        "UPDATE conduit_control SET status = ?, open = ?, data = ? WHERE id = ?",
        (str(intent.status), int(intent.status in _OPEN_CONTROL), dump(intent), intent.id),
    )


def get_control(cx: Cx, intent_id: str) -> ControlIntent:
    row = first(cx, "SELECT data FROM conduit_control WHERE id = ?", (intent_id,))
    if row is None:
        raise NotFoundError("control intent", intent_id)
    return Codec.control.decode(row[0])


def create_control(cx: Cx, intent: ControlIntent) -> ControlIntent:
    cx.run(
        "INSERT INTO conduit_control (id, status, created_at_ms, open, data) "
        "VALUES (?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
        (
            intent.id,
            str(intent.status),
            intent.created_at_ms,
            int(intent.status in _OPEN_CONTROL),
            dump(intent),
        ),
    )
    return get_control(cx, intent.id)


def open_controls(cx: Cx, limit: int) -> list[ControlIntent]:
    rows = cx.rows(
        "SELECT data FROM conduit_control WHERE open = 1 ORDER BY created_at_ms, id LIMIT ?",
        (limit,),
    )
    return [Codec.control.decode(r[0]) for r in rows]


def claim_control(cx: Cx, intent_id: str) -> ControlIntent:
    intent = get_control(cx, intent_id)
    if intent.status not in _OPEN_CONTROL:
        raise NotEligibleError(f"control intent {intent_id!r} is already {intent.status}")
    intent = msgspec.structs.replace(
        intent, status=ControlStatus.DISPATCHING, dispatch_token=secrets.token_hex(16)
    )
    _save_control(cx, intent)
    return intent


def settle_control(
    cx: Cx, intent_id: str, token: str, status: ControlStatus, now_ms: int
) -> ControlIntent:
    if status in _OPEN_CONTROL:
        raise ValueError(f"{status} does not settle a control intent")
    intent = get_control(cx, intent_id)
    if intent.status is not ControlStatus.DISPATCHING or intent.dispatch_token != token:
        raise StaleDispatchError(
            f"control intent {intent_id!r}: dispatch token is not the live one "
            f"(intent is {intent.status})"
        )
    intent = msgspec.structs.replace(intent, status=status, settled_at_ms=now_ms)
    _save_control(cx, intent)
    return intent


# --- Budgets, config generations, routines --------------------------------------------------


def get_ledger(cx: Cx, key: str) -> BudgetLedger | None:
    row = first(cx, "SELECT data FROM conduit_budget_ledger WHERE key = ?", (key,))
    return None if row is None else Codec.ledger.decode(row[0])


def update_ledger(
    cx: Cx, key: str, change: Callable[[BudgetLedger | None], BudgetLedger]
) -> BudgetLedger:
    ledger = msgspec.structs.replace(change(get_ledger(cx, key)), key=key)
    cx.run(
        "INSERT INTO conduit_budget_ledger (key, data) VALUES (?, ?) "
        "ON CONFLICT (key) DO UPDATE SET data = excluded.data",
        (key, dump(ledger)),
    )
    return ledger


def list_ledgers(cx: Cx) -> list[BudgetLedger]:
    rows = cx.rows("SELECT data FROM conduit_budget_ledger ORDER BY key")
    return [Codec.ledger.decode(r[0]) for r in rows]


def record_config_generation(cx: Cx, digest: str, now_ms: int) -> ConfigGeneration:
    row = first(cx, "SELECT data FROM conduit_config_generation WHERE digest = ?", (digest,))
    if row is not None:
        return Codec.generation.decode(row[0])
    top = first(cx, "SELECT MAX(generation) FROM conduit_config_generation")
    generation = ConfigGeneration(
        generation=int(top[0] or 0) + 1 if top else 1, digest=digest, created_at_ms=now_ms
    )
    cx.run(
        "INSERT INTO conduit_config_generation (generation, digest, data) VALUES (?, ?, ?)",
        (generation.generation, digest, dump(generation)),
    )
    return generation


def latest_config_generation(cx: Cx) -> ConfigGeneration | None:
    row = first(cx, "SELECT data FROM conduit_config_generation ORDER BY generation DESC LIMIT 1")
    return None if row is None else Codec.generation.decode(row[0])


def put_routine(cx: Cx, routine: Routine) -> None:
    cx.run(
        "INSERT INTO conduit_routine (id, status, next_run_at_ms, data) VALUES (?, ?, ?, ?) "
        "ON CONFLICT (id) DO UPDATE SET status = excluded.status, "
        "next_run_at_ms = excluded.next_run_at_ms, data = excluded.data",
        (routine.id, str(routine.status), routine.next_run_at_ms, dump(routine)),
    )


def get_routine(cx: Cx, routine_id: str) -> Routine:
    row = first(cx, "SELECT data FROM conduit_routine WHERE id = ?", (routine_id,))
    if row is None:
        raise NotFoundError("routine", routine_id)
    return Codec.routine.decode(row[0])


def list_routines(cx: Cx) -> list[Routine]:
    return [
        Codec.routine.decode(r[0]) for r in cx.rows("SELECT data FROM conduit_routine ORDER BY id")
    ]


def delete_routine(cx: Cx, routine_id: str) -> bool:
    return cx.count("DELETE FROM conduit_routine WHERE id = ?", (routine_id,)) > 0
