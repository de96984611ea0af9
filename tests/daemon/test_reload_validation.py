"""A reload with a bad file is refused and the running config stays (issue 17, items 3, 4, 6).

Observed before: ``timezone = "America"`` (a tzdata directory) passed ``config check`` and a
``conduit reload`` with it killed the running daemon with ``IsADirectoryError``; an infinite
timeout or a deeply nested file crashed it the same way. A real daemon process on a real store.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Callable

import pytest

from tests.daemon.conftest import Daemon, wait_for

ROUTINE = """
[[routines]]
id = "tz"
cron = "0 9 * * *"
binding = "ok"
timezone = "{zone}"
"""

BAD = {
    "directory-timezone": ROUTINE.format(zone="America"),
    "long-timezone": ROUTINE.format(zone="x" * 300),
    "infinite-timeout": '[bindings.inf]\nexecutor = "echo"\ntimeout_seconds = inf\n',
    "deep": "[bindings.deep]\nexecutor = 'echo'\nconfig = { a = "
    + "[" * 3000
    + "]" * 3000
    + " }\n",
    "bad-cron": '[[routines]]\nid = "c"\ncron = "61 * * * *"\nbinding = "ok"\n',
}


@pytest.mark.parametrize("bad", sorted(BAD))
def test_a_bad_reload_is_refused_and_the_daemon_keeps_serving(
    make_daemon: Callable[..., Daemon], bad: str
) -> None:
    daemon = make_daemon().start()
    good_text = daemon.config.read_text()
    daemon.config.write_text(good_text + BAD[bad])
    check = subprocess.run(
        [sys.executable, "-m", "conduit_core.cli", "config", "check", str(daemon.config)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert check.returncode == 1, check.stdout  # config check refuses it up front too
    assert "Traceback" not in check.stderr
    refusals = daemon.log().count("reload refused")
    daemon.signal(signal.SIGHUP)
    wait_for("the refusal", lambda: daemon.log().count("reload refused") > refusals)
    assert daemon.proc is not None
    assert daemon.proc.poll() is None, daemon.log()[-2000:]
    assert "/usr/share/zoneinfo" not in daemon.log()
    # Still serving on the old config: Work of an old binding completes.
    work = daemon.submit("ok")
    assert daemon.wait_status(work, "completed").work.binding == "ok"
    # Negative control: a good change is reloaded by the same signal.
    daemon.config.write_text(good_text + '[bindings.added]\nexecutor = "echo"\n')
    daemon.signal(signal.SIGHUP)
    wait_for("the reload", lambda: "config reloaded" in daemon.log())
    assert daemon.wait_status(daemon.submit("added"), "completed").work.binding == "added"
