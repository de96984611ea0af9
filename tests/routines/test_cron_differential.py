"""conduit's cron reading against an independent implementation (cronsim), and a parser fuzzer.

The differential test draws random 5- and 6-field specs (seeded: a failure names its seed and
spec), evaluates each from a random instant in several zones, forwards and backwards, and
compares the instants with cronsim's. It compares only instants at least a day away from a UTC
offset change: across DST, conduit applies its own documented rule (docs/routines.md), which
cronsim does not share.

Sizes: ``CONDUIT_CRON_DIFF_SPECS`` (default 250 specs, a few seconds) and
``CONDUIT_CRON_FUZZ_EXAMPLES`` (default 300) — raise them for a long manual run, e.g.
``CONDUIT_CRON_DIFF_SPECS=30000 CONDUIT_CRON_FUZZ_EXAMPLES=20000 pytest tests/routines/
test_cron_differential.py``.

Generator limits, each a known cronsim deviation from classic cron (not conduit's): a
one-value range with a step (``20-20/31``) is read by cronsim as ``20/31`` (20 and 51), where
Vixie cron and conduit read 20 only — those items are drawn without a step here and pinned by
``test_one_value_range_with_step_is_that_value``.
"""

from __future__ import annotations

import itertools
import os
import random
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim, CronSimError
from hypothesis import given, settings
from hypothesis import strategies as st

from conduit_core.errors import ConduitError
from conduit_core.routines.occurrence import parse_spec
from tests.routines.conftest import ms, wall

ZONES = ("UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata", "Australia/Sydney")
SPECS = int(os.environ.get("CONDUIT_CRON_DIFF_SPECS", "250"))
FUZZ_EXAMPLES = int(os.environ.get("CONDUIT_CRON_FUZZ_EXAMPLES", "300"))
#: Occurrences compared per spec and direction.
DEPTH = 8
_RANGES = {
    "second": (0, 59),
    "minute": (0, 59),
    "hour": (0, 23),
    "dom": (1, 31),
    "month": (1, 12),
    "dow": (0, 7),
}
_NAMES = {
    "month": ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"],
    "dow": ["sun", "mon", "tue", "wed", "thu", "fri", "sat"],
}


# --- Pinned cases (each failed before: issue 17 items 13 and 14) -----------------------------


@pytest.mark.parametrize(
    ("spec", "after", "expected"),
    [
        # croniter 7 read a one-value range ``a-a`` as ``*``: every hour, every :00.
        ("0 9-9 * * *", "2026-01-01T10:00:00+00:00",
         ["2026-01-02T09:00:00+00:00", "2026-01-03T09:00:00+00:00"]),
        ("49 21-21 * * *", "2026-01-01T00:00:00+00:00",
         ["2026-01-01T21:49:00+00:00", "2026-01-02T21:49:00+00:00"]),
        ("25-35/2,1-1 */10 * * *", "2026-01-01T00:00:00+00:00",
         ["2026-01-01T00:01:00+00:00", "2026-01-01T00:25:00+00:00", "2026-01-01T00:27:00+00:00"]),
        # Classic cron: a day field starting with ``*`` is unrestricted, so BOTH must match:
        # days 18-23 that are Sunday, Wednesday or Saturday (*/3 = 0,3,6).
        ("0 0 18-23 * */3", "2026-01-01T00:00:00+00:00",
         ["2026-01-18T00:00:00+00:00", "2026-01-21T00:00:00+00:00"]),
        # Both restricted: either matches (the 1st, or any Monday).
        ("0 0 1 * 1", "2026-01-01T00:00:00+00:00",
         ["2026-01-05T00:00:00+00:00", "2026-01-12T00:00:00+00:00"]),
        # Day-of-week 7 is Sunday; names read as numbers.
        ("0 12 * * 7", "2026-01-01T00:00:00+00:00", ["2026-01-04T12:00:00+00:00"]),
        ("0 12 * jan-feb mon-tue", "2026-01-01T00:00:00+00:00", ["2026-01-05T12:00:00+00:00"]),
    ],
)  # fmt: skip
def test_pinned_cron_readings(spec: str, after: str, expected: list[str]) -> None:
    parsed = parse_spec(spec, "UTC")
    got = [wall(t, "UTC") for t in itertools.islice(parsed.iter_after(ms(after)), len(expected))]
    assert got == expected


def test_one_value_range_with_step_is_that_value() -> None:
    # Vixie cron: ``a-b/n`` is a, a+n, … up to b; with a == b that is a alone.
    parsed = parse_spec("20-20/31 * * * *")
    got = parsed.occurrences_between(ms("2026-01-01T00:00:00+00:00"), ms("2026-01-01T02:00:00Z"))
    assert [wall(t, "UTC")[11:16] for t in got] == ["00:20", "01:20"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("0 0 L * *", "'L' in the day-of-month field is not a number"),
        ("0 0 * * 1#2", "'1#2' in the day-of-week field is not a number"),
        ("0 0 ? * *", "is not a number"),
        ("0 10-9 * * *", "range '10-9' in the hour field runs backwards"),
        ("0 0 0-0 * *", "day-of-month value 0 is out of range 1-31"),
        ("0 0 1 foo *", "'foo' in the month field is not a number or a name"),
        ("* " * 300 + "*", "at most 512"),
    ],
)
def test_shapes_outside_the_grammar_are_refused(spec: str, message: str) -> None:
    with pytest.raises(ConduitError) as raised:
        parse_spec(spec)
    assert raised.value.code == "invalid_cron_spec"
    assert message in str(raised.value)


# --- Differential --------------------------------------------------------------------------


def _value(rng: random.Random, field: str) -> tuple[int, str]:
    low, high = _RANGES[field]
    number = rng.randint(low, high)
    names = _NAMES.get(field)
    if names is not None and rng.random() < 0.2:
        index = number - low if field == "month" else number % 7
        return number, names[index]
    return number, str(number)


def _item(rng: random.Random, field: str) -> str:
    low, high = _RANGES[field]
    span = high - low + 1
    pick = rng.random()
    if pick < 0.15:
        return "*"
    if pick < 0.3:
        return f"*/{rng.randint(1, span)}"
    first, first_text = _value(rng, field)
    if pick < 0.55:
        return first_text
    if pick < 0.62:
        return f"{first_text}/{rng.randint(1, span)}"
    last = rng.randint(first, high) if rng.random() < 0.75 else first
    last_text = str(last)
    if pick < 0.85 or last == first:
        return f"{first_text}-{last_text}"
    return f"{first_text}-{last_text}/{rng.randint(1, span)}"


def _field(rng: random.Random, field: str) -> str:
    count = 1 if rng.random() < 0.7 else rng.randint(2, 3)
    return ",".join(_item(rng, field) for _ in range(count))


def random_spec(rng: random.Random) -> str:
    fields = ["minute", "hour", "dom", "month", "dow"]
    if rng.random() < 0.2:
        fields.insert(0, "second")
    return " ".join(_field(rng, f) for f in fields)


def _steady(moment_ms: int, zone: ZoneInfo) -> bool:
    """No UTC offset change within a day either side of ``moment_ms``."""
    at = datetime.fromtimestamp(moment_ms / 1000, UTC)
    offsets = {(at + timedelta(hours=h)).astimezone(zone).utcoffset() for h in range(-26, 27, 2)}
    return len(offsets) == 1


def _cronsim(spec: str, start_ms: int, zone: ZoneInfo, reverse: bool) -> list[int]:
    start = datetime.fromtimestamp(start_ms / 1000, UTC).astimezone(zone)
    # Forwards strictly after (conduit's iter_after); backwards at or before (its
    # prev_at_or_before): from 1 ms past the start, cronsim's reverse walk includes the start.
    start += timedelta(milliseconds=1)
    found: list[int] = []
    for moment in itertools.islice(CronSim(spec, start, reverse=reverse), DEPTH):
        found.append(round(moment.timestamp() * 1000))
    return found


def _ours(spec: str, zone_name: str, start_ms: int, reverse: bool) -> list[int]:
    parsed = parse_spec(spec, zone_name)
    if not reverse:
        return list(itertools.islice(parsed.iter_after(start_ms), DEPTH))
    found: list[int] = []
    at = start_ms
    while len(found) < DEPTH:
        prev = parsed.prev_at_or_before(at)
        if prev is None:
            break
        found.append(prev)
        at = prev - 1
    return found


def _comparable(times: list[int], zone: ZoneInfo, limit: int, reverse: bool) -> list[int]:
    within = [t for t in times if (t >= limit if reverse else t <= limit)]
    return [t for t in within if _steady(t, zone)]


def test_cron_reading_matches_an_independent_implementation() -> None:
    seed = int(os.environ.get("CONDUIT_CRON_DIFF_SEED", "20261130"))
    rng = random.Random(seed)
    compared = 0
    mismatches: list[str] = []
    for _ in range(SPECS):
        spec = random_spec(rng)
        zone_name = rng.choice(ZONES)
        zone = ZoneInfo(zone_name)
        start_ms = ms("2026-01-01T00:00:00+00:00") + rng.randint(0, 4 * 365 * 86_400) * 1000
        try:
            CronSim(spec, datetime(2026, 1, 1, tzinfo=zone))
        except CronSimError:
            theirs_ok = False
        else:
            theirs_ok = True
        refusal: ConduitError | None = None
        try:
            parse_spec(spec, zone_name)
        except ConduitError as exc:
            refusal = exc
        if refusal is not None:
            # Refusals agree: a spec that never matches a date, or a shape cronsim refuses.
            assert refusal.code == "invalid_cron_spec", (spec, refusal)
            if theirs_ok:
                mismatches.append(f"{spec!r}: conduit refuses ({refusal}), cronsim reads it")
            continue
        if not theirs_ok:
            mismatches.append(f"{spec!r}: cronsim refuses, conduit reads it")
            continue
        for reverse in (False, True):
            ours = _ours(spec, zone_name, start_ms, reverse)
            theirs = _cronsim(spec, start_ms, zone, reverse)
            if not ours or not theirs:
                if bool(ours) != bool(theirs):
                    mismatches.append(f"{spec!r} {zone_name}: one side found nothing")
                continue
            # Compare over the span both lists cover.
            limit = max(ours[-1], theirs[-1]) if reverse else min(ours[-1], theirs[-1])
            a = _comparable(ours, zone, limit, reverse)
            b = _comparable(theirs, zone, limit, reverse)
            compared += len(a)
            if a != b:
                mismatches.append(
                    f"{spec!r} {zone_name} from {wall(start_ms, zone_name)} "
                    f"{'backwards' if reverse else 'forwards'}: conduit "
                    f"{[wall(t, zone_name) for t in a[:3]]} cronsim "
                    f"{[wall(t, zone_name) for t in b[:3]]}"
                )
    assert not mismatches, f"seed {seed}: {len(mismatches)} mismatches:\n" + "\n".join(
        mismatches[:10]
    )
    # The comparison must have compared something (a generator gone wrong would pass vacuously).
    assert compared >= SPECS * DEPTH // 2


# --- Fuzzing -------------------------------------------------------------------------------

_CRON_ALPHABET = "0123456789*/-,? LW#@ abcdefjmnorstuyZT:+."
_cron_text = st.lists(
    st.text(alphabet=_CRON_ALPHABET, min_size=1, max_size=12), min_size=0, max_size=8
).map(" ".join)
_once_text = st.one_of(
    st.datetimes(timezones=st.timezones()).map(lambda d: d.isoformat()),
    st.text(max_size=40),
).map(lambda raw: f"once@{raw}")
_macro = st.sampled_from(["@daily", "@hourly", "@weekly", "@reboot", "@", "@DAILY"])


@settings(max_examples=FUZZ_EXAMPLES, deadline=None)
@given(
    spec=st.one_of(_cron_text, _once_text, _macro, st.text(max_size=80)),
    zone=st.one_of(
        st.sampled_from((*ZONES, "America", "Europe/", "x" * 300)), st.text(max_size=20)
    ),
)
def test_parser_raises_only_coded_errors(spec: str, zone: str) -> None:
    """Any text: a parsed spec whose occurrences can be walked, or a coded refusal."""
    try:
        parsed = parse_spec(spec, zone)
    except ConduitError as exc:
        refusal: ConduitError | None = exc
    else:
        refusal = None
    if refusal is not None:
        assert refusal.code in {"invalid_cron_spec", "invalid_timezone"}, refusal
        return
    origin = ms("2026-06-01T00:00:00+00:00")
    after = parsed.next_after(origin)
    if after is not None:
        # Every occurrence can be shown as a date in the Routine's zone (listings do this).
        wall(after, parsed.timezone)
        assert after > origin
    before = parsed.prev_at_or_before(origin)
    assert before is None or before <= origin
