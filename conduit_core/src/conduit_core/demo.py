"""``python -m conduit_core.demo``: conduit working end to end, in under a minute.

It writes a config in a temporary folder (a SQLite store, shell bindings, and a Python function
when ``conduit-executors-python`` is installed), starts the daemon as a subprocess, submits Work
through the HTTP API — jobs that succeed, one that fails once and is retried by policy, a Python
function with a typed result — shows their progress, then prints ``conduit work list`` and stops
the daemon with SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from conduit_core.http import ApiClient, SubmitRequest, WorkDetail, read_token
from conduit_core.plugins import Plugins

__all__ = ["main"]

CONFIG = """\
# Written by python -m conduit_core.demo
[settings]
store = "conduit.db"
data_dir = "data"
job_concurrency = 2
lease_seconds = 15
retry_delays_seconds = [2]
http.listen = "127.0.0.1:{port}"

[bindings.hello]
executor = "shell"
config = {{ command = 'echo "hello from conduit, work $CONDUIT_WORK_ID"; date -u' }}

[bindings.report]
executor = "shell"
timeout_seconds = 60
config = {{ command = 'for i in 1 2 3; do echo "step $i"; sleep 1; done' }}

[bindings.flaky]
executor = "shell"
retry_delays_seconds = [1]
config = {{ command = '{flaky}' }}
{python}{routines}"""

#: With ``conduit-executors-python``: a Python function as a job, its return value typed.
PYTHON_BINDING = """
[bindings.summarize]
executor = "python"
config = {{ function = "demo_functions:summarize", cwd = "{root}" }}
"""
PYTHON_MODULE = '''"""Written by the conduit demo: a function the python executor runs."""


import msgspec


class Summary(msgspec.Struct):
    count: int
    total: float


def summarize(numbers: list[float]) -> Summary:
    print(f"summing {len(numbers)} numbers")
    return Summary(count=len(numbers), total=sum(numbers))
'''
PYTHON_SUBMISSION = ("summarize", {"numbers": [3, 1, 4, 1, 5, 9]})

#: A Routine the daemon fires from the config: ``hello`` every five seconds (6-field cron,
#: seconds first).
ROUTINES = """
[[routines]]
id = "every-5s"
cron = "*/5 * * * * *"
binding = "hello"
"""
ROUTINE_ID = "conduit:every-5s"

#: Fails the first time (leaving a marker), succeeds on the retry.
FLAKY = 'test -e {root}/flaky-ok || {{ touch {root}/flaky-ok; echo "failing once" >&2; exit 3; }}'

SUBMISSIONS = [("hello", None), ("report", {"day": "today"}), ("flaky", None), ("hello", None)]
DEADLINE_S = 50.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _conduit(*args: str) -> list[str]:
    return [sys.executable, "-m", "conduit_core.cli", *args]


def _table(details: list[WorkDetail]) -> Table:
    table = Table(title="conduit demo: Work through the daemon", header_style="bold")
    for column in ("WORK", "BINDING", "STATUS", "ATTEMPTS", "LAST OUTCOME"):
        table.add_column(column)
    for detail in details:
        last = detail.attempts[-1] if detail.attempts else None
        outcome = ""
        if last is not None:
            outcome = str(last.status)
            if last.failure_message:
                outcome += f" ({last.failure_message})"
            elif last.result is not None and last.result.summary:
                outcome += f" ({last.result.summary})"
        note = " (retry pending)" if detail.work.retry_pending else ""
        table.add_row(
            detail.work.id, detail.work.binding, f"{detail.work.status}{note}",
            str(len(detail.attempts)), outcome,
        )  # fmt: skip
    return table


def _wait_ready(api: ApiClient, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the daemon exited ({proc.returncode}):\n{log.read_text()}")
        try:
            api.request("GET", "/v1/health", None, dict)
            return
        except Exception:
            time.sleep(0.1)
    raise SystemExit(f"the daemon did not answer in 20 s:\n{log.read_text()}")


def _wait_routine_fire(api: ApiClient, timeout_s: float = 15.0) -> dict[str, Any] | None:
    """The demo Routine's schedule record once it has fired (it fires every 5 seconds)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        merged = api.request("GET", "/v1/schedules", None, dict)
        for record in merged.get("records", []):
            if record.get("id") == ROUTINE_ID and record.get("last_run_at_ms"):
                return dict(record)
        time.sleep(0.25)
    return None


def _clock(ms: int | None) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(ms / 1000)) if ms else "-"


def run_demo(folder: Path, out: Console) -> int:
    if "shell" not in {info.name for info in Plugins.load().executors()}:
        out.print("[red]the shell executor is not installed: pip install conduit-executors-shell")
        return 1
    config = folder / "conduit.toml"
    flaky = FLAKY.format(root=folder)
    python = ""
    if "python" in {info.name for info in Plugins.load().executors()}:
        (folder / "demo_functions.py").write_text(PYTHON_MODULE)
        python = PYTHON_BINDING.format(root=folder)
    config.write_text(
        CONFIG.format(port=_free_port(), flaky=flaky, python=python, routines=ROUTINES)
    )
    log = folder / "daemon.log"
    out.print(f"[bold]1.[/] config written to {escape(str(config))}")
    out.print("[bold]2.[/] starting the daemon: conduit daemon --config conduit.toml")
    with log.open("wb") as sink:
        proc = subprocess.Popen(
            _conduit("daemon", "--config", str(config), "--rescan", "0.5"),
            stdout=sink, stderr=subprocess.STDOUT, cwd=folder,
        )  # fmt: skip
    try:
        return _drive(folder, config, proc, log, out)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()


def _drive(
    folder: Path, config: Path, proc: subprocess.Popen[bytes], log: Path, out: Console
) -> int:
    port = int(config.read_text().split("127.0.0.1:")[1].split('"')[0])
    token_file = folder / "data" / "token"
    deadline = time.monotonic() + 20
    while not token_file.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    api = ApiClient(read_token(token_file), listen=f"127.0.0.1:{port}")
    _wait_ready(api, proc, log)
    out.print(f"[bold]3.[/] daemon ready on 127.0.0.1:{port}; submitting Work over HTTP")
    out.print(
        f"   web console: http://127.0.0.1:{port}/ui/ (log in with the token in "
        f"{escape(str(token_file))})"
    )
    ids = []
    submissions: list[tuple[str, dict[str, Any] | None]] = list(SUBMISSIONS)
    if "summarize" in config.read_text():
        submissions.append(PYTHON_SUBMISSION)
    for binding, payload in submissions:
        req = SubmitRequest(binding=binding, input=payload)
        ids.append(api.request("POST", "/v1/work", req, WorkDetail).work.id)
        out.print(f"   submitted {escape(ids[-1])} ({binding})")
    finished = False
    deadline = time.monotonic() + DEADLINE_S
    details: list[WorkDetail] = []
    with Live(console=out, refresh_per_second=4, transient=False) as live:
        last_seen = ""
        while time.monotonic() < deadline:
            details = [api.request("GET", f"/v1/work/{i}", None, WorkDetail) for i in ids]
            if out.is_terminal:
                live.update(_table(details))
            else:
                seen = " ".join(f"{d.work.binding}={d.work.status}" for d in details)
                if seen != last_seen:
                    out.print(f"   {seen}")
                    last_seen = seen
            if all(d.work.status.terminal for d in details):
                finished = True
                break
            time.sleep(0.25)
        live.update(_table(details))
    out.print()
    if not finished:
        late = f"the demo Work did not finish in {DEADLINE_S:g} s; daemon log: {log}"
        out.print(f"[red]{escape(late)}")
        return 1
    out.print("[bold]4.[/] all Work finished; the flaky job failed once and was retried.")
    for d in details:
        if d.work.binding == "summarize" and d.attempts and d.attempts[-1].result is not None:
            data = d.attempts[-1].result.data.get("return")
            out.print(f"   the Python function summarize returned {escape(repr(data))}")
    fired = _wait_routine_fire(api)
    if fired is None:
        out.print(f"[red]the Routine did not fire in time; daemon log: {escape(str(log))}")
        return 1
    routine = f"Routine {fired['id']} ({fired['spec']})"
    fired_at = f"{_clock(fired['last_run_at_ms'])} UTC, from the config's [[routines]]"
    out.print(f"[bold]5.[/] {escape(routine)} fired at {escape(fired_at)}")
    out.print("\n[bold]$ conduit work list[/]")
    listing = subprocess.run(
        _conduit("work", "list", "--config", str(config)), capture_output=True, text=True
    )
    print(listing.stdout.rstrip(), flush=True)
    flaky = next(d for d in details if d.work.binding == "flaky")
    out.print(f"\n[bold]$ conduit work show {escape(flaky.work.id)}[/]")
    shown = subprocess.run(
        _conduit("work", "show", flaky.work.id, "--config", str(config)),
        capture_output=True, text=True,
    )  # fmt: skip
    print(shown.stdout.rstrip(), flush=True)
    out.print("\n[bold]6.[/] stopping the daemon (SIGTERM: leases released, exit 0)")
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(15)
    out.print(f"   daemon exited with status {code}; its log: {escape(str(log))}")
    return 0 if code == 0 and all(d.work.status == "completed" for d in details) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conduit_core.demo", description=__doc__)
    parser.add_argument("--dir", type=Path, help="Use this folder (kept) instead of a temp one.")
    parser.add_argument("--keep", action="store_true", help="Keep the temporary folder.")
    args = parser.parse_args(argv)
    out = Console(highlight=False, width=None if sys.stdout.isatty() else 120)
    started = time.monotonic()
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
        code = run_demo(args.dir.resolve(), out)
    else:
        folder = Path(tempfile.mkdtemp(prefix="conduit-demo-"))
        try:
            code = run_demo(folder, out)
        finally:
            if args.keep or os.environ.get("CONDUIT_DEMO_KEEP"):
                out.print(f"kept {folder}")
            else:
                shutil.rmtree(folder, ignore_errors=True)
    out.print(f"demo {'done' if code == 0 else 'FAILED'} in {time.monotonic() - started:.1f} s")
    return code


if __name__ == "__main__":
    sys.exit(main())
