"""Cron field grammar: each field is read here into the explicit set of values it stands for.

:mod:`conduit_core.routines.cronwalk` walks only these explicit sets. Reading the fields
ourselves pins the semantics to classic cron (Vixie cron, cronie) — croniter 7, used before,
read a one-value range ``a-a`` as ``*`` (``0 9-9 * * *`` fired every hour) — which the suite
checks against an independent implementation (tests/routines/test_cron_differential.py).

Grammar of one field: a comma list of items; an item is ``*``, a value, a range ``a-b``
(``a <= b``), or any of these with a step ``/n`` (``n >= 1``); ``a/n`` means ``a-max/n``.
Values are numbers, or names for month (``jan``…``dec``) and day-of-week (``sun``…``sat``).
Day-of-week 7 is Sunday, as 0. Anything else (``L``, ``W``, ``#``, ``?``, ``H``) is refused.

Day-of-month and day-of-week (classic cron): a field that STARTS WITH ``*`` (``*``, ``*/3``)
counts as unrestricted. When either field is unrestricted, a day must match both; when both
are restricted, a day matching either fires.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from conduit_core.routines.errors import InvalidCronSpecError

__all__ = ["FIELDS_5", "FIELDS_6", "CronFields", "read_fields"]

FIELDS_5 = ("minute", "hour", "day-of-month", "month", "day-of-week")
FIELDS_6 = ("second", *FIELDS_5)
_RANGES = {
    "second": (0, 59),
    "minute": (0, 59),
    "hour": (0, 23),
    "day-of-month": (1, 31),
    "month": (1, 12),
    "day-of-week": (0, 7),
}
_NAMES = {
    "month": {
        name: number
        for number, name in enumerate(
            ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"),
            start=1,
        )
    },
    "day-of-week": {
        name: number
        for number, name in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))
    },
}
_NUMBER = re.compile(r"\d{1,4}")
#: Longest field text read; a real field is a few dozen characters.
MAX_FIELD_CHARS = 256


@dataclass(frozen=True, slots=True)
class CronFields:
    """A 5- or 6-field spec read into explicit values (seconds first when present)."""

    #: name -> sorted values; day-of-week uses 0-6 (Sunday 0).
    values: dict[str, tuple[int, ...]]
    #: Classic cron's rule: a day must match BOTH day fields (one of them starts with ``*``).
    day_and: bool

    def normal_expr(self) -> str:
        """The explicit values as one normalized expression, seconds LAST: each field ``*`` when
        it holds every value, else its values with runs of three or more written ``a-b``."""
        names = list(FIELDS_5)
        if "second" in self.values:
            names.append("second")
        return " ".join(_compact(n, self.values[n]) for n in names)


def _compact(name: str, values: tuple[int, ...]) -> str:
    low, high = _RANGES[name]
    if name == "day-of-week":
        high = 6  # 7 was folded into 0
    if len(values) == high - low + 1:
        # Safe for the day fields too: a full field under the OR rule made both fields full.
        return "*"
    runs: list[str] = []
    start = previous = values[0]
    for value in (*values[1:], None):
        if value is not None and value == previous + 1:
            previous = value
            continue
        if previous - start >= 2:
            runs.append(f"{start}-{previous}")
        else:
            runs.extend(str(v) for v in range(start, previous + 1))
        if value is not None:
            start = previous = value
    return ",".join(runs)


def read_fields(text: str, fields: list[str]) -> CronFields:
    """Read the 5 or 6 split ``fields`` of ``text``, or raise ``invalid_cron_spec``."""
    names = FIELDS_5 if len(fields) == 5 else FIELDS_6
    values = {name: _read_field(text, name, f) for name, f in zip(names, fields, strict=True)}
    dom, dow = fields[names.index("day-of-month")], fields[names.index("day-of-week")]
    day_and = dom.startswith("*") or dow.startswith("*")
    if not day_and and (len(values["day-of-month"]) == 31 or len(values["day-of-week"]) == 7):
        # Either day matches every day: so does their union. Written out explicitly, so that a
        # walker reading a full list as "unrestricted" cannot turn the OR into an AND.
        values["day-of-month"] = tuple(range(1, 32))
        values["day-of-week"] = tuple(range(7))
    return CronFields(values=values, day_and=day_and)


def _read_field(text: str, name: str, field: str) -> tuple[int, ...]:
    if len(field) > MAX_FIELD_CHARS:
        raise InvalidCronSpecError(
            f"cron spec {text[:80]!r}…: the {name} field is longer than "
            f"{MAX_FIELD_CHARS} characters"
        )
    low, high = _RANGES[name]
    found: set[int] = set()
    for item in field.split(","):
        if not item:
            raise InvalidCronSpecError(f"cron spec {text!r}: empty list item in the {name} field")
        base, slash, step_text = item.partition("/")
        step = 1
        if slash:
            if not _NUMBER.fullmatch(step_text) or int(step_text) == 0:
                raise InvalidCronSpecError(
                    f"cron spec {text!r}: step {step_text!r} in the {name} field must be a "
                    "positive number"
                )
            step = int(step_text)
        if base == "*":
            start, end = low, high
        elif "-" in base:
            first, _, last = base.partition("-")
            start, end = _value(text, name, first), _value(text, name, last)
            if start > end:
                raise InvalidCronSpecError(
                    f"cron spec {text!r}: range {base!r} in the {name} field runs backwards "
                    f"(write {last}-{high},{low}-{first} to wrap around)"
                )
        else:
            start = _value(text, name, base)
            end = high if slash else start  # ``a/n`` runs to the field's maximum
        found.update(range(start, end + 1, step))
    if name == "day-of-week" and 7 in found:
        found.discard(7)
        found.add(0)  # 7 is Sunday, as 0
    return tuple(sorted(found))


def _value(text: str, name: str, raw: str) -> int:
    low, high = _RANGES[name]
    named = _NAMES.get(name, {}).get(raw.lower())
    if named is not None:
        return named
    if not _NUMBER.fullmatch(raw):
        known = " or a name" if name in _NAMES else ""
        raise InvalidCronSpecError(
            f"cron spec {text!r}: {raw!r} in the {name} field is not a number{known} "
            "(only *, numbers, ranges a-b, steps /n and lists are read)"
        )
    value = int(raw)
    if not low <= value <= high:
        raise InvalidCronSpecError(
            f"cron spec {text!r}: {name} value {value} is out of range {low}-{high}"
        )
    return value
