"""Cron occurrence math: specs, occurrences in a timezone, misfire decisions.

Spec grammar
    * 5-field cron: ``min hour dom mon dow``.
    * 6-field cron with seconds FIRST: ``sec min hour dom mon dow`` (as croner, Quartz and Spring
      read it).
    * Macros ``@yearly`` ``@annually`` ``@monthly`` ``@weekly`` ``@daily`` ``@midnight``
      ``@hourly``.
    * One-shot ``once@<ISO-8601 with an explicit offset>`` (``Z`` allowed), e.g.
      ``once@2027-01-01T09:00:00+01:00``, from 1970 to 9998 in UTC.

The fields are read by :mod:`conduit_core.routines.cronfields` (classic cron semantics, the
day-of-month/day-of-week rule included); :mod:`conduit_core.routines.cronwalk` walks the explicit
values they yield over naive wall times.

Every cron spec is evaluated in its IANA timezone (default UTC): the walk yields naive local wall
times and this module turns each wall time into real instants itself, under the DST rules below
(a wall time may stand for two instants, or none).

DST rules
    * Fixed hour (the hour field is anything but ``*`` or ``*/n``): a wall time inside a
      spring-forward gap fires ONCE, at the first valid instant after the gap (a daily 02:30 in
      Europe/Berlin fires at 03:00 local on the spring-forward day); a wall time repeated by a
      fall-back fires ONCE, at its first instance.
    * Wildcard or step hour (``*/15 * * * *``, ``0 * * * *``): follows real elapsed time; wall
      times that do not exist are not real and are skipped, a repeated hour fires in both
      instances.

Occurrences are epoch milliseconds. Re-arm is anchored on the scheduled time:
``spec.next_after(scheduled_for_ms)``, never on completion time.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from functools import lru_cache
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from conduit_core.model import MisfirePolicy
from conduit_core.routines.cronfields import FIELDS_5, FIELDS_6, read_fields
from conduit_core.routines.cronwalk import WallCron
from conduit_core.routines.errors import InvalidCronSpecError, InvalidTimezoneError

__all__ = [
    "MisfireDecision",
    "Spec",
    "load_timezone",
    "misfire_next",
    "parse_spec",
    "validate_once_not_past",
]

ONCE_PREFIX = "once@"
#: Longest spec text read (a real one is a few dozen characters).
MAX_SPEC_CHARS = 512
#: How many occurrences a misfire decision counts as skipped at most.
SKIP_COUNT_LIMIT = 1_000

_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
#: The instants a once@ spec may name (epoch ms): 1970-01-01T00:00:00Z to 9998-12-31T23:59:59Z,
#: a year inside the range of Python's datetime in every zone.
ONCE_MIN_MS = 0
ONCE_MAX_MS = 253_370_764_799_000
_ELAPSED_HOUR = re.compile(r"\*(/\d+)?")
_DAY = timedelta(days=1)
_SECOND = timedelta(seconds=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def load_timezone(name: str) -> ZoneInfo:
    """The IANA zone ``name``; ``invalid_timezone`` when it is unknown."""
    if not name or not name.strip():
        raise InvalidTimezoneError("timezone is empty; give an IANA zone name such as 'UTC'")
    if len(name) > 64 or "\x00" in name:
        raise InvalidTimezoneError(
            f"unknown timezone {name[:64]!r}; give an IANA zone name such as 'Europe/Berlin'"
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError) as exc:
        # OSError: a tzdata directory ('America') or a name the file system refuses; the
        # message never names the tzdata path.
        raise InvalidTimezoneError(
            f"unknown timezone {name!r}; give an IANA zone name such as 'Europe/Berlin'"
        ) from exc


def _to_ms(moment: datetime) -> int:
    delta = moment - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def _from_ms(ms: int) -> datetime:
    return _EPOCH + timedelta(milliseconds=ms)


@dataclass(frozen=True, slots=True)
class Spec:
    """A parsed spec. Build with :func:`parse_spec`."""

    text: str
    timezone: str
    #: The explicit-values expression (seconds last) of a cron spec; ``None`` for a one-shot.
    cron: str | None
    #: The instant of a one-shot, epoch ms; ``None`` for a cron spec.
    once_ms: int | None
    #: Whether the hour field is a wildcard or step (follows real elapsed time across DST).
    elapsed_hours: bool = False
    #: Classic cron's day rule: a day must match both day fields (one of them starts with ``*``).
    day_and: bool = True
    #: The wall-time walk of a cron spec; ``None`` for a one-shot.
    wall: WallCron | None = None

    @property
    def is_recurring(self) -> bool:
        return self.cron is not None

    @property
    def _zone(self) -> tzinfo:
        return UTC if self.timezone == "UTC" else ZoneInfo(self.timezone)

    def next_after(self, after_ms: int) -> int | None:
        """The first occurrence strictly after ``after_ms``; ``None`` when there is none."""
        if self.once_ms is not None:
            return self.once_ms if self.once_ms > after_ms else None
        return _first_walked(self, after_ms, True)

    def prev_at_or_before(self, at_ms: int) -> int | None:
        """The last occurrence at or before ``at_ms``; ``None`` when there is none."""
        if self.once_ms is not None:
            return self.once_ms if self.once_ms <= at_ms else None
        return _first_walked(self, at_ms, False)

    def iter_after(self, after_ms: int) -> Iterator[int]:
        """Occurrences strictly after ``after_ms``, in increasing order."""
        if self.once_ms is not None:
            if self.once_ms > after_ms:
                yield self.once_ms
            return
        yield from _walk(self, after_ms, forward=True)

    def occurrences_between(self, start_ms: int, end_ms: int, limit: int = 1000) -> list[int]:
        """Occurrences in ``(start_ms, end_ms]``, at most ``limit`` of them (the earliest)."""
        found: list[int] = []
        if limit <= 0:
            return found
        for when in self.iter_after(start_ms):
            if when > end_ms:
                break
            found.append(when)
            if len(found) >= limit:
                break
        return found


@lru_cache(maxsize=4096)
def _first_walked(spec: Spec, origin_ms: int, forward: bool) -> int | None:
    """The first occurrence ``_walk`` yields, remembered: the Routines one claim pass fires
    share specs and scheduled times, and each is asked for its next (or latest) occurrence."""
    return next(_walk(spec, origin_ms, forward=forward), None)


def parse_spec(spec: str, timezone: str = "UTC") -> Spec:
    """Parse and validate ``spec`` in ``timezone``.

    Raises ``invalid_cron_spec`` naming the problem, or ``invalid_timezone``. A spec read before
    is not read again (the ticker reads every claimed Routine's spec; specs repeat).
    """
    if isinstance(spec, str) and isinstance(timezone, str):
        return _parse_cached(spec, timezone)
    return _parse(spec, timezone)


@lru_cache(maxsize=4096)
def _parse_cached(spec: str, timezone: str) -> Spec:
    return _parse(spec, timezone)


def _parse(spec: str, timezone: str) -> Spec:
    load_timezone(timezone)
    text = spec.strip() if isinstance(spec, str) else ""
    if not text:
        raise InvalidCronSpecError("cron spec is empty")
    if len(text) > MAX_SPEC_CHARS:
        raise InvalidCronSpecError(
            f"cron spec {text[:40]!r}… is {len(text)} characters; at most {MAX_SPEC_CHARS}"
        )
    if text.lower().startswith(ONCE_PREFIX):
        return Spec(text=text, timezone=timezone, cron=None, once_ms=_parse_once(text))
    expr = _MACROS.get(text.lower())
    if expr is None and text.startswith("@"):
        known = ", ".join(sorted(_MACROS))
        raise InvalidCronSpecError(f"unknown cron macro {text!r} (known: {known})")
    fields = (expr or text).split()
    if len(fields) not in (5, 6):
        raise InvalidCronSpecError(
            f"cron spec {text!r} has {len(fields)} fields; expected 5 "
            "(min hour dom mon dow) or 6 (sec min hour dom mon dow, seconds first)"
        )
    names = FIELDS_5 if len(fields) == 5 else FIELDS_6
    read = read_fields(text, fields)
    wall_cron = WallCron.of(read)
    if next(wall_cron.after(datetime(2000, 1, 1)), None) is None:
        raise InvalidCronSpecError(f"cron spec {text!r} never matches a date")
    hour = fields[names.index("hour")]
    return Spec(
        text=text,
        timezone=timezone,
        cron=read.normal_expr(),
        once_ms=None,
        elapsed_hours=_ELAPSED_HOUR.fullmatch(hour) is not None,
        day_and=read.day_and,
        wall=wall_cron,
    )


def _parse_once(text: str) -> int:
    raw = text[len(ONCE_PREFIX) :].strip()
    if len(raw) > 64:  # an ISO-8601 date-time with offset is ~35 characters
        raise InvalidCronSpecError(f"once@ spec {text[:80]!r}… is too long to be a date-time")
    try:
        moment = datetime.fromisoformat(raw)
    except ValueError as exc:
        raise InvalidCronSpecError(
            f"once@ spec {text!r}: {raw!r} is not an ISO-8601 date-time"
        ) from exc
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise InvalidCronSpecError(
            f"once@ spec {text!r} has no explicit UTC offset; write e.g. "
            f"'once@{raw}+00:00' or 'once@{raw}Z'"
        )
    when = _to_ms(moment)
    # Bounded so that every instant conduit stores can be shown as a date in any zone: a
    # larger one (``once@9999-12-31T23:59:59-23:59`` is year 10000 in UTC) broke listings.
    if not ONCE_MIN_MS <= when <= ONCE_MAX_MS:
        raise InvalidCronSpecError(
            f"once@ spec {text!r} is out of range: give an instant from 1970-01-01 to "
            "9998-12-31 (UTC)"
        )
    return when


def validate_once_not_past(spec: Spec, now_ms: int) -> None:
    """Refuse a one-shot whose instant is not after ``now_ms`` (at registration)."""
    if spec.once_ms is not None and spec.once_ms <= now_ms:
        raise InvalidCronSpecError(f"{spec.text} is in the past")


# --- Wall time to instants ------------------------------------------------------------------


def _instants(wall: datetime, zone: tzinfo, elapsed: bool) -> list[datetime]:
    """The real instants (UTC) a naive local wall time stands for, under the DST rules."""
    first = wall.replace(tzinfo=zone, fold=0)
    second = wall.replace(tzinfo=zone, fold=1)
    if first.utcoffset() == second.utcoffset():
        return [first.astimezone(UTC)]
    as_fold0, as_fold1 = first.astimezone(UTC), second.astimezone(UTC)
    if as_fold0.astimezone(zone).replace(tzinfo=None) != wall:
        # A gap: fold=0 reads the wall time with the offset before the jump, so it lands after
        # the transition; fold=1 lands before it.
        return [] if elapsed else [_transition(as_fold1, as_fold0, zone)]
    # A repeated wall time: fold=0 is its first instance.
    return [as_fold0, as_fold1] if elapsed else [as_fold0]


def _transition(before: datetime, after: datetime, zone: tzinfo) -> datetime:
    """The first instant in ``(before, after]`` carrying ``after``'s offset (to the second)."""
    target = after.astimezone(zone).utcoffset()
    low, high = before, after  # offset(low) != target, offset(high) == target
    while high - low > _SECOND:
        middle = low + (high - low) / 2
        middle = middle.replace(microsecond=0)
        if middle <= low:
            middle = low + _SECOND
        if middle.astimezone(zone).utcoffset() == target:
            high = middle
        else:
            low = middle
    return high


def _offset_bound(wall: datetime, zone: tzinfo, forward: bool) -> timedelta:
    """The largest (forward) or smallest (backward) UTC offset near ``wall`` in that direction."""
    sign = 1 if forward else -1
    offsets: list[timedelta] = []
    for days in (0, 1, 2):
        for fold in (0, 1):
            offset = (wall + sign * days * _DAY).replace(tzinfo=zone, fold=fold).utcoffset()
            if offset is not None:
                offsets.append(offset)
    return max(offsets) if forward else min(offsets)


def _walk(spec: Spec, origin_ms: int, *, forward: bool) -> Iterator[int]:
    """Occurrences after ``origin_ms`` (forward) or at/before it (backward), in order."""
    assert spec.wall is not None
    zone = spec._zone
    origin = _from_ms(origin_ms)
    local = origin.astimezone(zone)
    wall = local.replace(tzinfo=None, microsecond=0)
    # Instants just past the origin may carry earlier (forward) or later (backward) wall times
    # when the origin sits in the first (second) instance of a repeated hour: start the wall
    # walk that much further back (ahead).
    fold0 = wall.replace(tzinfo=zone, fold=0).utcoffset()
    fold1 = wall.replace(tzinfo=zone, fold=1).utcoffset()
    margin = timedelta(0)
    in_origin_instance = local.fold == (0 if forward else 1)
    if fold0 is not None and fold1 is not None and fold0 > fold1 and in_origin_instance:
        margin = fold0 - fold1
    start = wall - margin - _SECOND if forward else wall + margin + _SECOND
    candidates = spec.wall.after(start) if forward else spec.wall.before(start)
    pending: list[int] = []  # a heap of keys: ms forward, -ms backward
    last: int | None = None
    for candidate in candidates:
        for instant in _instants(candidate, zone, spec.elapsed_hours):
            ms = _to_ms(instant)
            if (ms > origin_ms) if forward else (ms <= origin_ms):
                heapq.heappush(pending, ms if forward else -ms)
        # Any later wall candidate maps to an instant beyond this bound, so what is pending up
        # to it is final.
        bound = _to_ms((candidate - _offset_bound(candidate, zone, forward)).replace(tzinfo=UTC))
        while pending and (pending[0] <= bound if forward else -pending[0] >= bound):
            ms = heapq.heappop(pending)
            ms = ms if forward else -ms
            if last is not None and (ms <= last if forward else ms >= last):
                continue
            last = ms
            yield ms
    while pending:
        ms = heapq.heappop(pending)
        ms = ms if forward else -ms
        if last is None or (ms > last if forward else ms < last):
            last = ms
            yield ms


# --- Misfires -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MisfireDecision:
    """What to do with a Routine found due at ``now``.

    ``fire``: fire now for the occurrence ``scheduled_for_ms``; re-arm afterwards at
    ``spec.next_after(scheduled_for_ms)``. Otherwise re-arm at ``next_run_at_ms`` without firing
    (``None``: nothing left, a spent one-shot). ``skipped``: occurrences that will never fire
    (counted up to ``SKIP_COUNT_LIMIT``).
    """

    fire: bool
    scheduled_for_ms: int | None
    next_run_at_ms: int | None
    skipped: int


def misfire_next(
    spec: Spec, scheduled_ms: int, now_ms: int, policy: MisfirePolicy, grace_ms: int
) -> MisfireDecision:
    """Decide a due fire scheduled for ``scheduled_ms`` seen at ``now_ms``.

    ``coalesce``: every missed occurrence collapses into one fire now, standing for the latest
    occurrence at or before now. ``skip``: that latest occurrence still fires when it is late by
    at most ``grace_ms``; otherwise nothing fires and the Routine re-arms at the next future
    occurrence.
    """
    if scheduled_ms > now_ms:
        return MisfireDecision(
            fire=False, scheduled_for_ms=None, next_run_at_ms=scheduled_ms, skipped=0
        )
    latest = spec.prev_at_or_before(now_ms)
    if latest is None or latest < scheduled_ms:
        latest = scheduled_ms
    if policy is MisfirePolicy.COALESCE or now_ms - latest <= grace_ms:
        skipped = 0
        if latest != scheduled_ms:
            # The due occurrence and every one after it before ``latest`` collapse into this fire.
            between = spec.occurrences_between(scheduled_ms, latest - 1, SKIP_COUNT_LIMIT)
            skipped = min(1 + len(between), SKIP_COUNT_LIMIT)
        return MisfireDecision(
            fire=True, scheduled_for_ms=latest, next_run_at_ms=None, skipped=skipped
        )
    skipped = 1 + len(spec.occurrences_between(scheduled_ms, now_ms, SKIP_COUNT_LIMIT))
    return MisfireDecision(
        fire=False,
        scheduled_for_ms=None,
        next_run_at_ms=spec.next_after(now_ms),
        skipped=min(skipped, SKIP_COUNT_LIMIT),
    )
