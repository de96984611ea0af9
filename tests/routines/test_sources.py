"""The unified schedule surface: multiplexer routing and the host crontab source."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from conduit_core.errors import ConduitError
from conduit_core.http.routes_schedules import _status
from conduit_core.model import Routine, RoutineStatus, Work, WorkTemplate
from conduit_core.routines import (
    ConduitRoutineSource,
    CrontabLocation,
    CrontabSource,
    ScheduleChange,
    ScheduleCreate,
    ScheduleMultiplexer,
    ScheduleRecord,
    SourceRead,
    routine_record,
)
from conduit_core.routines.errors import (
    ScheduleNotFoundError,
)
from conduit_core.routines.sources import Domain, Manageability
from conduit_core.storage import Store
from tests.routines.conftest import ms, wall

NOW = ms("2026-06-01T12:00:00+00:00")


class FakeManaged:
    """Another system's managed source over an in-memory dict; ``down`` makes it fail like a
    lost backend. (conduit's own source is the real one over a store.)"""

    def __init__(self, name: str = "conduit", domain: Domain = "conduit") -> None:
        self.name = name
        self.domain: Domain = domain
        self.manageability: Manageability = "managed"
        self.rows: dict[str, Routine] = {}
        self.down = False

    async def read(self) -> SourceRead:
        if self.down:
            return SourceRead(status="degraded", detail="backend unreachable")
        return SourceRead(records=[routine_record(r, source=self.name) for r in self.rows.values()])

    async def create(self, request: ScheduleCreate) -> ScheduleRecord:
        if self.down:
            raise ConnectionRefusedError("backend unreachable")
        row = Routine(
            id=request.id or "r1",
            scope="default",
            target=request.target or WorkTemplate(binding="echo"),
            cron_spec=request.spec,
            created_at_ms=NOW,
            updated_at_ms=NOW,
        )
        self.rows[row.id] = row
        return routine_record(row, source=self.name)

    async def change(self, local_id: str, change: ScheduleChange) -> ScheduleRecord:
        if self.down:
            raise ConnectionRefusedError("backend unreachable")
        row = self.rows.get(local_id)
        if row is None:
            raise ScheduleNotFoundError(f"{self.name}:{local_id}")
        return routine_record(row, source=self.name)

    async def delete(self, local_id: str) -> None:
        del self.rows[local_id]


class FakeObserved:
    name = "gateway"
    domain: Domain = "external"
    manageability: Manageability = "observe-only"

    async def read(self) -> SourceRead:
        raise RuntimeError("contract broken: read raised")


async def code_of_call(call: object) -> tuple[str, int]:
    assert callable(call)
    with pytest.raises(ConduitError) as caught:
        await call()
    # The status the schedule routes answer with (an error's own, else the API's mapping).
    return caught.value.code, _status(caught.value)


def write_crontab(path: Path) -> Path:
    path.write_text(
        "# /etc/crontab: system-wide crontab\n"
        "SHELL=/bin/sh\n"
        "MAILTO = root\n"
        "\n"
        "17 *\t* * *\troot    cd / && run-parts --report /etc/cron.hourly\n"
        "25 6 * * 7 backup /usr/local/bin/weekly --full\n"
        "@daily root /usr/bin/logrotate /etc/logrotate.conf\n"
        "@reboot root /usr/bin/warmup\n"
        "CRON_TZ=Europe/Berlin\n"
        "30 2 * * * root /usr/bin/berlin-job\n"
        "61 * * * * root /bin/false\n"
        "5 4 * * *\n",
        encoding="utf-8",
    )
    return path


# --- Multiplexer ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_merged_read_reports_each_source_and_never_raises(tmp_path: Path) -> None:
    conduit = FakeManaged()
    await conduit.create(ScheduleCreate(spec="0 * * * *"))
    crontab = CrontabSource.from_path(write_crontab(tmp_path / "crontab"), timezone="UTC")
    mux = ScheduleMultiplexer([conduit, FakeObserved(), crontab])
    merged = await mux.read()
    statuses = {s.source: (s.status, s.domain, s.manageability) for s in merged.sources}
    assert statuses == {
        "conduit": ("ok", "conduit", "managed"),
        "gateway": ("degraded", "external", "observe-only"),
        "crontab": ("ok", "external", "observe-only"),
    }
    assert "contract broken" in (merged.sources[1].detail or "")
    assert {r.source for r in merged.records} == {"conduit", "crontab"}
    conduit.down = True
    again = await mux.read()
    assert again.sources[0].status == "degraded"
    assert again.sources[0].detail == "backend unreachable"


@pytest.mark.anyio
async def test_writes_route_by_owner_with_their_error_codes(
    tmp_path: Path, source: ConduitRoutineSource, store: Store
) -> None:
    # The conduit source is the real one over a real store: the refusals below come from the
    # ledger and the store (unknown id, one firing owner, a running Routine), not from a fake.
    external = FakeManaged(name="gateway-cron", domain="external")
    crontab = CrontabSource.from_path(write_crontab(tmp_path / "crontab"), timezone="UTC")
    mux = ScheduleMultiplexer([source, external, crontab])
    created = await mux.create(
        ScheduleCreate(spec="0 * * * *", id="nightly", target=WorkTemplate(binding="echo"))
    )
    assert created.id == "conduit:nightly"
    # Unprefixed ids name conduit Routines; prefixed ids go to their source.
    assert (await mux.pause("nightly")).id == "conduit:nightly"
    assert (await mux.resume("conduit:nightly")).id == "conduit:nightly"
    await store.create_work(
        Work(id="owned-elsewhere", scope="root", binding="echo",
             scheduled_by="routine:other", created_at_ms=NOW, updated_at_ms=NOW)
    )  # fmt: skip

    cron_id = (await crontab.read()).records[0].id
    cases = {
        "observe-only": lambda: mux.pause(cron_id),
        "observe-only delete": lambda: mux.delete(cron_id),
        "domain": lambda: mux.create(ScheduleCreate(spec="0 * * * *", source="gateway-cron")),
        "domain to observe-only": lambda: mux.create(
            ScheduleCreate(spec="0 * * * *", source="crontab")
        ),
        "unknown id": lambda: mux.pause("conduit:nope-missing"),
        "unknown source": lambda: mux.pause("nowhere:x"),
        "owner conflict": lambda: mux.create(
            ScheduleCreate(
                spec="once@2027-01-01T00:00:00Z", target=WorkTemplate(work_id="owned-elsewhere")
            )
        ),
    }
    results = {name: await code_of_call(call) for name, call in cases.items()}
    assert results == {
        "observe-only": ("read_only_source", 403),
        "observe-only delete": ("read_only_source", 403),
        "domain": ("domain_violation", 422),
        "domain to observe-only": ("domain_violation", 422),
        "unknown id": ("not_found", 404),
        "unknown source": ("not_found", 404),
        "owner conflict": ("duplicate_firing_owner", 409),
    }
    assert [r.id for r in await store.list_routines()] == ["nightly"]  # nothing else stored
    await store.apply_routine(
        "nightly", lambda r: msgspec.structs.replace(r, status=RoutineStatus.RUNNING)
    )
    # docs/routines.md: pause is refused with routine_busy while a fire is in flight.
    assert await code_of_call(lambda: mux.pause("nightly")) == ("routine_busy", 409)
    assert (await store.get_routine("nightly")).status is RoutineStatus.RUNNING

    # A source whose backend is gone: the OSError it raises is mapped to source_unavailable.
    external.down = True
    assert await code_of_call(
        lambda: mux.create(ScheduleCreate(spec="0 * * * *", source="gateway-cron"))
    ) == ("domain_violation", 422)  # the domain check comes first, backend or not
    assert await code_of_call(lambda: mux.resume("gateway-cron:x")) == ("source_unavailable", 503)


def test_duplicate_source_names_are_refused() -> None:
    with pytest.raises(ConduitError) as caught:
        ScheduleMultiplexer([FakeManaged(), FakeManaged()])
    assert caught.value.code == "duplicate_registration"


# --- Crontab source ---------------------------------------------------------------------------


@pytest.mark.anyio
async def test_crontab_source_parses_a_real_system_crontab(tmp_path: Path) -> None:
    path = write_crontab(tmp_path / "crontab")
    source = CrontabSource.from_path(path, timezone="UTC", clock=lambda: NOW)
    result = await source.read()
    assert result.status == "ok"
    by_line = {r.id.rsplit(":", 1)[1]: r for r in result.records}
    assert sorted(by_line, key=int) == ["5", "6", "7", "8", "10", "11", "12"]
    hourly = by_line["5"]
    assert (hourly.spec, hourly.status, hourly.domain, hourly.manageability) == (
        "17 * * * *",
        "scheduled",
        "external",
        "observe-only",
    )
    assert hourly.target == "root: cd / && run-parts --report /etc/cron.hourly"
    assert hourly.next_run_at_ms == ms("2026-06-01T12:17:00+00:00")
    assert by_line["6"].target == "backup: /usr/local/bin/weekly --full"
    assert by_line["6"].next_run_at_ms == ms("2026-06-07T06:25:00+00:00")  # 7 = Sunday
    assert (by_line["7"].spec, by_line["7"].next_run_at_ms) == (
        "@daily",
        ms("2026-06-02T00:00:00+00:00"),
    )
    assert (by_line["8"].status, by_line["8"].next_run_at_ms) == ("on_boot", None)
    berlin = by_line["10"]
    assert berlin.timezone == "Europe/Berlin"
    assert berlin.next_run_at_ms is not None
    assert wall(berlin.next_run_at_ms, "Europe/Berlin") == "2026-06-02T02:30:00+02:00"
    assert by_line["11"].status == "invalid"
    assert "minute value 61 is out of range" in (by_line["11"].last_error or "")
    assert by_line["12"].status == "invalid"
    assert "expected a schedule followed by a user and a command" in (
        by_line["12"].last_error or ""
    )


@pytest.mark.anyio
async def test_crontab_source_user_crontab_directory(tmp_path: Path) -> None:
    spool = tmp_path / "crontabs"
    spool.mkdir()
    (spool / "alice").write_text("# m h dom mon dow command\n*/5 * * * * /home/alice/poll\n")
    (spool / ".hidden").write_text("* * * * * nope\n")
    source = CrontabSource(
        locations=(CrontabLocation(spool, directory=True, system=False),),
        timezone="UTC",
        clock=lambda: NOW,
    )
    result = await source.read()
    assert result.status == "ok"
    assert [(r.target, r.next_run_at_ms) for r in result.records] == [
        ("alice: /home/alice/poll", NOW + 5 * 60_000)
    ]


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["absent", "directory"])
async def test_crontab_source_degraded_when_unreadable(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "crontab"
    if kind == "directory":
        path.mkdir()
    source = CrontabSource.from_path(path, timezone="UTC", clock=lambda: NOW)
    result = await source.read()  # never raises
    assert result.status == "degraded"
    assert result.records == []
    assert str(path) in (result.detail or "")


@pytest.mark.anyio
async def test_crontab_source_keeps_last_good_records_when_the_file_goes_away(
    tmp_path: Path,
) -> None:
    path = write_crontab(tmp_path / "crontab")
    source = CrontabSource.from_path(path, timezone="UTC", clock=lambda: NOW)
    good = await source.read()
    path.unlink()
    stale = await source.read()
    assert stale.status == "degraded"
    assert stale.records == good.records


@pytest.mark.anyio
async def test_default_locations_skip_what_is_absent(tmp_path: Path) -> None:
    optional = CrontabLocation(tmp_path / "missing", required=False)
    optional_dir = CrontabLocation(tmp_path / "nodir", directory=True, required=False)
    result = await CrontabSource(locations=(optional, optional_dir), timezone="UTC").read()
    assert (result.status, result.records) == ("ok", [])
