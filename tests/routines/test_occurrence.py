"""Cron occurrence math: grammar, bad input, DST rules, misfire policy."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest

from conduit_core.errors import ConduitError
from conduit_core.model import MisfirePolicy
from conduit_core.routines.occurrence import (
    misfire_next,
    parse_spec,
    validate_once_not_past,
)
from tests.routines.conftest import ms, wall

BERLIN = "Europe/Berlin"
NEW_YORK = "America/New_York"


def fires(spec: str, zone: str, after: str, count: int) -> list[str]:
    parsed = parse_spec(spec, zone)
    return [wall(t, zone) for t in itertools.islice(parsed.iter_after(ms(after)), count)]


# --- Grammar ---------------------------------------------------------------------------------


def test_five_field_spec_in_utc() -> None:
    assert fires("15 9 * * 1", "UTC", "2026-06-01T00:00:00+00:00", 2) == [
        "2026-06-01T09:15:00+00:00",
        "2026-06-08T09:15:00+00:00",
    ]


def test_six_field_spec_puts_seconds_first() -> None:
    # sec=30 min=0 hour=9: croniter's own reading (seconds last) would be min=30 hour=0 sec=9.
    assert fires("30 0 9 * * *", "UTC", "2026-01-01T00:00:00+00:00", 2) == [
        "2026-01-01T09:00:30+00:00",
        "2026-01-02T09:00:30+00:00",
    ]
    assert fires("*/20 * * * * *", "UTC", "2026-01-01T00:00:00+00:00", 3) == [
        "2026-01-01T00:00:20+00:00",
        "2026-01-01T00:00:40+00:00",
        "2026-01-01T00:01:00+00:00",
    ]


def test_macro_and_timezone() -> None:
    assert fires("@daily", BERLIN, "2026-06-01T12:00:00+00:00", 1) == ["2026-06-02T00:00:00+02:00"]


def test_next_after_is_strictly_after() -> None:
    spec = parse_spec("0 * * * *")
    at = ms("2026-01-01T10:00:00+00:00")
    assert spec.next_after(at) == ms("2026-01-01T11:00:00+00:00")
    assert spec.next_after(at - 1) == at
    assert spec.prev_at_or_before(at) == at
    assert spec.is_recurring


def test_once_spec() -> None:
    spec = parse_spec("once@2027-01-01T09:00:00+01:00")
    assert not spec.is_recurring
    at = ms("2027-01-01T08:00:00+00:00")
    assert spec.next_after(at - 1) == at
    assert spec.next_after(at) is None
    assert parse_spec("once@2027-01-01T08:00:00Z").next_after(0) == at


@pytest.mark.parametrize(
    ("spec", "code", "message"),
    [
        ("", "invalid_cron_spec", "cron spec is empty"),
        ("   ", "invalid_cron_spec", "cron spec is empty"),
        ("* * *", "invalid_cron_spec", "has 3 fields; expected 5"),
        ("0 0 0 * * * *", "invalid_cron_spec", "has 7 fields"),
        ("61 * * * *", "invalid_cron_spec", "minute value 61 is out of range 0-59"),
        ("0 24 * * *", "invalid_cron_spec", "hour value 24 is out of range 0-23"),
        ("0 0 32 * *", "invalid_cron_spec", "day-of-month value 32 is out of range 1-31"),
        ("0 0 1 13 *", "invalid_cron_spec", "month value 13 is out of range 1-12"),
        ("0 0 * * 8", "invalid_cron_spec", "day-of-week value 8 is out of range 0-7"),
        ("60 * * * * *", "invalid_cron_spec", "second value 60 is out of range 0-59"),
        ("*/0 * * * *", "invalid_cron_spec", "step '0' in the minute field"),
        ("0 0 30 2 *", "invalid_cron_spec", "never matches a date"),
        ("@often", "invalid_cron_spec", "unknown cron macro '@often'"),
        ("once@2027-01-01T09:00:00", "invalid_cron_spec", "has no explicit UTC offset"),
        ("once@tomorrow", "invalid_cron_spec", "is not an ISO-8601 date-time"),
    ],
)
def test_invalid_specs_are_refused_naming_the_problem(spec: str, code: str, message: str) -> None:
    with pytest.raises(ConduitError) as caught:
        parse_spec(spec)
    assert caught.value.code == code
    assert message in caught.value.message


@pytest.mark.parametrize("zone", ["Mars/Olympus_Mons", "", "../etc/passwd"])
def test_unknown_timezone_is_refused(zone: str) -> None:
    with pytest.raises(ConduitError) as caught:
        parse_spec("0 9 * * *", zone)
    assert caught.value.code == "invalid_timezone"


def test_once_in_the_past_is_refused() -> None:
    spec = parse_spec("once@2027-01-01T09:00:00+01:00")
    validate_once_not_past(spec, ms("2026-12-31T00:00:00+00:00"))  # future: fine
    validate_once_not_past(parse_spec("0 * * * *"), 10**15)  # recurring: never refused
    with pytest.raises(ConduitError) as caught:
        validate_once_not_past(spec, ms("2027-01-02T00:00:00+00:00"))
    assert caught.value.code == "invalid_cron_spec"
    assert caught.value.message == "once@2027-01-01T09:00:00+01:00 is in the past"


# --- DST: fixed hour --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("zone", "before", "expected"),
    [
        (
            BERLIN,
            "2026-03-28T12:00:00+01:00",
            ["2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00"],
        ),
        (
            BERLIN,
            "2027-03-27T12:00:00+01:00",
            ["2027-03-28T03:00:00+02:00", "2027-03-29T02:30:00+02:00"],
        ),
        (
            NEW_YORK,
            "2026-03-07T12:00:00-05:00",
            ["2026-03-08T03:00:00-04:00", "2026-03-09T02:30:00-04:00"],
        ),
        (
            NEW_YORK,
            "2027-03-13T12:00:00-05:00",
            ["2027-03-14T03:00:00-04:00", "2027-03-15T02:30:00-04:00"],
        ),
    ],
)
def test_fixed_hour_in_spring_forward_gap_fires_once_after_the_gap(
    zone: str, before: str, expected: list[str]
) -> None:
    assert fires("30 2 * * *", zone, before, 2) == expected


def test_gap_fire_is_not_repeated_by_re_arm() -> None:
    # 02:00, 02:30 and 03:00 all land on 03:00 on the spring-forward day: one fire, then 03:30.
    spec = parse_spec("0,30 2,3 * * *", BERLIN)
    first = spec.next_after(ms("2026-03-29T01:59:00+01:00"))
    assert first is not None
    assert wall(first, BERLIN) == "2026-03-29T03:00:00+02:00"
    second = spec.next_after(first)
    assert second is not None
    assert wall(second, BERLIN) == "2026-03-29T03:30:00+02:00"


@pytest.mark.parametrize(
    ("zone", "spec", "before", "expected"),
    [
        (
            BERLIN,
            "30 2 * * *",
            "2026-10-24T12:00:00+02:00",
            ["2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"],
        ),
        (
            BERLIN,
            "30 2 * * *",
            "2027-10-30T12:00:00+02:00",
            ["2027-10-31T02:30:00+02:00", "2027-11-01T02:30:00+01:00"],
        ),
        (
            NEW_YORK,
            "30 1 * * *",
            "2026-10-31T12:00:00-04:00",
            ["2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00"],
        ),
        (
            NEW_YORK,
            "30 1 * * *",
            "2027-11-06T12:00:00-04:00",
            ["2027-11-07T01:30:00-04:00", "2027-11-08T01:30:00-05:00"],
        ),
    ],
)
def test_fixed_hour_in_fall_back_overlap_fires_once_at_first_instance(
    zone: str, spec: str, before: str, expected: list[str]
) -> None:
    assert fires(spec, zone, before, 2) == expected


def test_fall_back_re_arm_from_first_instance_skips_the_repeat() -> None:
    # Re-arm anchored on the first 02:30 must not yield the second 02:30 an hour later.
    spec = parse_spec("30 2 * * *", BERLIN)
    nxt = spec.next_after(ms("2026-10-25T02:30:00+02:00"))
    assert nxt is not None
    assert wall(nxt, BERLIN) == "2026-10-26T02:30:00+01:00"


# --- DST: wildcard and step hours follow elapsed time ---------------------------------------


def test_step_hour_spec_skips_nothing_real_in_spring_forward() -> None:
    got = fires("*/15 * * * *", BERLIN, "2026-03-29T01:30:00+01:00", 4)
    assert got == [
        "2026-03-29T01:45:00+01:00",
        "2026-03-29T03:00:00+02:00",  # 15 real minutes after 01:45 CET
        "2026-03-29T03:15:00+02:00",
        "2026-03-29T03:30:00+02:00",
    ]


@pytest.mark.parametrize(
    ("zone", "before", "repeated"),
    [
        (BERLIN, "2026-10-25T01:00:00+02:00", ["02:00:00+02:00", "02:00:00+01:00"]),
        (BERLIN, "2027-10-31T01:00:00+02:00", ["02:00:00+02:00", "02:00:00+01:00"]),
        (NEW_YORK, "2026-11-01T00:00:00-04:00", ["01:00:00-04:00", "01:00:00-05:00"]),
        (NEW_YORK, "2027-11-07T00:00:00-04:00", ["01:00:00-04:00", "01:00:00-05:00"]),
    ],
)
def test_hourly_spec_fires_in_both_repeated_hours(
    zone: str, before: str, repeated: list[str]
) -> None:
    got = fires("0 * * * *", zone, before, 3)
    assert [g[11:] for g in got[:2]] == repeated
    # Every fire is exactly one real hour after the previous one.
    spec = parse_spec("0 * * * *", zone)
    instants = list(itertools.islice(spec.iter_after(ms(before)), 4))
    assert {b - a for a, b in itertools.pairwise(instants)} == {3_600_000}


def test_step_spec_from_inside_the_overlap() -> None:
    # Starting in the first 02:xx hour, the second 02:00 still comes (elapsed time).
    got = fires("*/30 * * * *", BERLIN, "2026-10-25T02:40:00+02:00", 3)
    assert got == [
        "2026-10-25T02:00:00+01:00",
        "2026-10-25T02:30:00+01:00",
        "2026-10-25T03:00:00+01:00",
    ]
    spec = parse_spec("*/30 * * * *", BERLIN)
    assert [
        wall(spec.prev_at_or_before(ms(t)) or 0, BERLIN)
        for t in ("2026-10-25T02:10:00+01:00", "2026-10-25T02:10:00+02:00")
    ] == ["2026-10-25T02:00:00+01:00", "2026-10-25T02:00:00+02:00"]


def test_occurrences_between_and_limit() -> None:
    spec = parse_spec("0 * * * *")
    start = ms("2026-01-01T00:00:00+00:00")
    assert len(spec.occurrences_between(start, start + 10 * 3_600_000)) == 10
    assert len(spec.occurrences_between(start, start + 10 * 3_600_000, limit=3)) == 3


# --- Misfires ---------------------------------------------------------------------------------

HOUR = 3_600_000


def test_misfire_coalesce_collapses_a_downtime_into_one_fire() -> None:
    spec = parse_spec("0 * * * *")
    scheduled = ms("2026-01-01T01:00:00+00:00")
    now = scheduled + 5 * HOUR + 20 * 60_000  # down from 01:00 to 06:20
    decision = misfire_next(spec, scheduled, now, MisfirePolicy.COALESCE, 60_000)
    assert decision.fire
    assert decision.scheduled_for_ms == ms("2026-01-01T06:00:00+00:00")
    assert decision.skipped == 5  # 01:00 .. 05:00 never fire on their own
    # Re-armed from the fire's occurrence: the next future one, never a past one.
    assert spec.next_after(decision.scheduled_for_ms) == ms("2026-01-01T07:00:00+00:00")


def test_misfire_skip_beyond_grace_re_arms_without_firing() -> None:
    spec = parse_spec("0 * * * *")
    scheduled = ms("2026-01-01T01:00:00+00:00")
    now = scheduled + 5 * HOUR + 20 * 60_000
    decision = misfire_next(spec, scheduled, now, MisfirePolicy.SKIP, 60_000)
    assert not decision.fire
    assert decision.scheduled_for_ms is None
    assert decision.next_run_at_ms == ms("2026-01-01T07:00:00+00:00")
    assert decision.skipped == 6


def test_misfire_skip_within_grace_fires_normally() -> None:
    spec = parse_spec("0 * * * *")
    scheduled = ms("2026-01-01T01:00:00+00:00")
    decision = misfire_next(spec, scheduled, scheduled + 30_000, MisfirePolicy.SKIP, 60_000)
    assert decision.fire
    assert decision.scheduled_for_ms == scheduled
    assert decision.skipped == 0
    # Negative control: just past the grace window it does not fire.
    late = misfire_next(spec, scheduled, scheduled + 60_001, MisfirePolicy.SKIP, 60_000)
    assert not late.fire


def test_misfire_skip_fires_latest_occurrence_when_it_is_within_grace() -> None:
    spec = parse_spec("0 * * * *")
    scheduled = ms("2026-01-01T01:00:00+00:00")
    now = ms("2026-01-01T03:00:30+00:00")
    decision = misfire_next(spec, scheduled, now, MisfirePolicy.SKIP, 60_000)
    assert decision.fire
    assert decision.scheduled_for_ms == ms("2026-01-01T03:00:00+00:00")
    assert decision.skipped == 2


def test_misfire_of_a_one_shot() -> None:
    spec = parse_spec("once@2027-01-01T09:00:00Z")
    at = ms("2027-01-01T09:00:00+00:00")
    now = at + 2 * HOUR
    assert misfire_next(spec, at, now, MisfirePolicy.COALESCE, 0).scheduled_for_ms == at
    skipped = misfire_next(spec, at, now, MisfirePolicy.SKIP, 60_000)
    assert (skipped.fire, skipped.next_run_at_ms, skipped.skipped) == (False, None, 1)


def test_not_yet_due_is_left_alone() -> None:
    spec = parse_spec("0 * * * *")
    decision = misfire_next(spec, 10 * HOUR, 9 * HOUR, MisfirePolicy.COALESCE, 0)
    assert (decision.fire, decision.next_run_at_ms) == (False, 10 * HOUR)


def test_the_wall_walk_finds_rare_days_and_gives_up_on_impossible_ones() -> None:
    leap = parse_spec("0 0 29 2 *")
    start = ms("2025-03-01T00:00:00+00:00")
    assert leap.next_after(start) == ms("2028-02-29T00:00:00+00:00")
    assert leap.prev_at_or_before(start) == ms("2024-02-29T00:00:00+00:00")
    # Friday the 13th in classic cron is "the 13th OR a Friday"; with `*` in dom, only Fridays.
    friday = parse_spec("0 12 * * 5")
    assert datetime.fromtimestamp(friday.next_after(start) / 1000, UTC).weekday() == 4  # type: ignore[operator]
    with pytest.raises(ConduitError, match="never matches"):
        parse_spec("0 0 31 2 *")
    with pytest.raises(ConduitError, match="never matches"):
        parse_spec("0 0 30 2 *")


def test_the_wall_walk_ends_at_the_calendar_edge() -> None:
    spec = parse_spec("0 0 1 1 *")
    assert spec.next_after(ms("9999-06-01T00:00:00+00:00")) is None
    assert spec.prev_at_or_before(ms("9999-06-01T00:00:00+00:00")) == ms("9999-01-01T00:00:00+00:00")


@pytest.mark.parametrize(
    "spec",
    [
        "once@9999-12-31T23:59:59-23:59",  # year 10000 in UTC: broke `routines list`
        "once@9999-06-01T00:00:00Z",
        "once@1969-12-31T23:59:59Z",
        "once@0001-01-01T00:00:00+23:59",
        "once@" + "2027-01-01T00:00:00" + "0" * 100 + "Z",
    ],
)
def test_once_instants_are_bounded(spec: str) -> None:
    with pytest.raises(ConduitError) as raised:
        parse_spec(spec)
    assert raised.value.code == "invalid_cron_spec"
    assert "once@" in str(raised.value)


def test_once_bound_edges_are_accepted() -> None:
    assert parse_spec("once@9998-12-31T23:59:59Z").once_ms == ms("9998-12-31T23:59:59+00:00")
    assert parse_spec("once@1970-01-01T00:00:00Z").once_ms == 0


@pytest.mark.parametrize("zone", ["America", "x" * 300, "UTC\x00"])
def test_timezone_that_is_no_zone_file_is_a_coded_error(zone: str) -> None:
    # 'America' is a tzdata directory: it raised IsADirectoryError (issue 17 item 4).
    with pytest.raises(ConduitError) as raised:
        parse_spec("0 * * * *", zone)
    assert raised.value.code == "invalid_timezone"
    assert "site-packages" not in str(raised.value)
