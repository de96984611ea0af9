"""DetachedJobs (the crash-safe launch pattern the wire examples use): a started job is visible
at once, and one empty look does not make a running job "vanished".

The chaos drill once ran a wire job twice: ``start`` returned while the backgrounded wrapper was
still being exec'd (a process mid-exec shows an empty environment, so no marked process was
seen), ``wait``'s first look found neither a process nor a status and called the job vanished,
and the retry ran it again. Here the exec window is widened on purpose: the wrapper is started
through a process that does not carry the marker for 0.3 s.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conduit_core.extension import DetachedJobs, _detached

pytestmark = pytest.mark.anyio
MARK = "CONDUIT_TEST_DETACHED_MARK"
JOBS = DetachedJobs(MARK)
# Like _detached._START, but the backgrounded process sheds the marker and sleeps 0.3 s before it
# execs the wrapper with the marker again: the window a slow exec leaves, made wide.
SLOW_START = (
    f"env -u {MARK} sh -c 'sleep 0.3; exec env {MARK}=\"$3\" sh -c \"$0\" \"$1\" \"$2\"' "
    f'"$0" "$1" "$2" "${MARK}" &'
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_started_job_is_visible_when_start_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_detached, "_START", SLOW_START)
    directory, marker = tmp_path / "job", "x1/1"
    await JOBS.start(directory, "sleep 0.5", marker, {})
    try:
        assert JOBS.exists(directory, marker), "start returned before its job could be seen"
        assert await JOBS.wait(directory, marker) == 0
    finally:
        await JOBS.kill("x1/")


async def test_a_finished_job_reports_its_status(tmp_path: Path) -> None:
    directory, marker = tmp_path / "job", "x2/1"
    await JOBS.start(directory, "exit 3", marker, {})
    assert await JOBS.wait(directory, marker) == 3


async def test_a_job_killed_without_a_status_is_gone(tmp_path: Path) -> None:
    directory, marker = tmp_path / "job", "x3/1"
    await JOBS.start(directory, "sleep 30", marker, {})
    evidence = await JOBS.kill("x3/")
    assert evidence.verified
    assert await JOBS.wait(directory, marker) is None
    assert not JOBS.exists(directory, marker)
