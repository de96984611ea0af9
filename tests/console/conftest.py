"""A real daemon (SQLite store) per test, and a console client that logs in like a browser.

The console does not depend on the store's backend (its pages call the same service layer as the
API, which the daemon and storage suites run on both backends), so these tests use SQLite only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.daemon.conftest import Daemon, _kill_jobs_under

#: Extra bindings and scopes of the console's tests (appended to tests/daemon's config).
CONSOLE_EXTRA = """
[scopes.test-env]

[bindings.envjob]
executor = "shell"
scope = "test-env"
config = {{ command = 'test -n "$CONDUIT_TEST_ENV" && touch {root}/env.seen; echo envjob done' }}

[bindings.loud]
executor = "shell"
config = {{ command = 'printf "%s\\n" "<img src=x onerror=alert(1)>" "<script>alert(2)</script>"; echo "&amp; <b>bold</b>" >&2' }}

[bindings.deploy]
executor = "shell"
config = {{ command = 'echo "$CONDUIT_WORK_ID run" >> {side}' }}
"""

#: The human gate holds Work of binding ``deploy``; its reason carries markup on purpose.
GATE_RULES = '[[rules]]\nbindings = ["deploy"]\nreason = "deploys need a person <b>now</b>"\n'

_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


class Console:
    """An HTTP client of the console, holding its session cookie as a browser would."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.http = httpx.Client(
            base_url=f"http://127.0.0.1:{daemon.port}", follow_redirects=False, timeout=15
        )

    def close(self) -> None:
        self.http.close()

    def login(self, token: str | None = None) -> httpx.Response:
        return self.http.post("/ui/login", data={"token": token or self.daemon.token})

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return self.http.get(path, **kwargs)

    def csrf(self, path: str = "/ui/") -> str:
        page = self.get(path)
        assert page.status_code == 200, page.text
        found = _CSRF.search(page.text)
        assert found, "no CSRF token on the page"
        return found.group(1)

    def post(
        self, path: str, data: dict[str, str] | None = None, *, csrf: str | None = "page",
        **kwargs: Any,
    ) -> httpx.Response:  # fmt: skip
        fields = dict(data or {})
        if csrf == "page":
            fields["csrf"] = self.csrf()
        elif csrf is not None:
            fields["csrf"] = csrf
        return self.http.post(path, data=fields, **kwargs)


@pytest.fixture
def console_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., Daemon]]:
    """Start a daemon (human gate on ``deploy``); ``env`` adds variables to its environment."""
    rules = tmp_path / "human.toml"
    rules.write_text(GATE_RULES)
    monkeypatch.setenv("CONDUIT_HUMAN_GATE_CONFIG", str(rules))
    made: list[Daemon] = []

    def start(env: dict[str, str] | None = None, more: str = "", **settings: Any) -> Daemon:
        """``more``: further config (bindings, budgets) after the console's own."""
        extra = CONSOLE_EXTRA.format(root=tmp_path, side=tmp_path / "side-effects.log") + more
        daemon = Daemon(tmp_path, str(tmp_path / "conduit.db"), extra=extra, **settings)
        made.append(daemon)
        return daemon.start(env=env)

    yield start
    for daemon in made:
        daemon.kill()
    _kill_jobs_under(tmp_path)


@pytest.fixture
def console(console_daemon: Callable[..., Daemon]) -> Iterator[Console]:
    """A running daemon and a console client that is not logged in yet."""
    client = Console(console_daemon())
    yield client
    client.close()
