"""docs/python.md's ten-minute path, run as written: its blocks are extracted from the page (so
the page cannot rot) and run against a real daemon, a real python-executor job and a Routine.

Two things differ from a reader's run, both asserted: the install step is not run (the test venv
is what ``scripts/setup.sh`` installs, the same three distributions; tests/core/test_setup_script.py
covers it), and the daemon listens on a free port instead of the page's 8765.
"""

from __future__ import annotations

import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conduit_core.client import Client, WorkView
from tests.daemon.conftest import _kill_jobs_under, free_port, wait_for

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "python.md"
_BLOCK = re.compile(r"<!-- ten-minutes: (\S+) -->\n```\w*\n(.*?)```", re.S)


def _blocks() -> dict[str, str]:
    return dict(_BLOCK.findall(DOC.read_text()))


def test_the_page_holds_the_steps_this_test_runs() -> None:
    blocks = _blocks()
    assert set(blocks) == {"jobs.py", "conduit.toml", "submit.py", "commands", "embedding.py"}
    text = DOC.read_text()
    install = "pip install ./conduit_core ./conduit_executors_shell ./conduit_executors_python"
    assert install in text
    for dist in ("conduit_core", "conduit_executors_shell", "conduit_executors_python"):
        assert (REPO / dist / "pyproject.toml").exists(), dist


def _routine_run(client: Client) -> WorkView | None:
    for work in client.list(binding="nightly").items:
        if work.scheduled_by != "manual" and work.status == "completed":
            return work
    return None


def test_the_ten_minute_path_runs_as_written(tmp_path: Path) -> None:
    blocks = _blocks()
    port = free_port()
    config = blocks["conduit.toml"]
    assert 'http.listen = "127.0.0.1:8765"' in config
    (tmp_path / "conduit.toml").write_text(config.replace(":8765", f":{port}"))
    (tmp_path / "jobs.py").write_text(blocks["jobs.py"])
    (tmp_path / "submit.py").write_text(blocks["submit.py"])
    venv_bin = str(Path(sys.executable).parent) + "/"
    daemon: subprocess.Popen[bytes] | None = None
    outputs: list[str] = []
    try:
        for line in blocks["commands"].strip().splitlines():
            assert line.startswith(".venv/bin/"), line
            argv = shlex.split(line.replace(".venv/bin/", venv_bin, 1).removesuffix("&"))
            if line.endswith("&"):
                with (tmp_path / "daemon.log").open("wb") as log:
                    daemon = subprocess.Popen(argv, cwd=tmp_path, stdout=log, stderr=log)
                wait_for("the daemon to answer", lambda: _healthy(tmp_path), timeout=60)
                continue
            done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
            outputs.append(done.stdout)
            if "routines run" in line:  # fired now: wait for its run before listing
                with Client(config=tmp_path / "conduit.toml") as client:
                    fired = wait_for("the Routine's run", lambda: _routine_run(client), 60)
                    outcome = client.wait(fired.id, timeout=30)
                assert outcome.raw_data["return"] == {"day": "from-the-routine", "rows": 10}
        assert daemon is not None, "the page starts a daemon"
        submitted = [out for out in outputs if out.startswith("completed")]
        assert submitted == ["completed 2026-12-01 42\n"]  # what the page says it prints
        assert "nightly" in outputs[-1]  # `work list`: the submitted run and the Routine's
        # "Embedding the scheduler": the same files, the daemon stopped first.
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=60) == 0
        (tmp_path / "embedding.py").write_text(blocks["embedding.py"])
        done = subprocess.run([sys.executable, "embedding.py"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines() == [
            "completed {'day': '2026-12-01', 'rows': 42}", "completed",
        ]  # fmt: skip
    finally:
        if daemon is not None and daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            try:
                daemon.wait(timeout=30)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        _kill_jobs_under(tmp_path)


def _healthy(root: Path) -> bool:
    try:
        with Client(config=root / "conduit.toml", timeout=2) as client:
            return client.health()["status"] == "ok"
    except Exception:
        return False


@pytest.fixture(autouse=True)
def _no_inherited_client_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # The page's client finds the daemon from conduit.toml: nothing in the environment may win.
    for name in ("CONDUIT_URL", "CONDUIT_TOKEN", "CONDUIT_CONFIG"):
        monkeypatch.delenv(name, raising=False)
