"""The client's exceptions: one hierarchy, each carrying the API's stable ``code``."""

from __future__ import annotations

from conduit_core.errors import ConduitError

__all__ = [
    "Conflict",
    "ConduitClientError",
    "DaemonUnavailable",
    "InvalidRequest",
    "NotFound",
    "Unauthorized",
    "WaitTimeout",
    "error_for",
]


class ConduitClientError(ConduitError):
    """A call the daemon refused, or that could not reach it.

    ``code`` is the API's stable code (``unknown_binding``, ``not_found``, …; see
    docs/http.md), ``message`` its text for people, ``status`` the HTTP status (0 when no
    answer came).
    """

    code = "client_error"

    def __init__(self, message: str, *, code: str | None = None, status: int = 0) -> None:
        super().__init__(message, code=code)
        self.status = status

    def __str__(self) -> str:
        return f"{self.message} [{self.code}]"


class InvalidRequest(ConduitClientError):
    """400 and 422: a bad body or query, an unknown binding or scope, a body too large."""


class Unauthorized(ConduitClientError):
    """401: no token or a wrong one."""


class NotFound(ConduitClientError):
    """404: an unknown Work id."""


class Conflict(ConduitClientError):
    """409: the Work's state does not allow it (``not_eligible``, ``work_exists``, …)."""


class DaemonUnavailable(ConduitClientError):
    """503 (store unreachable, daemon stopping) or no answer at all (``daemon_unreachable``)."""


class WaitTimeout(ConduitClientError):
    """``wait`` gave up: the Work was not finished at the deadline (``wait_timeout``)."""


_BY_STATUS: dict[int, type[ConduitClientError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    404: NotFound,
    409: Conflict,
    413: InvalidRequest,
    422: InvalidRequest,
    503: DaemonUnavailable,
}


def error_for(status: int, message: str, code: str) -> ConduitClientError:
    """The exception for an answer with this HTTP status and stable code."""
    return _BY_STATUS.get(status, ConduitClientError)(message, code=code, status=status)
