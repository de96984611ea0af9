"""Start gates' ``may_hold``: a first start no gate may hold is claimed unasked, in the claim's
own transaction; the rest are asked as before. Through the production scheduler, on SQLite and
PostgreSQL, with the test plugin's two gates."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from conduit_core.extension import GateRequest
from conduit_core.runtime import ManualClock, Scheduler
from conduit_core.storage import AdmitRequest, GateVerdict, NoBudgets, NotEligibleError, Store
from conduit_test_plugin import plugin as test_plugin
from tests.runtime.conftest import gate_calls, submit

pytestmark = pytest.mark.anyio


def count_admit_attempts(monkeypatch: pytest.MonkeyPatch, store: Store) -> list[list[str]]:
    """The Work ids of each ``admit_attempts`` call (the second, post-gates transaction)."""
    calls: list[list[str]] = []
    real = store.admit_attempts

    async def admit_attempts(requests: Any, **kwargs: Any) -> Any:
        calls.append(sorted(r.work_id for r in requests))
        return await real(requests, **kwargs)

    monkeypatch.setattr(store, "admit_attempts", admit_attempts)
    return calls


@pytest.mark.parametrize("every", [False, True], ids=["gates-select-by-input", "ask-every-start"])
async def test_a_start_no_gate_may_hold_is_claimed_unasked_in_one_transaction(
    make_scheduler: Callable[..., Scheduler],
    store: Store,
    monkeypatch: pytest.MonkeyPatch,
    every: bool,
) -> None:
    monkeypatch.setattr(test_plugin, "ASK_EVERY_START", every)
    sched = make_scheduler()
    plain = await submit(sched)
    held = await submit(sched, payload={"hold": "look first"})
    second = count_admit_attempts(monkeypatch, store)

    claims, refusals = await sched.claim_ready(10)

    assert [c.work.id for c in claims] == [plain.id]
    assert [(r.work_id, r.code) for r in refusals] == [(held.id, "gate_held")]
    assert gate_calls(held.id) == ["test-allow"]  # asked, and held by the first gate
    if every:
        # The negative control: a gate that may hold every start is asked about each one, and
        # the plain Work waits for the second transaction too.
        assert gate_calls(plain.id) == ["test-allow", "test-probe"]
        assert second == [sorted([plain.id, held.id])]
        assert claims[0].work.gated  # let through by the gates: never asked again
    else:
        assert gate_calls(plain.id) == []
        assert second == [[held.id]]  # the plain Work was claimed in the first transaction
        assert not claims[0].work.gated
    await sched.run_attempt(claims[0])


async def test_a_named_claim_asks_no_gate_that_may_not_hold_it(
    make_scheduler: Callable[..., Scheduler], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(test_plugin, "ASK_EVERY_START", False)
    sched = make_scheduler()
    plain = await submit(sched)
    probed = await submit(sched, payload={"probe_hold": "approve me"})

    claim = await sched.claim(plain.id)
    assert claim.work.id == plain.id
    assert gate_calls(plain.id) == []
    with pytest.raises(NotEligibleError) as held:
        await sched.claim(probed.id)
    assert held.value.code == "gate_held"
    assert gate_calls(probed.id) == ["test-allow", "test-probe"]
    await sched.run_attempt(claim)


async def test_a_gate_whose_may_hold_raises_is_asked(
    make_scheduler: Callable[..., Scheduler],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(test_plugin, "ASK_EVERY_START", False)

    def broken(self: object, request: GateRequest) -> bool:
        raise RuntimeError("cannot tell")

    monkeypatch.setattr(test_plugin.ProbeGate, "may_hold", broken)
    sched = make_scheduler()
    work = await submit(sched)
    with caplog.at_level(logging.WARNING, logger="conduit.runtime"):
        (claim,), refusals = await sched.claim_ready(10)
    assert refusals == []
    assert gate_calls(work.id) == ["test-allow", "test-probe"]  # asked, since it could not say
    assert "failed to say whether it may hold" in caplog.text
    await sched.run_attempt(claim)


@pytest.mark.parametrize("must_ask", [True, False])
async def test_an_unasked_start_is_refused_when_the_gates_now_must_be_asked(
    make_scheduler: Callable[..., Scheduler], store: Store, clock: ManualClock, must_ask: bool
) -> None:
    """Between the dry run and the claim transaction a reload can make a gate select the Work:
    the claim transaction asks ``gates`` again and refuses a start nobody asked the gates about.
    """
    sched = make_scheduler()
    work = await submit(sched)
    request = AdmitRequest(work_id=work.id, snapshot=sched.snapshot_for(work))
    assert request.gates is GateVerdict.SKIP
    (outcome,) = await store.admit_attempts(
        [request], owner="test-host", now_ms=clock.now_ms(), lease_ms=30_000,
        budgets=NoBudgets(), gates=lambda *_: must_ask,
    )  # fmt: skip
    if must_ask:
        assert getattr(outcome, "code", None) == "not_eligible"
        assert "changed since its start gates were considered" in getattr(outcome, "message", "")
        assert (await store.get_work(work.id)).last_attempt == 0  # nothing claimed
    else:
        assert outcome.work.id == work.id  # type: ignore[union-attr]
        assert (await store.get_work(work.id)).last_attempt == 1
