"""The naive wall-time walk of a cron spec: the next or previous matching second.

:mod:`conduit_core.routines.cronfields` reads a spec into explicit value sets; this module walks
them over naive local wall times (no timezone: :mod:`occurrence` turns wall times into instants
under its DST rules). It replaces croniter, which re-parsed its expression for every walker and
cost milliseconds a step: a fire of 1,000 due Routines spent seconds of one event loop in it.

The walk is field by field, largest first: a month that does not match jumps to the next (or
previous) matching month, a day to the next day, and so on, so each step is a few datetime
operations. A spec that never matches (``0 0 31 2 *``) is given up after 400 years — the
Gregorian calendar repeats with that period, so no later match exists.
"""

from __future__ import annotations

import bisect
import calendar
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

from conduit_core.routines.cronfields import CronFields

__all__ = ["WallCron"]

_SECOND = timedelta(seconds=1)
_CYCLE_YEARS = 400


@dataclass(frozen=True, slots=True)
class WallCron:
    """Explicit value sets of a spec (day of week 0-6, Sunday 0) and classic cron's day rule."""

    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: frozenset[int]
    months: tuple[int, ...]
    weekdays: frozenset[int]
    #: Both day fields must match (one starts with ``*``); otherwise either one.
    day_and: bool
    #: The days of month in order when they alone decide (every weekday matches and both must
    #: match): the walk then jumps to the next matching day instead of stepping day by day.
    only_days: tuple[int, ...] | None = None

    @classmethod
    def of(cls, fields: CronFields) -> WallCron:
        values = fields.values
        weekdays = frozenset(values["day-of-week"])
        only_days = None
        if fields.day_and and weekdays >= frozenset(range(7)):
            only_days = tuple(sorted(values["day-of-month"]))
        return cls(
            seconds=values.get("second", (0,)),
            minutes=values["minute"],
            hours=values["hour"],
            days=frozenset(values["day-of-month"]),
            months=values["month"],
            weekdays=weekdays,
            day_and=fields.day_and,
            only_days=only_days,
        )

    def day_matches(self, moment: datetime) -> bool:
        in_month = moment.day in self.days
        in_week = (moment.weekday() + 1) % 7 in self.weekdays
        return (in_month and in_week) if self.day_and else (in_month or in_week)

    def after(self, start: datetime) -> Iterator[datetime]:
        """Matching wall times strictly after ``start``, increasing."""
        moment: datetime | None = start.replace(microsecond=0)
        while moment is not None:
            moment = self._next(moment + _SECOND if moment < datetime.max - _SECOND else None)
            if moment is not None:
                yield moment

    def before(self, start: datetime) -> Iterator[datetime]:
        """Matching wall times strictly before ``start``, decreasing."""
        moment: datetime | None = start
        if start.microsecond:
            moment = start.replace(microsecond=0) + _SECOND
        while moment is not None:
            moment = self._prev(moment - _SECOND if moment > datetime.min + _SECOND else None)
            if moment is not None:
                yield moment

    def _next(self, t: datetime | None) -> datetime | None:
        """The first match at or after ``t``."""
        if t is None:
            return None
        limit = t.year + _CYCLE_YEARS
        try:
            while t.year <= limit:
                if t.month not in self.months:
                    month = _first_above(self.months, t.month)
                    year = t.year if month is not None else t.year + 1
                    t = datetime(year, month or self.months[0], 1)
                    continue
                if not self.day_matches(t):
                    day = None if self.only_days is None else _first_above(self.only_days, t.day)
                    if self.only_days is None:
                        t = datetime(t.year, t.month, t.day) + timedelta(days=1)
                    elif day is not None and day <= calendar.monthrange(t.year, t.month)[1]:
                        t = datetime(t.year, t.month, day)
                    else:  # no matching day left in this month
                        t = datetime(t.year, t.month, 1) + timedelta(
                            days=calendar.monthrange(t.year, t.month)[1]
                        )
                    continue
                if t.hour not in self.hours:
                    hour = _first_above(self.hours, t.hour)
                    if hour is None:
                        t = datetime(t.year, t.month, t.day) + timedelta(days=1)
                    else:
                        t = t.replace(hour=hour, minute=0, second=0)
                    continue
                if t.minute not in self.minutes:
                    minute = _first_above(self.minutes, t.minute)
                    if minute is None:
                        t = t.replace(minute=0, second=0) + timedelta(hours=1)
                    else:
                        t = t.replace(minute=minute, second=0)
                    continue
                if t.second not in self.seconds:
                    second = _first_above(self.seconds, t.second)
                    if second is None:
                        t = t.replace(second=0) + timedelta(minutes=1)
                    else:
                        t = t.replace(second=second)
                    continue
                return t
        except (OverflowError, ValueError):  # past year 9999
            return None
        return None

    def _prev(self, t: datetime | None) -> datetime | None:
        """The last match at or before ``t``."""
        if t is None:
            return None
        limit = t.year - _CYCLE_YEARS
        try:
            while t.year >= limit:
                if t.month not in self.months:
                    month = _last_below(self.months, t.month)
                    year = t.year if month is not None else t.year - 1
                    month = month or self.months[-1]
                    last_day = calendar.monthrange(year, month)[1]
                    t = datetime(year, month, last_day, 23, 59, 59)
                    continue
                if not self.day_matches(t):
                    day = None if self.only_days is None else _last_below(self.only_days, t.day)
                    if self.only_days is None:
                        t = datetime(t.year, t.month, t.day) - _SECOND
                    elif day is not None:
                        t = datetime(t.year, t.month, day, 23, 59, 59)
                    else:  # no matching day earlier in this month
                        t = datetime(t.year, t.month, 1) - _SECOND
                    continue
                if t.hour not in self.hours:
                    hour = _last_below(self.hours, t.hour)
                    if hour is None:
                        t = datetime(t.year, t.month, t.day) - _SECOND
                    else:
                        t = t.replace(hour=hour, minute=59, second=59)
                    continue
                if t.minute not in self.minutes:
                    minute = _last_below(self.minutes, t.minute)
                    if minute is None:
                        t = t.replace(minute=0, second=0) - _SECOND
                    else:
                        t = t.replace(minute=minute, second=59)
                    continue
                if t.second not in self.seconds:
                    second = _last_below(self.seconds, t.second)
                    if second is None:
                        t = t.replace(second=0) - _SECOND
                    else:
                        t = t.replace(second=second)
                    continue
                return t
        except (OverflowError, ValueError):  # before year 1
            return None
        return None


def _first_above(values: tuple[int, ...], value: int) -> int | None:
    i = bisect.bisect_right(values, value)
    return values[i] if i < len(values) else None


def _last_below(values: tuple[int, ...], value: int) -> int | None:
    i = bisect.bisect_left(values, value)
    return values[i - 1] if i else None
