"""Console page latency on a real daemon holding many Work (all held by the human gate), and
Work search through the API with a million Work in the store (``--fill``).

    .venv/bin/python bench/bench_console.py                # 1,000 held Work, 20 requests a page
    .venv/bin/python bench/bench_console.py --work 3000 --requests 50
    .venv/bin/python bench/bench_console.py --fill 1000000 --store sqlite    # search, 1M Work
    .venv/bin/python bench/bench_console.py --fill 1000000 --store postgres

Starts ``conduit daemon`` on a fresh SQLite store in a temporary folder with the human gate
holding every Work (so nothing runs and the Needs-you page lists them all), submits ``--work``
Work over the API (1 in 100 on a second binding, for the binding filter), logs in to the console
and prints the median and max time of each page over ``--requests`` requests.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

CONFIG = """\
[settings]
data_dir = "{data}"
http.listen = "127.0.0.1:{port}"

[bindings.common]
executor = "shell"
config = {{ command = "true" }}

[bindings.rare]
executor = "shell"
config = {{ command = "true" }}
"""
RULES = '[[rules]]\nbindings = ["common", "rare"]\nreason = "bench: held"\n'
PAGES = (
    "/ui/",
    "/ui/needs-you/count",
    "/ui/work?limit=50",
    "/ui/work?limit=200",
    "/ui/work/rows?binding=rare&limit=50",
    "/ui/work/rows?status=held&limit=50",
    "/ui/capacity",
    "/ui/schedules",
)


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--fill", type=int, default=0,
                        help="search bench: fill the store with this many Work by bulk SQL")
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    args = parser.parse_args()
    if args.fill:
        from bench_console_search import run_search_bench

        run_search_bench(args.fill, args.store, args.requests)
        return
    with tempfile.TemporaryDirectory(prefix="conduit-bench-console-") as tmp:
        root = Path(tmp)
        port = _port()
        (root / "conduit.toml").write_text(CONFIG.format(data=root / "data", port=port))
        (root / "human.toml").write_text(RULES)
        env = {**os.environ, "CONDUIT_HUMAN_GATE_CONFIG": str(root / "human.toml")}
        with (root / "daemon.log").open("wb") as log:
            daemon = subprocess.Popen(
                [sys.executable, "-m", "conduit_core.cli", "daemon", "--config",
                 str(root / "conduit.toml")],
                stdout=log, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        try:
            _run(root, port, args.work, args.requests)
        finally:
            daemon.terminate()
            daemon.wait(30)


def _run(root: Path, port: int, work: int, requests: int) -> None:
    base = f"http://127.0.0.1:{port}"
    token_file = root / "data" / "token"
    deadline = time.monotonic() + 60
    while True:
        try:
            token = token_file.read_text().strip()
            api = httpx.Client(base_url=base, timeout=60,
                               headers={"Authorization": f"Bearer {token}"})  # fmt: skip
            api.get("/v1/health").raise_for_status()
            break
        except (OSError, httpx.HTTPError):
            if time.monotonic() > deadline:
                raise SystemExit(f"the daemon did not start; see {root / 'daemon.log'}") from None
            time.sleep(0.1)
    started = time.monotonic()
    for n in range(work):
        binding = "rare" if n % 100 == 0 else "common"
        api.post("/v1/work", json={"binding": binding}).raise_for_status()
    print(f"submitted {work} Work in {time.monotonic() - started:.1f} s")
    while len(api.get("/v1/needs-you").json()["items"]) < work:
        time.sleep(0.5)
    print(f"{work} held in Needs you")
    console = httpx.Client(base_url=base, timeout=60)
    assert console.post("/ui/login", data={"token": token}).status_code == 303
    for path in PAGES:
        times = []
        for _ in range(requests):
            began = time.monotonic()
            answer = console.get(path)
            times.append((time.monotonic() - began) * 1000)
            assert answer.status_code == 200, (path, answer.status_code)
        print(f"{path:40} median {statistics.median(times):7.1f} ms   max {max(times):7.1f} ms"
              f"   {len(answer.content) / 1024:7.1f} KiB")  # fmt: skip


if __name__ == "__main__":
    main()
