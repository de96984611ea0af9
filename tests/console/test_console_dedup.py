"""The console's Work page shows a keyed Work's key and, while debounced, when it starts."""

from __future__ import annotations

from collections.abc import Callable

from tests.console.conftest import Console
from tests.daemon.conftest import Daemon


def test_a_debounced_work_page_names_its_key_and_its_start(
    console_daemon: Callable[..., Daemon],
) -> None:
    console = Console(console_daemon())
    try:
        assert console.login().status_code in (302, 303)
        daemon = console.daemon
        work = daemon.submit("ok", debounce={"key": "reindex-docs", "quiet": "1h"})
        page = console.get(f"/ui/work/{work}")
        assert page.status_code == 200, page.text
        assert '<b id="work-dedup-key">reindex-docs</b>' in page.text
        assert "debounced until" in page.text
        assert "<code class=\"code\">debounced</code>" in page.text
    finally:
        console.close()
