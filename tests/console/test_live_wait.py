"""The browser tests' wait looks again when a refresh replaced a node, and fails on the rest."""

from __future__ import annotations

import pytest
from selenium.common import exceptions as selenium_exceptions

INSPECTOR = (
    'unknown error: unhandled inspector error: {"code":-32000,"message":"Node with given id '
    'does not belong to the document"}'
)


def test_a_replaced_node_is_looked_for_again_and_another_error_fails_at_once() -> None:
    from tests.console._live import live_wait

    calls: list[int] = []

    def flaky(_driver: object) -> bool:
        calls.append(1)
        if len(calls) == 1:
            raise selenium_exceptions.WebDriverException(INSPECTOR)
        if len(calls) == 2:
            raise selenium_exceptions.StaleElementReferenceException("stale element reference")
        return True

    assert live_wait(object(), timeout=5).until(flaky) is True
    assert len(calls) == 3

    def broken(_driver: object) -> bool:
        raise selenium_exceptions.WebDriverException("chrome not reachable")

    with pytest.raises(selenium_exceptions.WebDriverException, match="chrome not reachable"):
        live_wait(object(), timeout=5).until(broken)
