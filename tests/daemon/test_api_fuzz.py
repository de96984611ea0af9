"""A third-party API fuzzer (Schemathesis, every check) against a real daemon on SQLite, driven by
the OpenAPI document the daemon serves: no 5xx, every answer documented and conforming to its
schema, unknown methods answered 405 with ``Allow``, schema-invalid data refused, the token
required. So the document and the server cannot drift apart.

Bounded for CI (5 cases per operation and phase, and a time cap); a longer manual run with the
suite's long profile: ``HYPOTHESIS_PROFILE=long pytest tests/daemon/test_api_fuzz.py`` (200).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.conftest import Daemon

SETTINGS = Path(__file__).with_name("schemathesis.toml")
EXAMPLES = 200 if os.environ.get("HYPOTHESIS_PROFILE") == "long" else 5


@pytest.fixture
def store(tmp_path: Path) -> str:
    return str(tmp_path / "conduit.db")


def schemathesis(daemon: Daemon, document: Path, *args: str) -> subprocess.CompletedProcess[str]:
    st = Path(sys.executable).with_name("st")
    if not st.exists():
        pytest.fail(
            f"{st} is missing: schemathesis is in requirements-dev.txt (run scripts/setup.sh)"
        )
    command = [
        str(st), "--config-file", str(SETTINGS), "--no-color", "run", str(document),
        "--url", f"http://127.0.0.1:{daemon.port}",
        "--header", f"Authorization: Bearer {daemon.token}",
        "--checks", "all", "--workers", "1", "--seed", "17",
        "--generation-database", "none", "--request-timeout", "20",
        *args,
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=280, cwd=daemon.root)


def served_document(daemon: Daemon) -> dict[str, Any]:
    status, document = daemon.raw("GET", "/v1/openapi.json")
    assert status == 200
    return document


def test_the_fuzzer_finds_nothing_against_the_served_document(
    make_daemon: Callable[..., Daemon], tmp_path: Path
) -> None:
    # The fuzzer's auth checks send a wrong token to every operation, which is what the
    # wrong-token throttle refuses (429); it has its own tests (tests/daemon/test_tokens.py).
    daemon = make_daemon(settings_extra="http.wrong_token_limit = 0").start()
    served = served_document(daemon)

    # Negative control first (one operation, quick): a document whose answer drifted from what
    # is served (a Work page with a field the daemon never sends) fails the run, so the full run
    # below can fail. (GET /v1/work may answer 400 to schema-valid data: its search parameters
    # have grammars of their own, see schemathesis.toml, so a drifted `limit` would not do.)
    drifted = json.loads(json.dumps(served))
    page = drifted["components"]["schemas"]["WorkPage"]
    page["required"] = [*page.get("required", []), "drifted_field"]
    (tmp_path / "drifted.json").write_text(json.dumps(drifted))
    done = schemathesis(
        daemon, tmp_path / "drifted.json", "--max-examples", "5", "--max-time", "60",
        "--include-path", "/v1/work", "--include-method", "GET", "--phases", "coverage",
    )  # fmt: skip
    assert done.returncode != 0, done.stdout[-6000:]
    assert "drifted_field" in done.stdout

    # The document as served: every operation, every check, every phase; but drain, which
    # would take the daemon under test down (tests/daemon/test_hosts.py drains for real).
    (tmp_path / "openapi.json").write_text(json.dumps(served))
    operations = sum(len(ops) for ops in served["paths"].values()) - 1
    done = schemathesis(
        daemon, tmp_path / "openapi.json", "--max-examples", str(EXAMPLES),
        "--max-time", str(40 + 10 * EXAMPLES), "--exclude-path", "/v1/daemon/drain",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-12000:] + done.stderr[-3000:]
    assert f"Tested: {operations}" in done.stdout, done.stdout[-3000:]
    assert "Traceback" not in daemon.log()
    assert daemon.raw("GET", "/v1/health")[0] == 200
