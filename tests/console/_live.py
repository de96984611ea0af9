"""Waiting on a console page that refreshes its parts while a test reads them.

The console swaps parts of a page on a poll (htmx). A node a test found may be replaced before
it reads it. Chromium's driver says so either as a stale reference or, at times, as a plain
``WebDriverException``: "unhandled inspector error: Node with given id does not belong to the
document" (seen failing CI runs in two browser tests). Both mean "look again", so every wait of
the browser tests goes through :func:`live_wait`, which retries on either and fails on anything
else. Imported by the tests that have a browser (selenium is imported here, at use).
"""

from __future__ import annotations

from typing import Any

from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.support.ui import WebDriverWait

__all__ = ["NodeReplacedError", "live_wait", "replaced"]

NodeReplacedError = StaleElementReferenceException


def replaced(exc: WebDriverException) -> bool:
    """Whether ``exc`` says the node read was replaced (look again), not a real failure."""
    return isinstance(exc, StaleElementReferenceException) or (
        "does not belong to the document" in str(exc.msg)
    )


class _LiveWait(WebDriverWait):
    def until(self, method: Any, message: str = "") -> Any:
        def looked_again(driver: Any) -> Any:
            try:
                return method(driver)
            except WebDriverException as exc:
                if replaced(exc):
                    return False
                raise

        return super().until(looked_again, message)


def live_wait(driver: Any, timeout: float = 30) -> WebDriverWait:
    """A wait polling every 0.1 s that looks again when a refresh replaced what it read."""
    return _LiveWait(driver, timeout, poll_frequency=0.1)
