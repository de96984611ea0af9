"""The host's cron tables as an observe-only, external-domain schedule source.

Reads ``/etc/crontab`` and ``/etc/cron.d/*`` (system format: ``m h dom mon dow user command``)
and ``/var/spool/cron/crontabs/<user>`` (user format: ``m h dom mon dow command``) when readable,
or the paths it is given. Comments and environment assignments are skipped (``CRON_TZ=`` sets the
zone of the lines below it); ``@daily``-style macros are understood and ``@reboot`` is reported
without a next run. Next runs come from :mod:`conduit_core.routines.occurrence`.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio.to_thread

from conduit_core.errors import ConduitError
from conduit_core.routines.occurrence import parse_spec
from conduit_core.routines.sources import Domain, Manageability, ScheduleRecord, SourceRead

__all__ = [
    "DEFAULT_CRONTABS",
    "CrontabLocation",
    "CrontabSource",
    "host_timezone",
    "parse_crontab",
]

_TARGET_MAX = 200


@dataclass(frozen=True)
class CrontabLocation:
    """A crontab file, or a directory of them, and its format.

    ``system`` files (``/etc/crontab``, ``/etc/cron.d/*``) carry a user column; user crontabs
    (``/var/spool/cron/crontabs/<user>``) do not, and their user is ``user`` or the file name.
    A ``required`` location that is missing or unreadable degrades the source; an optional one
    (the defaults) is skipped.
    """

    path: Path
    directory: bool = False
    system: bool = True
    user: str | None = None
    required: bool = True


DEFAULT_CRONTABS = (
    CrontabLocation(Path("/etc/crontab"), required=False),
    CrontabLocation(Path("/etc/cron.d"), directory=True, required=False),
    CrontabLocation(Path("/var/spool/cron/crontabs"), directory=True, system=False, required=False),
)

_OPTIONAL_MISSING = (FileNotFoundError, PermissionError)
_ENV_LINE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)")


def host_timezone() -> str:
    """The host's IANA zone (what cron fires in), from /etc/timezone or /etc/localtime; UTC."""
    try:
        name = Path("/etc/timezone").read_text(encoding="utf-8").strip()
        if name:
            return name
    except OSError:
        pass
    try:
        target = os.readlink("/etc/localtime")
    except OSError:
        return "UTC"
    _, sep, name = target.partition("zoneinfo/")
    return name if sep and name else "UTC"


def parse_crontab(
    text: str,
    *,
    path: str,
    source: str,
    system: bool,
    user: str | None,
    timezone: str,
    now_ms: int,
) -> list[ScheduleRecord]:
    """The schedule records of one crontab's text; a bad line becomes an ``invalid`` record."""
    records: list[ScheduleRecord] = []
    zone = timezone
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        env = _ENV_LINE.fullmatch(line)
        if env is not None:
            if env.group(1) == "CRON_TZ":
                zone = env.group(2).strip().strip("\"'")
            continue
        records.append(
            _crontab_line(line, lineno, path, source, system, user, zone or timezone, now_ms)
        )
    return records


def _crontab_line(
    line: str,
    lineno: int,
    path: str,
    source: str,
    system: bool,
    user: str | None,
    zone: str,
    now_ms: int,
) -> ScheduleRecord:
    spec_fields = 1 if line.startswith("@") else 5
    parts = line.split(None, spec_fields + (1 if system else 0))
    spec = " ".join(parts[:spec_fields])
    rest = parts[spec_fields:]

    def record(
        status: str, target: str, *, next_run: int | None = None, error: str = ""
    ) -> ScheduleRecord:
        return ScheduleRecord(
            id=f"{source}:{path}:{lineno}",
            source=source,
            domain="external",
            manageability="observe-only",
            spec=spec,
            timezone=zone,
            next_run_at_ms=next_run,
            status=status,
            last_error=f"{path}:{lineno}: {error}" if error else None,
            target=target[:_TARGET_MAX],
        )

    if len(rest) < (2 if system else 1):
        wanted = "a user and a command" if system else "a command"
        return record("invalid", line, error=f"expected a schedule followed by {wanted}")
    owner = rest[0] if system else (user or "?")
    target = f"{owner}: {rest[-1]}"
    if spec == "@reboot":
        return record("on_boot", target)
    try:
        next_run = parse_spec(spec, zone).next_after(now_ms)
    except ConduitError as exc:
        return record("invalid", target, error=exc.message)
    return record("scheduled", target, next_run=next_run)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class _Cached:
    text: str
    system: bool
    user: str | None


@dataclass
class CrontabSource:
    """The host's cron tables, observe-only. ``read()`` never raises: a table it cannot read
    degrades the source and keeps its last good records."""

    locations: Sequence[CrontabLocation] = DEFAULT_CRONTABS
    timezone: str | None = None
    name: str = "crontab"
    clock: Callable[[], int] = _now_ms
    _cache: dict[str, _Cached] = field(default_factory=dict, init=False, repr=False)

    @classmethod
    def from_path(
        cls, path: str | os.PathLike[str], *, user: str | None = None, **kwargs: Any
    ) -> CrontabSource:
        """One crontab file: system format, or user format when ``user`` is given."""
        location = CrontabLocation(Path(path), system=user is None, user=user)
        return cls(locations=(location,), **kwargs)

    @property
    def domain(self) -> Domain:
        return "external"

    @property
    def manageability(self) -> Manageability:
        return "observe-only"

    async def read(self) -> SourceRead:
        try:
            return await anyio.to_thread.run_sync(self._read_sync)
        except Exception as exc:  # never raise: report what we still have
            return SourceRead(
                status="degraded",
                records=self._records(dict(self._cache), self.clock()),
                detail=f"crontab read failed: {type(exc).__name__}: {exc}",
            )

    def _read_sync(self) -> SourceRead:
        problems: list[str] = []
        tables: dict[str, _Cached] = {}
        for location in self.locations:
            try:
                files = self._files(location)
            except OSError as exc:
                if location.required or not isinstance(exc, _OPTIONAL_MISSING):
                    problems.append(f"{location.path}: {exc.strerror or exc}")
                continue
            for path, user in files:
                key = str(path)
                try:
                    text = path.read_text(encoding="utf-8", errors="replace")
                except OSError as exc:
                    if not location.required and isinstance(exc, _OPTIONAL_MISSING):
                        continue  # an optional table that is absent or not ours to read
                    problems.append(f"{path}: {exc.strerror or exc}")
                    stale = self._cache.get(key)
                    if stale is not None:
                        tables[key] = stale
                    continue
                tables[key] = _Cached(text=text, system=location.system, user=user)
        self._cache.update(tables)
        records = self._records(tables, self.clock())
        if problems:
            return SourceRead(status="degraded", records=records, detail="; ".join(problems))
        return SourceRead(records=records)

    @staticmethod
    def _files(location: CrontabLocation) -> list[tuple[Path, str | None]]:
        if not location.directory:
            return [(location.path, location.user)]
        files: list[tuple[Path, str | None]] = []
        for entry in sorted(location.path.iterdir()):
            if entry.name.startswith(".") or not entry.is_file():
                continue
            files.append((entry, None if location.system else (location.user or entry.name)))
        return files

    def _records(self, tables: dict[str, _Cached], now_ms: int) -> list[ScheduleRecord]:
        zone = self.timezone or host_timezone()
        records: list[ScheduleRecord] = []
        for path, table in tables.items():
            records.extend(
                parse_crontab(
                    table.text,
                    path=path,
                    source=self.name,
                    system=table.system,
                    user=table.user,
                    timezone=zone,
                    now_ms=now_ms,
                )
            )
        return records
