"""A daemon paused (SIGSTOP) past its attempts' deadlines right after a burst of submits runs no
job twice: recovery of an attempt whose deadline has passed times it out — after a verified stop
where anything may run — and never relaunches it (invariant 11). Each job appends a line to a
file, so the runs are counted from the jobs themselves, not from what the daemon recorded. The
jobs last longer than a burst of submits takes, so the pause finds attempts mid-run."""

from __future__ import annotations

import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from conduit_core.model import Execution
from conduit_core.storage import open_store
from tests.daemon.conftest import Daemon, wait_for

LEASE_S = 2
TIMEOUT_S = 4
JOB_S = 1.5
BURST = 30
BURSTS = 2


def _timed_binding(side: Path) -> str:
    """A sleeper whose lines carry the instant each run starts and ends (epoch ms)."""
    line = f'echo "$CONDUIT_WORK_ID {{}} $(date +%s%3N)" >> {side}'
    command = f"{line.format('start')}; sleep {JOB_S}; {line.format('end')}"
    return f'[bindings.timed]\nexecutor = "shell"\nconfig = {{ command = {command!r} }}\n'


def _runs(side: Path, work_id: str) -> list[tuple[str, int]]:
    """The job's lines for ``work_id``: ("start" | "end", epoch ms)."""
    found = []
    for line in side.read_text().splitlines() if side.exists() else []:
        wid, what, at = line.split()
        if wid == work_id:
            found.append((what, int(at)))
    return found


def _attempts(store_url: str, works: list[str]) -> list[Execution]:
    async def read() -> list[Execution]:
        store = await open_store(store_url)
        try:
            return [ex for w in works for ex in await store.list_executions(w)]
        finally:
            await store.aclose()

    return anyio.run(read)


def _trail(ex: Execution) -> str:
    due = ex.snapshot.deadline_ms
    segments = ", ".join(
        f"epoch {s.epoch}{' recovered' if s.recovered else ''}{' relaunched' if s.relaunched else ''}"
        f" invoke={s.invoke} began {s.started_at_ms - due:+d} ms from the deadline"
        for s in ex.segments
    )
    return f"{ex.id} {ex.status} {ex.failure_code} {ex.failure_message}: {segments}"


def _settled(daemon: Daemon, work_id: str) -> bool:
    """Completed or failed, or out of retries (attempts timed out by both pauses, with
    ``terminal_on_exhaustion`` off: ready, blocked until someone retries it)."""
    work = daemon.show(work_id).work
    return str(work.status) in ("completed", "failed") or work.blocked_reason == "retry_exhausted"


def _settled_or_held(daemon: Daemon, work_id: str) -> bool:
    detail = daemon.show(work_id)
    if str(detail.work.status) in ("completed", "failed"):
        return True
    return bool(detail.attempts) and detail.attempts[-1].recovery_hold is not None


def _pause_past_deadlines(daemon: Daemon, works: list[str]) -> None:
    """SIGSTOP the daemon and wait (paused) until every attempt it claimed is past its deadline,
    so whatever recovers them next recovers them past it."""
    daemon.pause_between_transactions()
    attempts = _attempts(daemon.store, works)
    assert attempts, "the daemon claimed nothing before it was paused"
    due_ms = max(ex.snapshot.deadline_ms for ex in attempts) + 200
    wait_for(
        "every claimed attempt to be past its deadline",
        lambda: time.time() * 1000 > due_ms,
        timeout=TIMEOUT_S + 10,
    )


@pytest.mark.parametrize("recovered_by", ["itself", "a successor"])
def test_paused_past_the_deadline_runs_no_job_twice(
    make_daemon: Callable[..., Daemon], recovered_by: str, tmp_path: Path
) -> None:
    settings = {
        "lease": LEASE_S,
        "extra": _timed_binding(tmp_path / "side-effects.log"),
        "concurrency": 64,
        "job_concurrency": 64,
        "settings_extra": f"timeout_seconds = {TIMEOUT_S}",
    }
    d1 = make_daemon(**settings).start()
    daemons = [d1]
    works: list[str] = []
    for burst in range(BURSTS):
        fresh = [d1.submit("timed") for _ in range(BURST)]
        works += fresh
        _pause_past_deadlines(d1, fresh)
        if recovered_by == "a successor" and burst == BURSTS - 1:
            # Another daemon recovers them while d1 is still paused; d1 resumes fenced. (An
            # attempt whose launch d1 was paused in, holding its launch lock, is held until then.)
            d2 = make_daemon(**settings).start()
            daemons.append(d2)
            for work_id in fresh:
                wait_for(
                    f"{work_id} to be settled or held by d2",
                    lambda w=work_id, d=d2: _settled_or_held(d, w),  # type: ignore[misc]
                    timeout=60,
                )
        d1.signal(signal.SIGCONT)

    for work_id in works:  # a held recovery is tried again after 30 s
        try:
            wait_for(f"{work_id} to settle", lambda w=work_id: _settled(d1, w), timeout=90)  # type: ignore[misc]
        except pytest.fail.Exception:
            detail = d1.show(work_id)
            logs = [line for line in d1.log().splitlines() if work_id in line]
            raise AssertionError(
                f"{work_id} unsettled: {detail.work}\n{detail.attempts}\n" + "\n".join(logs)
            ) from None
    runs = Counter(
        {w: sum(1 for what, _ in _runs(d1.side, w) if what == "start") for w in works}
    )
    twice = sorted(w for w, n in runs.items() if n > 1)
    attempts = _attempts(d1.store, works)
    assert not twice, (
        f"{len(twice)} of {len(works)} Work ran their job more than once: "
        + "\n".join(_trail(ex) for ex in attempts if ex.work_id in twice)
        + "\n" + "\n".join(f"{w}: {_runs(d1.side, w)}" for w in twice)
        + "".join(
            f"\n{name}:\n" + "\n".join(
                line for line in d.log().splitlines() if any(w in line for w in twice)
            )
            for name, d in zip(("d1", "d2"), daemons, strict=False)
        )
    )
    for work_id in works:
        detail = d1.show(work_id)
        if str(detail.work.status) == "completed":
            assert runs[work_id] == 1, (work_id, detail.attempts)
    # The pauses left attempts to be recovered past their deadline (else this proved nothing) ...
    late = [
        ex
        for ex in attempts
        if any(s.recovered and s.started_at_ms >= ex.snapshot.deadline_ms for s in ex.segments)
    ]
    assert late, "no attempt was recovered past its deadline:\n" + "\n".join(map(_trail, attempts))
    # ... and none of them was relaunched.
    for ex in late:
        assert not any(
            s.relaunched and s.started_at_ms >= ex.snapshot.deadline_ms for s in ex.segments
        ), _trail(ex)
