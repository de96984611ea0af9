"""Host labels and drain through real daemons (docs/daemon.md, "Host labels and drain").

Each daemon's config gives binding ``gpu`` (``requires = ["gpu"]``) a command that writes the
daemon's own name: an attempt runs the command its claiming daemon pinned, so the side-effect
file says which daemon started each job, whatever the scheduler believes.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from conduit_core.model import DaemonRecord
from conduit_core.storage import open_store
from tests.daemon.conftest import Daemon, wait_for

LABELLED = """
[bindings.gpu]
executor = "shell"
requires = ["gpu"]
config = {{ command = 'echo "$CONDUIT_WORK_ID {name}" >> {side}' }}

[bindings.tpu]
executor = "shell"
requires = ["tpu"]
config = {{ command = 'echo "$CONDUIT_WORK_ID {name}" >> {side}' }}

[bindings.gpu-held]
executor = "shell"
requires = ["gpu"]
config = {{ command = 'echo "$CONDUIT_WORK_ID start" >> {side}; while test ! -e {root}/release.$CONDUIT_WORK_ID; do sleep 0.05; done; echo "$CONDUIT_WORK_ID end" >> {side}' }}
"""


def labelled(make_daemon: Callable[..., Daemon], labels: list[str], **settings: object) -> Daemon:
    daemon = make_daemon(**settings)
    extra = LABELLED.format(name=daemon.name, side=daemon.side, root=daemon.root)
    daemon.write_config(settings_extra=f"labels = {labels!r}".replace("'", '"'), extra=extra)
    return daemon


def ran_on(side: Path) -> dict[str, list[str]]:
    """Work id -> the daemons whose command ran it (one line per run)."""
    found: dict[str, list[str]] = {}
    for line in side.read_text().splitlines() if side.exists() else []:
        work_id, who = line.split()
        found.setdefault(work_id, []).append(who)
    return found


@pytest.mark.postgres
@pytest.mark.parametrize("store", [pytest.param("postgres", id="postgres")], indirect=True)
def test_a_label_pins_work_to_the_daemon_that_has_it(
    make_daemon: Callable[..., Daemon], store: str
) -> None:
    """Two daemons race for the same ready queue; only the one labelled ``gpu`` ever starts a
    ``gpu`` Work, while the other keeps claiming Work that requires nothing."""
    gpu = labelled(make_daemon, ["gpu", "eu"], job_concurrency=4).start(rescan=0.2)
    plain = labelled(make_daemon, ["eu"], job_concurrency=4).start(rescan=0.2)
    ids = [(gpu, plain)[i % 2].submit("gpu", id=f"g{i:03d}") for i in range(60)]
    others = [(gpu, plain)[i % 2].submit("ok", id=f"o{i:03d}") for i in range(40)]
    for work_id in ids + others:
        gpu.wait_status(work_id, "completed", timeout=120)
    runs = ran_on(gpu.side)
    assert {w: runs.get(w) for w in ids} == {w: [gpu.name] for w in ids}
    # The unlabelled daemon was claiming all along: it started some of the plain Work.
    assert "attempt start" in plain.log()
    assert any(f"work={w} " in plain.log() for w in others)
    started = [line for line in plain.log().splitlines() if "attempt start" in line]
    assert not [line for line in started if "work=g" in line]


@pytest.mark.postgres
@pytest.mark.parametrize("store", [pytest.param("postgres", id="postgres")], indirect=True)
def test_negative_control_without_the_label_filter_work_runs_on_a_daemon_without_the_label(
    make_daemon: Callable[..., Daemon], store: str
) -> None:
    """The same race with the claim's label rule switched off (``label_filter``, test only):
    the detector (which daemon's command ran each job) sees the unlabelled daemon run ``gpu``
    Work, so the test above could see it too."""
    env = {"CONDUIT_TEST_UNSAFE": "label_filter"}
    gpu = labelled(make_daemon, ["gpu"], job_concurrency=4).start(rescan=0.2, env=env)
    plain = labelled(make_daemon, ["eu"], job_concurrency=4).start(rescan=0.2, env=env)
    ids = [(gpu, plain)[i % 2].submit("gpu", id=f"g{i:03d}") for i in range(40)]
    for work_id in ids:
        gpu.wait_status(work_id, "completed", timeout=120)
    runs = ran_on(gpu.side)
    assert any(runs.get(w) == [plain.name] for w in ids), runs


@pytest.mark.postgres
@pytest.mark.parametrize("store", [pytest.param("postgres", id="postgres")], indirect=True)
def test_an_attempt_is_recovered_only_by_a_daemon_with_the_label(
    make_daemon: Callable[..., Daemon], store: str
) -> None:
    """The labelled daemon dies mid-job: the other daemon, its passes going on past the lease's
    expiry, leaves the attempt alone (a recovery may relaunch); a labelled one adopts it."""
    gpu = labelled(make_daemon, ["gpu"], lease=2).start()
    plain = labelled(make_daemon, [], lease=2).start()
    job = gpu.submit("gpu-held", id="gpu-job")
    gpu.wait_attempt(job, "running")
    gpu.kill()
    wait_for("the lease to expire", lambda: "expired" if _lease_expired(plain, job) else None)
    # Submitted after the expiry: once the plain daemon started it, a pass of the plain daemon
    # ran its recovery step (before its claim step) with the attempt recoverable.
    after = plain.submit("ok", id="after-expiry")
    plain.wait_status(after, "completed")
    assert "attempt recover" not in plain.log()
    assert plain.show(job).attempts[-1].epoch == 1
    rescuer = labelled(make_daemon, ["gpu"], lease=2).start()
    wait_for("the labelled daemon to adopt the job",
             lambda: plain.show(job).attempts[-1].epoch == 2)  # fmt: skip
    assert "attempt recover" in rescuer.log()
    rescuer.release(job)
    rescuer.wait_status(job, "completed")
    assert rescuer.runs(job, "start") == 1
    assert rescuer.runs(job, "end") == 1


def _lease_expired(daemon: Daemon, work_id: str) -> bool:
    import psycopg

    with psycopg.connect(daemon.store, autocommit=True) as conn:
        row = conn.execute(
            "SELECT lease_expires_at_ms < (EXTRACT(EPOCH FROM clock_timestamp()) * 1000) "
            "FROM conduit_execution WHERE work_id = %s AND lease_token IS NOT NULL", (work_id,),
        ).fetchone()  # fmt: skip
    return bool(row and row[0])


def test_work_no_live_daemon_can_run_waits_for_its_label(
    make_daemon: Callable[..., Daemon], store: str
) -> None:
    """One daemon labelled ``gpu``: its ``gpu`` Work runs; a ``tpu`` Work stays ready, no
    attempt, and says it waits for label ``tpu`` (API and ``work show``)."""
    daemon = labelled(make_daemon, ["gpu"]).start()
    tpu = daemon.submit("tpu", id="needs-tpu")
    done = daemon.submit("gpu", id="has-gpu")
    daemon.wait_status(done, "completed")
    assert ran_on(daemon.side)[done] == [daemon.name]
    detail = daemon.show(tpu)
    assert str(detail.work.status) == "ready"
    assert not detail.attempts
    assert detail.waiting is not None
    assert detail.waiting.code == "waiting_label"
    assert detail.waiting.message.startswith("waiting for label tpu")
    assert "waiting for label tpu" in daemon.cli("work", "show", tpu).stdout
    # The registry lists the daemon with its labels.
    listed = daemon.cli("daemons").stdout
    assert "gpu" in listed
    assert "running" in listed


@pytest.mark.parametrize("how", ["cli", "sigusr1"])
def test_drain_lets_the_running_job_finish_then_exits_0(
    make_daemon: Callable[..., Daemon], store: str, how: str
) -> None:
    daemon = labelled(make_daemon, ["gpu"]).start()
    held = daemon.submit("held", id="long-job")
    daemon.wait_attempt(held, "running")
    if how == "cli":
        said = daemon.cli("daemon", "drain").stdout
        assert "draining" in said
    else:
        daemon.signal(signal.SIGUSR1)

    def shows_draining() -> bool:
        return "draining" in daemon.cli("daemons").stdout

    wait_for("conduit daemons to show the daemon draining", shows_draining)
    health = daemon.raw("GET", "/v1/health")[1]
    assert (health["status"], health["draining"], health["labels"]) == ("draining", True, ["gpu"])
    # Submitted while it drains: accepted, never claimed by the draining daemon.
    later = daemon.submit("ok", id="after-drain")
    assert daemon.proc is not None
    assert daemon.proc.poll() is None
    daemon.release(held)
    assert daemon.wait_exit(timeout=30) == 0
    assert daemon.runs(held, "end") == 1
    assert daemon.runs(later) == 0
    table = daemon.cli("daemons").stdout  # no daemon runs now: read from the store
    assert "stopped" in table
    shown = daemon.cli("work", "show", held).stdout
    assert "completed" in shown
    assert "ready" in daemon.cli("work", "show", later).stdout
    refused = daemon.cli("daemon", "drain", check=False)
    assert refused.returncode == 1
    assert "daemon_not_running" in refused.stderr


def test_a_daemon_not_seen_lately_is_lost(make_daemon: Callable[..., Daemon], store: str) -> None:
    daemon = labelled(make_daemon, ["gpu"]).start()

    async def write_old_row() -> None:
        async with await open_store(daemon.store) as s:
            await s.record_daemon(DaemonRecord(
                id="gone/1/x", host="gone", pid=1, labels=["tpu"], load=2,
                started_at_ms=1_000, last_seen_ms=2_000,
            ))  # fmt: skip

    anyio.run(write_old_row)
    rows = {d["id"]: d for d in daemon.raw("GET", "/v1/daemons")[1]["daemons"]}
    assert rows["gone/1/x"]["state"] == "lost"
    assert [r["state"] for k, r in rows.items() if k != "gone/1/x"] == ["running"]
    # The label of a lost daemon does not count: the tpu Work waits for it.
    tpu = daemon.submit("tpu", id="needs-tpu")
    detail = daemon.show(tpu)
    assert detail.waiting is not None
    assert detail.waiting.code == "waiting_label"
    assert "lost" in daemon.cli("daemons").stdout
