"""A private PostgreSQL server a fault test may stop, kill and restart.

The shared cluster on /var/run/postgresql serves every other test at the same time, so a test
that takes the database away starts its own server: ``initdb`` into a temporary folder owned by
``postgres`` (initdb refuses to run as root), a Unix socket in that folder and no TCP listener,
``pg_ctl start``/``stop -m immediate``. The immediate stop is the crash a restart looks like to
a client: every connection is cut mid-transaction.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["PgServerError", "PrivateServer"]

_BIN = Path("/usr/lib/postgresql")
_USER = "postgres"
_PORT = 5433  # only names the socket file: the socket folder is private, nothing listens on TCP


class PgServerError(RuntimeError):
    """The private server could not be set up, started or stopped."""


def _bin_dir() -> Path:
    versions = sorted(
        (p for p in _BIN.glob("*/bin") if (p / "initdb").exists()),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    if not versions:
        raise PgServerError(f"no PostgreSQL server binaries under {_BIN}")
    return versions[-1]


def _as_postgres(*cmd: str, timeout: float = 120) -> str:
    if os.geteuid() != 0:
        raise PgServerError("a private PostgreSQL server needs root (to run as the postgres user)")
    done = subprocess.run(
        ["runuser", "-u", _USER, "--", *cmd],
        capture_output=True, text=True, timeout=timeout, cwd="/",
    )  # fmt: skip
    if done.returncode != 0:
        raise PgServerError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.strip()}")
    return done.stdout


class PrivateServer:
    """One throw-away PostgreSQL cluster; ``url(db)`` connects as superuser ``root``."""

    def __init__(self) -> None:
        try:
            user = pwd.getpwnam(_USER)
        except KeyError as exc:
            raise PgServerError(f"no {_USER!r} user (is PostgreSQL installed?)") from exc
        self.bin = _bin_dir()
        self.root = Path(tempfile.mkdtemp(prefix="conduit-pg-"))
        os.chown(self.root, user.pw_uid, user.pw_gid)
        self.data = self.root / "data"
        self.socket_dir = self.root
        self.logfile = self.root / "server.log"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://root@/{database}?host={self.socket_dir}&port={_PORT}"

    def init(self) -> None:
        _as_postgres(str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", _USER,
                     "--no-sync")  # fmt: skip
        self.start()
        _as_postgres(str(self.bin / "createuser"), "-h", str(self.socket_dir), "-p", str(_PORT),
                     "-U", _USER, "-s", "root")  # fmt: skip

    def start(self) -> None:
        # fsync off: a crash of the whole machine is not what these tests simulate, and a
        # server crash (stop -m immediate) loses nothing committed with fsync off either.
        opts = (
            f"-k {self.socket_dir} -p {_PORT} -c listen_addresses='' -c fsync=off "
            f"-c max_connections=200 -c shared_buffers=16MB"
        )
        _as_postgres(str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.logfile),
                     "-o", opts, "-w", "-t", "60", "start")  # fmt: skip

    def stop(self) -> None:
        """Crash-stop: every client connection is cut at once."""
        _as_postgres(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate",
                     "-w", "-t", "60", "stop")  # fmt: skip

    def running(self) -> bool:
        done = subprocess.run(
            ["runuser", "-u", _USER, "--", str(self.bin / "pg_ctl"), "-D", str(self.data),
             "status"], capture_output=True, cwd="/",
        )  # fmt: skip
        return done.returncode == 0

    def create_database(self, name: str) -> str:
        import psycopg

        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(self.url(), autocommit=True, connect_timeout=5) as conn:
                    conn.execute(f'CREATE DATABASE "{name}"')
                return self.url(name)
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def destroy(self) -> None:
        if self.data.exists() and self.running():
            with contextlib.suppress(PgServerError):
                self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
