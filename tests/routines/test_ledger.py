"""The Routine ledger state machine: every transition, with its negative controls."""

from __future__ import annotations

import msgspec
import pytest

from conduit_core.errors import ConduitError
from conduit_core.model import MisfirePolicy, Routine, RoutineStatus, WorkTemplate
from conduit_core.routines import ledger
from conduit_core.routines.occurrence import parse_spec
from tests.routines.conftest import ms

S = RoutineStatus
T0 = ms("2026-01-01T10:00:00+00:00")
HOUR = 3_600_000
LEASE = 30_000
HOURLY = parse_spec("0 * * * *")
ONCE = parse_spec("once@2026-01-01T10:00:00Z")


def routine(spec: str = "0 * * * *", **changes: object) -> Routine:
    base = Routine(
        id="r1",
        scope="default",
        target=WorkTemplate(binding="echo"),
        cron_spec=spec,
        next_run_at_ms=T0,
        created_at_ms=0,
        updated_at_ms=0,
    )
    return msgspec.structs.replace(base, **changes)


def running(spec: str = "0 * * * *", token: str = "tok-1") -> Routine:
    row = ledger.queue_due(routine(spec), T0)
    row = ledger.claim(row, owner="daemon-a", token=token, now_ms=T0, lease_ms=LEASE)
    return ledger.start_fire(
        row, token=token, scheduled_for_ms=T0, fired_work_id="w1", now_ms=T0 + 5
    )


def code_of(exc: pytest.ExceptionInfo[ConduitError]) -> str:
    return exc.value.code


def test_full_fire_cycle_re_arms_on_the_scheduled_time() -> None:
    row = running()
    assert row.status is S.RUNNING
    assert (row.scheduled_for_ms, row.fired_work_id, row.claim_owner) == (T0, "w1", "daemon-a")
    assert row.last_run_at_ms == T0 + 5
    # Completion three hours late still re-arms from the scheduled time, not completion.
    done = ledger.succeed_fire(row, token="tok-1", spec=HOURLY, now_ms=T0 + 3 * HOUR)
    assert done.status is S.IDLE
    assert done.next_run_at_ms == T0 + HOUR
    assert (done.claim_token, done.claim_owner, done.scheduled_for_ms) == (None, None, None)


def test_due_pass_only_queues_armed_due_idle_rows() -> None:
    assert ledger.is_due(routine(), T0)
    assert not ledger.is_due(routine(), T0 - 1)
    assert not ledger.is_due(routine(next_run_at_ms=None), T0)
    assert not ledger.is_due(routine(status=S.PAUSED), T0)
    for row in (routine(next_run_at_ms=None), routine(next_run_at_ms=T0 + 1)):
        with pytest.raises(ConduitError) as caught:
            ledger.queue_due(row, T0)
        assert code_of(caught) == "illegal_transition"
    with pytest.raises(ConduitError) as caught:
        ledger.queue_due(routine(status=S.PAUSED), T0)
    assert "paused -> queued" in caught.value.message


def test_claim_only_from_queued() -> None:
    row = ledger.claim(
        ledger.queue_due(routine(), T0), owner="a", token="t", now_ms=T0, lease_ms=LEASE
    )
    assert (row.status, row.claim_expires_at_ms) == (S.CLAIMED, T0 + LEASE)
    # A second ticker racing for the same row loses: the refusal is data (drop, never retry).
    with pytest.raises(ConduitError) as caught:
        ledger.claim(row, owner="b", token="u", now_ms=T0, lease_ms=LEASE)
    assert code_of(caught) == "illegal_transition"
    assert "claimed -> claimed" in caught.value.message


def test_failure_of_recurring_routine_halts_it() -> None:
    row = ledger.fail_fire(running(), token="tok-1", error="exit 3", now_ms=T0 + 10)
    assert (row.status, row.next_run_at_ms, row.last_error) == (S.ERROR, None, "exit 3")
    assert not ledger.is_due(row, T0 + 100 * HOUR)
    resumed = ledger.resume(row, HOURLY, T0 + 90 * 60_000)
    assert (resumed.status, resumed.next_run_at_ms) == (S.IDLE, T0 + 2 * HOUR)


def test_one_shot_success_goes_quiet_and_failure_errors() -> None:
    spec = "once@2026-01-01T10:00:00Z"
    done = ledger.succeed_fire(running(spec), token="tok-1", spec=ONCE, now_ms=T0 + 10)
    assert (done.status, done.next_run_at_ms) == (S.IDLE, None)
    assert not ledger.is_due(done, T0 + 100 * HOUR)
    failed = ledger.fail_fire(running(spec), token="tok-1", error="boom", now_ms=T0 + 10)
    assert failed.status is S.ERROR


def test_stale_claim_token_is_refused_for_every_outcome_write() -> None:
    row = running(token="new")
    for write in (
        lambda: ledger.succeed_fire(row, token="old", spec=HOURLY, now_ms=T0),
        lambda: ledger.fail_fire(row, token="old", error="x", now_ms=T0),
        lambda: ledger.renew_claim(row, token="old", now_ms=T0, lease_ms=LEASE),
    ):
        with pytest.raises(ConduitError) as caught:
            write()
        assert code_of(caught) == "stale_routine_claim"
    # After success the row holds no claim at all: a late duplicate outcome is refused too.
    done = ledger.succeed_fire(row, token="new", spec=HOURLY, now_ms=T0)
    with pytest.raises(ConduitError) as caught:
        ledger.fail_fire(done, token="new", error="late", now_ms=T0)
    assert code_of(caught) == "stale_routine_claim"


def test_start_fire_needs_the_claim_and_claimed_status() -> None:
    claimed = ledger.claim(
        ledger.queue_due(routine(), T0), owner="a", token="t", now_ms=T0, lease_ms=LEASE
    )
    with pytest.raises(ConduitError) as caught:
        ledger.start_fire(claimed, token="x", scheduled_for_ms=T0, fired_work_id=None, now_ms=T0)
    assert code_of(caught) == "stale_routine_claim"
    row = ledger.start_fire(claimed, token="t", scheduled_for_ms=T0, fired_work_id=None, now_ms=T0)
    with pytest.raises(ConduitError) as caught:
        ledger.start_fire(row, token="t", scheduled_for_ms=T0, fired_work_id=None, now_ms=T0)
    assert "running -> running" in caught.value.message


def test_skip_and_abandon_release_the_claim() -> None:
    claimed = ledger.claim(
        ledger.queue_due(routine(), T0), owner="a", token="t", now_ms=T0, lease_ms=LEASE
    )
    skipped = ledger.skip_fire(claimed, token="t", next_run_at_ms=T0 + HOUR, now_ms=T0)
    assert (skipped.status, skipped.next_run_at_ms, skipped.claim_token) == (
        S.IDLE,
        T0 + HOUR,
        None,
    )
    back = ledger.abandon_claim(claimed, token="t", now_ms=T0)
    assert (back.status, back.claim_token, back.next_run_at_ms) == (S.QUEUED, None, T0)


def test_plan_fire_uses_the_routine_policy() -> None:
    row = routine(misfire=MisfirePolicy.SKIP, grace_seconds=60.0)
    assert ledger.plan_fire(row, HOURLY, T0 + 30_000).fire
    assert not ledger.plan_fire(row, HOURLY, T0 + 2 * 60_000).fire
    assert ledger.plan_fire(routine(), HOURLY, T0 + 2 * 60_000).fire  # coalesce


def test_renew_never_shortens_the_claim() -> None:
    row = running()
    longer = ledger.renew_claim(row, token="tok-1", now_ms=T0 + 10_000, lease_ms=LEASE)
    assert longer.claim_expires_at_ms == T0 + 10_000 + LEASE
    stepped_back = ledger.renew_claim(longer, token="tok-1", now_ms=T0, lease_ms=LEASE)
    assert stepped_back.claim_expires_at_ms == T0 + 10_000 + LEASE


@pytest.mark.parametrize("status", [S.IDLE, S.QUEUED, S.ERROR])
def test_pause_from_idle_queued_error(status: RoutineStatus) -> None:
    row = ledger.pause(routine(status=status), T0)
    assert (row.status, row.next_run_at_ms) == (S.PAUSED, None)
    assert not ledger.is_due(row, T0 + 100 * HOUR)  # paused never fires
    assert ledger.pause(row, T0) is row  # idempotent


def test_pause_and_resume_refused_while_a_fire_is_in_flight() -> None:
    claimed = ledger.claim(
        ledger.queue_due(routine(), T0), owner="a", token="t", now_ms=T0, lease_ms=LEASE
    )
    for row in (claimed, running()):
        for write in (
            lambda r=row: ledger.pause(r, T0),
            lambda r=row: ledger.resume(r, HOURLY, T0),
            lambda r=row: ledger.run_now(r, T0),
            lambda r=row: ledger.edit_schedule(
                r, cron_spec="5 * * * *", timezone="UTC", spec=parse_spec("5 * * * *"), now_ms=T0
            ),
        ):
            with pytest.raises(ConduitError) as caught:
                write()
            assert code_of(caught) == "routine_busy"


def test_resume_from_paused_re_arms_at_next_future_occurrence() -> None:
    paused = ledger.pause(routine(), T0)
    resumed = ledger.resume(paused, HOURLY, T0 + 5 * HOUR + 1)
    assert (resumed.status, resumed.next_run_at_ms) == (S.IDLE, T0 + 6 * HOUR)
    with pytest.raises(ConduitError) as caught:
        ledger.resume(resumed, HOURLY, T0)
    assert code_of(caught) == "illegal_transition"
    assert "idle -> idle" in caught.value.message


def test_run_now_and_edit() -> None:
    row = ledger.run_now(routine(next_run_at_ms=T0 + HOUR), T0)
    assert ledger.is_due(row, T0)
    with pytest.raises(ConduitError) as caught:
        ledger.run_now(routine(status=S.PAUSED), T0)
    assert code_of(caught) == "illegal_transition"
    edited = ledger.edit_schedule(
        routine(), cron_spec="30 * * * *", timezone="UTC", spec=parse_spec("30 * * * *"), now_ms=T0
    )
    assert (edited.cron_spec, edited.next_run_at_ms) == ("30 * * * *", T0 + 30 * 60_000)
    kept = ledger.edit_schedule(
        routine(status=S.PAUSED, next_run_at_ms=None),
        cron_spec="30 * * * *",
        timezone="UTC",
        spec=parse_spec("30 * * * *"),
        now_ms=T0,
    )
    assert (kept.status, kept.next_run_at_ms) == (S.PAUSED, None)


# --- Boot-resume ------------------------------------------------------------------------------


def test_boot_resume_heals_only_expired_claims() -> None:
    claimed = ledger.claim(
        ledger.queue_due(routine(), T0), owner="a", token="t", now_ms=T0, lease_ms=LEASE
    )
    # Negative control: a live claim lease belongs to another daemon: untouched.
    assert ledger.heal_on_boot(claimed, HOURLY, T0 + LEASE - 1) is None
    assert ledger.heal_on_boot(running(), HOURLY, T0 + LEASE - 1) is None
    healed = ledger.heal_on_boot(claimed, HOURLY, T0 + LEASE)
    assert healed is not None
    assert (healed.status, healed.claim_token, healed.next_run_at_ms) == (S.QUEUED, None, T0)


def test_boot_resume_recurring_running_re_arms_at_next_occurrence() -> None:
    healed = ledger.heal_on_boot(running(), HOURLY, T0 + 2 * LEASE)
    assert healed is not None
    assert (healed.status, healed.next_run_at_ms, healed.claim_token) == (S.IDLE, T0 + HOUR, None)


def test_boot_resume_one_shot_running_goes_to_error() -> None:
    healed = ledger.heal_on_boot(running("once@2026-01-01T10:00:00Z"), ONCE, T0 + 2 * LEASE)
    assert healed is not None
    assert (healed.status, healed.next_run_at_ms) == (S.ERROR, None)
    assert healed.last_error is not None
    assert "outcome unknown" in healed.last_error


@pytest.mark.parametrize("status", [S.IDLE, S.QUEUED, S.PAUSED, S.ERROR])
def test_boot_resume_leaves_other_rows_alone(status: RoutineStatus) -> None:
    assert ledger.heal_on_boot(routine(status=status), HOURLY, T0 + 100 * HOUR) is None


def test_healed_row_refuses_the_dead_tickers_late_outcome() -> None:
    healed = ledger.heal_on_boot(running(), HOURLY, T0 + 2 * LEASE)
    assert healed is not None
    with pytest.raises(ConduitError) as caught:
        ledger.succeed_fire(healed, token="tok-1", spec=HOURLY, now_ms=T0 + 3 * LEASE)
    assert code_of(caught) == "stale_routine_claim"


def test_fire_key_is_stable_per_occurrence() -> None:
    assert ledger.fire_key("r1", T0) == ledger.fire_key("r1", T0)
    assert ledger.fire_key("r1", T0) != ledger.fire_key("r1", T0 + HOUR)
