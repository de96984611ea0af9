"""CPU time of one ``conduit`` command, start to exit: what a person or a script waits for.

    .venv/bin/python bench/bench_cli.py              # 15 runs of each command
    .venv/bin/python bench/bench_cli.py --runs 31

Runs the installed ``conduit`` script (the one next to this interpreter) in a temporary folder
with a fresh SQLite store, each command ``--runs`` times, and prints the median, min and max of
its user + system CPU time (the child's ``rusage``, so other load on the machine barely moves
it, unlike wall time):

- ``conduit --help``;
- ``conduit work submit BINDING`` in direct mode (no daemon: the CLI opens the store itself);
- ``conduit work list`` against a running ``conduit daemon`` (through its HTTP API);

then, against the same daemon, the wall time of ``GET /v1/work`` on one kept-alive connection
(the second and later requests: where Nagle's algorithm against the client's delayed ACK used to
add ~40 ms) and of one ``conduit_core.client.Client`` call.

Figures, not asserts: tests/cli/test_cli_imports.py keeps the heavy modules out of the
entry point, this bench says what that buys.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIG = """\
[settings]
data_dir = "{data}"
http.listen = "{listen}"

[bindings.noop]
executor = "shell"
config = {{ command = "true" }}
"""


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _conduit() -> list[str]:
    script = Path(sys.executable).parent / "conduit"
    if script.exists():
        return [str(script)]
    found = shutil.which("conduit")
    return [found] if found else [sys.executable, "-m", "conduit_core.cli"]


def cpu_of(argv: list[str], cwd: Path) -> float:
    """User + system CPU seconds of one run of ``argv`` (which must exit 0)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {done.returncode}:\n{done.stderr}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def report(name: str, argv: list[str], cwd: Path, runs: int) -> None:
    times = [cpu_of(argv, cwd) for _ in range(runs)]
    print(
        f"{name:<44} median {statistics.median(times) * 1000:6.0f} ms CPU"
        f"   (min {min(times) * 1000:.0f}, max {max(times) * 1000:.0f}, {runs} runs)",
        flush=True,
    )


def keep_alive(root: Path, listen: str, requests: int = 30) -> None:
    """Wall ms of requests 2..N on one kept-alive connection, and of one Client call."""
    import http.client

    from conduit_core.client import Client

    token = (root / "data" / "token").read_text().strip()
    host, _, port = listen.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port))
    times = []
    for _ in range(requests):
        t0 = time.perf_counter()
        conn.request("GET", "/v1/work?limit=1", headers={"Authorization": f"Bearer {token}"})
        conn.getresponse().read()
        times.append((time.perf_counter() - t0) * 1000)
    conn.close()
    print(f"{'GET /v1/work, kept-alive, 2nd..' + str(requests) + 'th':<44} median "
          f"{statistics.median(times[1:]):6.1f} ms wall (first {times[0]:.1f})")  # fmt: skip
    with Client(f"http://{listen}", token=token) as client:
        client.list(limit=1)
        t0 = time.perf_counter()
        for _ in range(requests):
            client.list(limit=1)
        per = (time.perf_counter() - t0) / requests * 1000
    print(f"{'Client.list(limit=1), one client':<44} mean   {per:6.1f} ms wall", flush=True)


def _wait_for_daemon(
    root: Path, conduit: list[str], config: Path, daemon: subprocess.Popen[bytes]
) -> None:
    deadline = time.monotonic() + 60
    while True:
        if daemon.poll() is not None:
            raise SystemExit(f"the daemon exited; see {root / 'daemon.log'}")
        done = subprocess.run([*conduit, "capacity", "--config", str(config)], cwd=root,
                              capture_output=True, text=True)  # fmt: skip
        if done.returncode == 0 and (root / "data" / "token").exists():
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"the daemon did not start; see {root / 'daemon.log'}")
        time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    conduit = _conduit()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, command: {' '.join(conduit)}")
    with tempfile.TemporaryDirectory(prefix="conduit-bench-cli-") as tmp:
        root = Path(tmp)
        config = root / "conduit.toml"
        listen = f"127.0.0.1:{_port()}"
        config.write_text(CONFIG.format(data=root / "data", listen=listen))
        cfg = ["--config", str(config)]
        report("conduit --help", [*conduit, "--help"], root, args.runs)
        submit = [*conduit, "work", "submit", "noop", *cfg]
        report("conduit work submit (direct, no daemon)", submit, root, args.runs)
        with (root / "daemon.log").open("wb") as log:
            daemon = subprocess.Popen([*conduit, "daemon", *cfg], cwd=root, stdout=log,
                                      stderr=subprocess.STDOUT)  # fmt: skip
        try:
            _wait_for_daemon(root, conduit, config, daemon)
            report("conduit work list (running daemon)", [*conduit, "work", "list", *cfg], root,
                   args.runs)  # fmt: skip
            keep_alive(root, listen)
        finally:
            daemon.terminate()
            daemon.wait(30)


if __name__ == "__main__":
    main()
