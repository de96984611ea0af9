"""A Work's history and its page's live part on a real daemon, for one standing Work with many
inputs (each input an event; the attempts they start add their segments and phases).

    .venv/bin/python bench/bench_history.py                 # 1,000 inputs, 20 requests each
    .venv/bin/python bench/bench_history.py --inputs 5000 --requests 50

The history is built on every request from the Work's events and attempts (nothing is kept
twice), so its cost grows with them: this prints the median and max time of
``GET /v1/work/{id}/history`` (a page of 100, both orders) and of the Work page's live part
(``/ui/work/{id}/live``, polled every 2 s while the page is open), beside ``GET /v1/work/{id}``
(the attempts alone, which the page showed before it had a history).
"""

from __future__ import annotations

import argparse
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

[bindings.job]
executor = "shell"
config = {{ command = "true" }}
"""


def main() -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_console import _port

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="conduit-bench-history-") as tmp:
        root = Path(tmp)
        port = _port()
        (root / "conduit.toml").write_text(CONFIG.format(data=root / "data", port=port))
        with (root / "daemon.log").open("wb") as log:
            daemon = subprocess.Popen(
                [sys.executable, "-m", "conduit_core.cli", "daemon", "--config",
                 str(root / "conduit.toml")],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:
            _run(root, port, args.inputs, args.requests)
        finally:
            daemon.terminate()
            daemon.wait(30)


def _run(root: Path, port: int, inputs: int, requests: int) -> None:
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            token = (root / "data" / "token").read_text().strip()
            api = httpx.Client(base_url=base, timeout=60,
                               headers={"Authorization": f"Bearer {token}"})  # fmt: skip
            api.get("/v1/health").raise_for_status()
            break
        except (OSError, httpx.HTTPError):
            if time.monotonic() > deadline:
                raise SystemExit(f"the daemon did not start; see {root / 'daemon.log'}") from None
            time.sleep(0.1)
    work = api.post("/v1/work", json={"binding": "job", "kind": "standing"}).json()["work"]["id"]
    for n in range(inputs):
        api.post(f"/v1/work/{work}/input", json={"payload": {"n": n}}).raise_for_status()
    while api.get(f"/v1/work/{work}").json()["work"]["pending_inputs"] > 0:
        time.sleep(0.2)
    total = api.get(f"/v1/work/{work}/history?limit=1").json()["total"]
    attempts = api.get(f"/v1/work/{work}").json()["work"]["last_attempt"]
    print(f"{inputs} inputs, {attempts} attempts: {total} history entries")
    console = httpx.Client(base_url=base, timeout=60)
    assert console.post("/ui/login", data={"token": token}).status_code == 303
    for client, path in ((api, f"/v1/work/{work}"),  # what the page read before the history
                         (api, f"/v1/work/{work}/history?limit=100"),
                         (api, f"/v1/work/{work}/history?limit=100&order=newest"),
                         (console, f"/ui/work/{work}/live")):  # fmt: skip
        times = []
        for _ in range(requests):
            began = time.monotonic()
            answer = client.get(path)
            times.append((time.monotonic() - began) * 1000)
            assert answer.status_code == 200, (path, answer.status_code)
        shown = path.replace(work, "ID")
        print(f"{shown:45} median {statistics.median(times):7.1f} ms   max {max(times):7.1f} ms")


if __name__ == "__main__":
    main()
