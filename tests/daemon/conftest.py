"""A real daemon subprocess (``python -m conduit_core.cli daemon``) per test, on either backend.

Shell jobs append to a side-effect file, so a test can count how many times each one ran.
Nothing sleeps for a fixed time: every wait polls with a deadline.
"""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import psutil
import pytest

from conduit_core.http import ApiClient, SubmitRequest, WorkDetail
from tests.storage.conftest import postgres_url, sqlite_url  # noqa: F401

T = TypeVar("T")

CONFIG = """\
[settings]
store = "{store}"
data_dir = "{data}"
concurrency = {concurrency}
job_concurrency = {job_concurrency}
lease_seconds = {lease}
retry_delays_seconds = [0.2]
http.listen = "127.0.0.1:{port}"
{settings_extra}

[scopes.team]
limits.concurrency = 2

[bindings.ok]
executor = "shell"
config = {{ command = 'echo "$CONDUIT_WORK_ID run" >> {side}; echo hello' }}

[bindings.sleeper]
executor = "shell"
config = {{ command = 'echo "$CONDUIT_WORK_ID start" >> {side}; sleep {sleep}; echo "$CONDUIT_WORK_ID end" >> {side}' }}

[bindings.held]
executor = "shell"
config = {{ command = 'echo "$CONDUIT_WORK_ID start" >> {side}; while test ! -e {root}/release.$CONDUIT_WORK_ID; do sleep 0.05; done; echo "$CONDUIT_WORK_ID end" >> {side}' }}

[bindings.forever]
executor = "shell"
config = {{ command = 'echo "$CONDUIT_WORK_ID start" >> {side}; sleep 300', stop_grace_seconds = 2 }}

[bindings.flaky]
executor = "shell"
config = {{ command = 'echo "$CONDUIT_WORK_ID run" >> {side}; test -e {root}/mark.$CONDUIT_WORK_ID || {{ touch {root}/mark.$CONDUIT_WORK_ID; exit 3; }}' }}

[bindings.gated]
executor = "shell"
retry_delays_seconds = []
config = {{ command = 'echo "$CONDUIT_WORK_ID run" >> {side}; test -e {root}/gate' }}

[bindings.echo]
executor = "echo"
{extra}
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for(what: str, check: Callable[[], T | None], timeout: float = 30.0) -> T:
    """Poll ``check`` until it returns something truthy; fail with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    delay = 0.02
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.2)


class Daemon:
    """One daemon's config, process, API client and CLI."""

    def __init__(self, root: Path, store: str, *, name: str = "d1", **settings: Any) -> None:
        self.root = root
        self.name = name
        self.store = store
        self.side = root / "side-effects.log"
        self.data = root / f"data-{name}"
        self.config = root / f"{name}.toml"
        self.port = free_port()
        self.settings = {
            "lease": 30,
            "sleep": 2.5,
            "concurrency": 8,
            "job_concurrency": 4,
            "extra": "",
            "settings_extra": "",
        } | settings
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = root / f"{name}.log"
        self.write_config()

    def write_config(self, **settings: Any) -> None:
        self.settings |= settings
        self.config.write_text(
            CONFIG.format(
                store=self.store, data=self.data, port=self.port, side=self.side, root=self.root,
                **self.settings,
            )
        )  # fmt: skip

    # --- process -------------------------------------------------------------------------------

    def start(
        self, *, rescan: float = 0.2, wait: bool = True, env: dict[str, str] | None = None
    ) -> Daemon:
        """Start the daemon; ``env`` adds variables (a test-only fault switch, say) to its own."""
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "conduit_core.cli", "daemon", "--config", str(self.config),
             "--rescan", str(rescan)],
            stdout=log, stderr=subprocess.STDOUT, cwd=self.root,
            env={**os.environ, **env} if env else None,
        )  # fmt: skip
        log.close()
        if wait:
            wait_for(f"daemon {self.name} to answer /v1/health", self._healthy, timeout=30)
        return self

    def _healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            pytest.fail(f"daemon {self.name} exited {self.proc.returncode}:\n{self.log()}")
        try:
            self.api().request("GET", "/v1/health", None, dict)
        except Exception:
            return False
        return True

    def signal(self, signum: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(signum)

    def pause_between_transactions(self) -> None:
        """SIGSTOP the daemon outside any write transaction: on SQLite a process paused inside
        one keeps the file's write lock, and no other daemon could write until it resumes
        (PostgreSQL ends such a session after ``idle_in_transaction_session_timeout``). Resumed
        and paused again until the file takes a write. The probe runs once the process is
        stopped (its state ``T``), not as soon as the signal is sent: a loaded machine may let
        it run on for a moment, into a write transaction it would then keep."""
        deadline = time.monotonic() + 30
        while True:
            self.signal(signal.SIGSTOP)
            wait_for(f"daemon {self.name} to be stopped", self._stopped, timeout=10)
            if "://" in self.store:
                return
            try:
                probe = sqlite3.connect(self.store, timeout=0.5, isolation_level=None)
                try:
                    probe.execute("BEGIN IMMEDIATE")
                    probe.execute("ROLLBACK")
                finally:
                    probe.close()
                return
            except sqlite3.OperationalError:
                assert time.monotonic() < deadline, "the paused daemon always held the write lock"
                self.signal(signal.SIGCONT)
                time.sleep(0.05)

    def _stopped(self) -> bool:
        assert self.proc is not None
        stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        return stat[stat.rindex(")") + 2] in "tT"

    def wait_exit(self, timeout: float = 20) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"daemon {self.name} did not exit in {timeout} s:\n{self.log()}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    # --- clients -------------------------------------------------------------------------------

    @property
    def token(self) -> str:
        return (self.data / "token").read_text().strip()

    def api(self, token: str | None = None) -> ApiClient:
        return ApiClient(token or self.token, listen=f"127.0.0.1:{self.port}", timeout=10)

    def submit(self, binding: str, **fields: Any) -> str:
        req = SubmitRequest(binding=binding, **fields)
        return self.api().request("POST", "/v1/work", req, WorkDetail).work.id

    def show(self, work_id: str) -> WorkDetail:
        return self.api().request("GET", f"/v1/work/{work_id}", None, WorkDetail)

    def raw(self, method: str, path: str, body: bytes | None = None,
            token: str | None = "default") -> tuple[int, dict[str, Any]]:  # fmt: skip
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        headers = {"Content-Type": "application/json"}
        if token is not None:
            headers["Authorization"] = f"Bearer {self.token if token == 'default' else token}"
        conn.request(method, path, body=body, headers=headers)
        reply = conn.getresponse()
        data = reply.read()
        conn.close()
        return reply.status, msgspec.json.decode(data) if data else {}

    def cli(
        self, *args: str, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "conduit_core.cli", *args, "--config", str(self.config)],
            capture_output=True, text=True, timeout=timeout, cwd=self.root,
        )  # fmt: skip
        if check and done.returncode != 0:
            pytest.fail(f"conduit {' '.join(args)} exited {done.returncode}:\n{done.stderr}")
        return done

    def wait_status(self, work_id: str, *statuses: str, timeout: float = 30) -> WorkDetail:
        def check() -> WorkDetail | None:
            detail = self.show(work_id)
            return detail if str(detail.work.status) in statuses else None

        return wait_for(f"{work_id} to be {'/'.join(statuses)}", check, timeout)

    def wait_attempt(self, work_id: str, *statuses: str, timeout: float = 30) -> WorkDetail:
        def check() -> WorkDetail | None:
            detail = self.show(work_id)
            if detail.attempts and str(detail.attempts[-1].status) in statuses:
                return detail
            return None

        return wait_for(f"{work_id}'s attempt to be {'/'.join(statuses)}", check, timeout)

    def release(self, work_id: str) -> None:
        """Let a ``held`` job finish."""
        (self.root / f"release.{work_id}").touch()

    def runs(self, work_id: str, word: str = "run") -> int:
        if not self.side.exists():
            return 0
        return self.side.read_text().splitlines().count(f"{work_id} {word}")


def job_processes(execution_id: str) -> list[psutil.Process]:
    """Live processes of a shell job (found by the execution id in their environment)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get("CONDUIT_EXECUTION_ID") == execution_id:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def _kill_jobs_under(root: Path) -> None:
    for proc in psutil.process_iter():
        try:
            if str(root) in proc.cwd():
                os.killpg(os.getpgid(proc.pid), signal.SIGKILL)
        except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError, PermissionError):
            continue


@pytest.fixture(
    params=[pytest.param("sqlite", id="sqlite"), pytest.param("postgres", id="postgres")]
)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "conduit.db")
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
def daemons(tmp_path: Path) -> Iterator[list[Daemon]]:
    """Every daemon a test makes; killed (with any job left) at the end."""
    made: list[Daemon] = []
    yield made
    for daemon in made:
        daemon.kill()
    _kill_jobs_under(tmp_path)


@pytest.fixture
def make_daemon(tmp_path: Path, store: str, daemons: list[Daemon]) -> Callable[..., Daemon]:
    def make(**settings: Any) -> Daemon:
        daemon = Daemon(tmp_path, store, name=f"d{len(daemons) + 1}", **settings)
        daemons.append(daemon)
        return daemon

    return make
