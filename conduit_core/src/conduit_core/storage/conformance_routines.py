"""Conformance cases for the set-based writes a Routine claim pass uses (``create_works``,
``apply_routines``, ``running_fires``) and for the row lock that keeps Routine writes from
losing each other's change. Import them like :mod:`conduit_core.storage.conformance`'s."""

from __future__ import annotations

import anyio
import msgspec
import pytest

from conduit_core.errors import ConduitError, NotFoundError
from conduit_core.model import Event, Routine, RoutineStatus, WorkStatus, WorkTemplate
from conduit_core.storage._contract import Store
from conduit_core.storage._ops_routines import RoutineRun, RoutineUpdate
from conduit_core.storage.conformance import T0, StoreFactory, make_input, make_work

__all__ = [
    "test_apply_routines_writes_each_update_or_returns_its_refusal",
    "test_concurrent_routine_writes_lose_no_change",
    "test_create_works_matches_create_work_one_by_one",
    "test_running_fires_reads_each_fires_work_and_input",
]

pytestmark = pytest.mark.anyio


def _routine(routine_id: str, status: RoutineStatus = RoutineStatus.IDLE, **kw: object) -> Routine:
    fields: dict[str, object] = {"next_run_at_ms": T0, **kw}
    return Routine(
        id=routine_id, scope="root", target=WorkTemplate(binding="b"), cron_spec="0 * * * *",
        status=status, created_at_ms=T0, updated_at_ms=T0, **fields,  # type: ignore[arg-type]
    )  # fmt: skip


def _note(routine_id: str, n: int) -> Event:
    ident = f"note-{routine_id}-{n}"
    return Event(id=ident, delivery_id=ident, type="t.note", unmatched=True, accepted_at_ms=T0)


async def test_create_works_matches_create_work_one_by_one(store: Store) -> None:
    await store.create_work(make_work("taken"), first_input=make_input("taken-1"))
    results = await store.create_works(
        [
            (make_work("a"), make_input("a-1")),
            (make_work("taken"), make_input("taken-2")),  # the id exists: refused, no input
            (make_work("b"), None),
            (make_work("a"), make_input("a-2")),  # a repeat within the batch: refused too
            (make_work("c"), make_input("c-1")),
        ]
    )
    kinds = [r.code if isinstance(r, ConduitError) else r.id for r in results]
    assert kinds == ["a", "work_exists", "b", "work_exists", "c"]
    for work_id, pending in (("a", 1), ("b", 0), ("c", 1), ("taken", 1)):
        stored = await store.get_work(work_id)
        assert stored.pending_inputs == pending, work_id
        assert [e.id for e in await store.pending_inputs(work_id)] == (
            [f"ev-{work_id}-1"] if pending else []
        )
    with pytest.raises(NotFoundError):
        await store.get_event("ev-taken-2")
    # Sequence numbers are taken in order, after every earlier event's.
    seqs = [(await store.get_event(f"ev-{w}-1")).seq for w in ("taken", "a", "c")]
    assert seqs == sorted(seqs)
    assert len(set(seqs)) == 3
    # Work with input is claimable, as if created one by one.
    assert {w.id for w in await store.ready_work(limit=10)} >= {"a", "c"}


async def test_apply_routines_writes_each_update_or_returns_its_refusal(store: Store) -> None:
    for rid in ("r1", "r2"):
        await store.put_routine(_routine(rid))

    def refuse(r: Routine) -> Routine:
        raise ConduitError(f"routine {r.id} refuses", code="illegal_transition")

    run = RoutineRun(routine_id="r1", scheduled_for_ms=T0, outcome="running", started_at_ms=T0)
    results = await store.apply_routines(
        [
            RoutineUpdate(
                "r1",
                lambda r: msgspec.structs.replace(r, status=RoutineStatus.QUEUED),
                run=run,
                events=[_note("r1", 1), _note("r1", 2)],
            ),
            RoutineUpdate("r2", refuse, events=[_note("r2", 1)]),
            RoutineUpdate("missing", lambda r: r),
            RoutineUpdate("r1", lambda r: msgspec.structs.replace(r, next_run_at_ms=T0 + 5)),
        ]
    )
    assert isinstance(results[0], Routine)
    assert results[0].status is RoutineStatus.QUEUED
    assert isinstance(results[1], ConduitError)
    assert results[1].code == "illegal_transition"
    assert isinstance(results[2], NotFoundError)
    assert isinstance(results[3], Routine)
    # Later updates of one row see the earlier ones.
    assert (results[3].status, results[3].next_run_at_ms) == (RoutineStatus.QUEUED, T0 + 5)
    r1, r2 = await store.get_routine("r1"), await store.get_routine("r2")
    assert (r1.status, r1.next_run_at_ms) == (RoutineStatus.QUEUED, T0 + 5)
    assert r2 == _routine("r2")  # the refused update wrote nothing
    assert await store.routine_history("r1") == [run]
    assert (await store.get_event("note-r1-2")).seq > (await store.get_event("note-r1-1")).seq
    with pytest.raises(NotFoundError):
        await store.get_event("note-r2-1")
    # The status column was written with the record: the due-pass queues only r2.
    assert await store.due_pass(now_ms=T0 + 10) == 1
    assert await store.apply_routines([]) == []


async def test_running_fires_reads_each_fires_work_and_input(store: Store) -> None:
    await store.create_work(make_work("w1"), first_input=make_input("w1"))
    await store.create_work(make_work("w2"))
    await store.put_routine(
        _routine("busy1", RoutineStatus.RUNNING, fired_work_id="w1", scheduled_for_ms=T0)
    )
    await store.put_routine(
        _routine("busy2", RoutineStatus.RUNNING, fired_work_id="w2", scheduled_for_ms=T0)
    )
    await store.put_routine(
        _routine("gone", RoutineStatus.RUNNING, fired_work_id="nowhere", scheduled_for_ms=T0)
    )
    await store.put_routine(_routine("claimed", RoutineStatus.CLAIMED))
    await store.put_routine(_routine("idle"))
    inputs = {"busy1": "ev-w1", "busy2": "ev-none"}

    def input_id(r: Routine) -> str | None:
        return inputs.get(r.id)

    fires = {r.id: (w.id if w else None, p) for r, w, p in await store.running_fires(input_id)}
    assert fires == {
        "busy1": ("w1", True),
        "busy2": ("w2", False),
        "gone": (None, False),
        "claimed": (None, False),
    }
    some = await store.running_fires(input_id, ids=["busy2", "idle", "missing"])
    assert [(r.id, w.id if w else None) for r, w, _ in some] == [("busy2", "w2")]


async def test_concurrent_routine_writes_lose_no_change(store_factory: StoreFactory) -> None:
    """Two handles (two daemons) apply read-modify-write changes to one Routine at once, one
    by one and in batches: every change lands (each write reads the row under its lock)."""
    a, b = await store_factory.open(), await store_factory.open()
    try:
        await a.put_routine(_routine("shared", next_run_at_ms=0))

        def bump(r: Routine) -> Routine:
            assert r.next_run_at_ms is not None
            return msgspec.structs.replace(r, next_run_at_ms=r.next_run_at_ms + 1)

        async def writer(handle: Store, batched: bool) -> None:
            for _ in range(10):
                if batched:
                    await handle.apply_routines([RoutineUpdate("shared", bump)] * 2)
                else:
                    await handle.apply_routine("shared", bump)
                    await handle.apply_routine("shared", bump)

        async with anyio.create_task_group() as tg:
            for handle in (a, b):
                for batched in (False, True):
                    tg.start_soon(writer, handle, batched)
        assert (await a.get_routine("shared")).next_run_at_ms == 4 * 10 * 2
        # Work is untouched by all this.
        assert await a.list_work(status=WorkStatus.READY) == []
    finally:
        await a.aclose()
        await b.aclose()
