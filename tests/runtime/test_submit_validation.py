"""Scheduler.submit and accept_input are the one door every Work and input passes (HTTP, CLI
direct mode, Routines): the id grammar and the payload limits hold there, on both backends."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from conduit_core.errors import ConduitError, NotFoundError
from conduit_core.runtime import Scheduler
from conduit_core.storage import Store
from tests.runtime.conftest import input_event, submit

pytestmark = pytest.mark.anyio


def _deep(levels: int) -> object:
    value: object = 1
    for _ in range(levels):
        value = {"a": value}
    return value


@pytest.mark.parametrize("bad", ["../../etc/x", "x" * 5000, "a b", "a\n", "a/b"])
async def test_submit_refuses_a_bad_work_id_and_writes_nothing(
    make_scheduler: Callable[..., Scheduler], store: Store, bad: str
) -> None:
    sched = make_scheduler()
    with pytest.raises(ConduitError) as info:
        await submit(sched, work_id=bad)
    assert info.value.code == "invalid_id"
    with pytest.raises(NotFoundError):
        await store.get_work(bad)


@pytest.mark.parametrize(
    ("payload", "code"),
    [(_deep(65), "too_deep"), ({"blob": "x" * (1024 * 1024 + 1)}, "too_large")],
    ids=["deep", "large"],
)
async def test_submit_and_input_refuse_payloads_over_the_limits(
    make_scheduler: Callable[..., Scheduler], store: Store, payload: object, code: str
) -> None:
    sched = make_scheduler()
    with pytest.raises(ConduitError) as info:
        await submit(sched, payload=payload, work_id="big")
    assert info.value.code == code
    with pytest.raises(NotFoundError):
        await store.get_work("big")
    work = await submit(sched, payload=_deep(60), work_id="fine")  # within the limit: accepted
    with pytest.raises(ConduitError) as info:
        await sched.accept_input(input_event(work.id, 2, payload))
    assert info.value.code == code
    assert len(await store.pending_inputs(work.id)) == 1


async def test_submit_renders_the_binding_key_and_a_routine_takes_its_priority(
    make_scheduler: Callable[..., Scheduler], store: Store
) -> None:
    """The one door renders a binding's concurrency key over the first input (refusing an input
    without the field, storing nothing), and gives a Routine's Work its binding's priority; a
    submit's own priority (the API sets it) is kept."""
    import msgspec

    from conduit_core.model import Event, Work
    from tests.runtime.conftest import BINDINGS

    keyed = msgspec.structs.replace(
        BINDINGS["agent"], concurrency_key="{tenant}-{n}", key_limit=3, priority=4
    )
    sched = make_scheduler(bindings={**BINDINGS, "agent": keyed})
    work = await submit(sched, payload={"tenant": "acme", "n": 7}, work_id="k1")
    assert (work.concurrency_key, work.key_limit, work.priority) == ("acme-7", 3, 0)
    with pytest.raises(ConduitError) as info:
        await submit(sched, payload={"tenant": "acme"}, work_id="k2")
    assert info.value.code == "concurrency_key_field_missing"
    assert "$.input.n" in info.value.message
    with pytest.raises(NotFoundError):
        await store.get_work("k2")
    fired = Work(id="r1", scope="root", binding="agent", scheduled_by="routine:nightly",
                 created_at_ms=0, updated_at_ms=0)  # fmt: skip
    first = Event(id="r1/in", delivery_id="r1/in", type="input", payload={"tenant": "t", "n": 1},
                  work_id="r1", pending=True, accepted_at_ms=0)  # fmt: skip
    stored = await sched.submit(fired, first)
    assert (stored.priority, stored.concurrency_key) == (4, "t-1")
