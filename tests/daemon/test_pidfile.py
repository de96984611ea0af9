"""The pid file never blocks a restart for a process that is not a running daemon.

A daemon SIGKILLed and not yet reaped (a zombie) and a live unrelated process that reuses the
recorded pid (pid 1 here) both leave a stale file; a real second daemon still starts. The
negative control: a live daemon still refuses a second one (tests/daemon/test_api.py).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from conduit_core.daemon._paths import DaemonPaths, PidRecord, pid_namespace, process_identity

from .conftest import Daemon, wait_for


def paths_for(pid_file: Path) -> DaemonPaths:
    return DaemonPaths(
        config_file=pid_file.with_suffix(".toml"),
        data_dir=pid_file.parent,
        store=str(pid_file.with_suffix(".db")),
        sqlite_file=None,
        token_file=pid_file.with_suffix(".token"),
        pid_file=pid_file,
        unix_socket=None,
        listen="127.0.0.1:0",
    )


def test_a_killed_unreaped_daemon_never_blocks_its_restart(
    make_daemon: Callable[..., Daemon],
) -> None:
    daemon = make_daemon().start()
    killed = daemon.proc
    assert killed is not None
    os.kill(killed.pid, signal.SIGKILL)  # and not reaped: it stays a zombie

    def zombie() -> bool:
        return psutil.Process(killed.pid).status() == psutil.STATUS_ZOMBIE

    wait_for("the killed daemon to be a zombie", zombie, timeout=10)
    assert (daemon.data / "daemon.pid").read_text().split()[0] == str(killed.pid)
    try:
        daemon.start()  # healthy, not refused with daemon_running
        assert "daemon_running" not in daemon.log()
    finally:
        killed.wait(10)


def test_a_stale_pid_file_naming_an_unrelated_live_process_is_ignored(
    make_daemon: Callable[..., Daemon],
) -> None:
    daemon = make_daemon()
    daemon.data.mkdir(parents=True, exist_ok=True)
    # pid 1 is alive and is no conduit daemon; the recorded identity is not its own.
    (daemon.data / "daemon.pid").write_text("1 00000000-0000-0000-0000-000000000000:1\n")
    daemon.start()
    daemon.kill()
    # Without an identity (an older conduit wrote the file) the process must look like conduit.
    (daemon.data / "daemon.pid").write_text("1\n")
    daemon.start()
    assert "daemon_running" not in daemon.log()


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")
def test_running_pid_tells_the_recorded_process_from_others(tmp_path: Path) -> None:
    paths = paths_for(tmp_path / "daemon.pid")
    paths.write_pid_file()
    assert paths.running_pid() == os.getpid()  # negative control: this one does run
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        identity = process_identity(other.pid)
        assert identity is not None
        assert identity != process_identity(os.getpid())
        paths.pid_file.write_text(f"{other.pid} {identity}\n")
        assert paths.running_pid() == other.pid
        # The same pid with another start time: reused by an unrelated process.
        paths.pid_file.write_text(f"{other.pid} {identity}0\n")
        assert paths.running_pid() is None
        other.kill()
        wait_for("a zombie", lambda: psutil.Process(other.pid).status() == "zombie", timeout=10)
        paths.pid_file.write_text(f"{other.pid} {identity}\n")
        assert paths.running_pid() is None  # killed, not reaped: dead all the same
    finally:
        other.kill()
        other.wait(10)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc (Linux)")
def test_dead_predecessor_needs_proof_of_death_on_this_host_and_boot(tmp_path: Path) -> None:
    """Only a pid file of this host, boot and pid namespace whose process is gone names a
    predecessor whose leases may be taken over; anything else proves nothing."""
    paths = paths_for(tmp_path / "daemon.pid")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        identity = process_identity(other.pid)
        assert identity is not None
        live = PidRecord(
            pid=other.pid, identity=identity, owner="host/1/ab", host=socket.gethostname(),
            pid_ns=pid_namespace(),
        )  # fmt: skip
        paths.pid_file.write_text(live.text())
        assert paths.dead_predecessor() is None  # negative control: it still runs
        other.kill()
        wait_for("a zombie", lambda: psutil.Process(other.pid).status() == "zombie", timeout=10)
        assert paths.dead_predecessor() == "host/1/ab"  # killed, not reaped: dead
        other.wait(10)
        assert paths.dead_predecessor() == "host/1/ab"  # reaped: gone
        boot, _, start = identity.partition(":")
        for unproven in (
            dataclasses.replace(live, host="elsewhere"),
            dataclasses.replace(live, pid_ns="pid:[1]"),
            dataclasses.replace(live, identity=f"{boot[::-1]}:{start}"),  # another boot
            dataclasses.replace(live, owner=None),  # an older conduit's file
        ):
            paths.pid_file.write_text(unproven.text())
            assert paths.dead_predecessor() is None, unproven
        # The line older conduits read is unchanged: "<pid> <identity>".
        assert live.text().splitlines()[0] == f"{other.pid} {identity}"
        assert PidRecord.parse(live.text()) == live
    finally:
        other.kill()
        other.wait(10)
