"""Console sessions: the API token is exchanged once for a session cookie.

Sessions live in the daemon's memory, not in the store: nothing about a login is ever persisted,
a logout revokes at once, and a daemon restart simply asks for the token again. Each session has
its own CSRF token, which every state-changing request must echo (the cookie alone, which a
browser attaches by itself, never authorizes a write).

A session is its token's :class:`~conduit_core.http.Principal` (name and role): the
pages offer only the actions the role may take, and every action checks the role again and
records the token's name as its ``actor``.
"""

from __future__ import annotations

import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from conduit_core.http import DEFAULT_TOKEN_NAME, Principal, TokenSet

__all__ = ["ACTION_ROLES", "COOKIE", "SESSION_SECONDS", "Session", "Sessions", "action_role"]

#: The session cookie's name (HttpOnly, SameSite=Strict, Path=/ui).
COOKIE = "conduit_session"
#: A session ends this long after the login, whatever its use.
SESSION_SECONDS = 12 * 3600
#: Logins kept at once; the oldest is dropped past that (a flood of logins cannot grow memory).
MAX_SESSIONS = 256
#: The least role of each console action that needs more than ``operator``.
ACTION_ROLES = {"confirm-stopped": "admin"}


def action_role(action: str) -> str:
    """The least role that may take a console action (a Work or schedule action)."""
    return ACTION_ROLES.get(action, "operator")


@dataclass
class Session:
    id: str
    csrf: str
    expires_at: float
    #: The token the session was opened with (its name and role; never the token).
    principal: Principal = field(default_factory=lambda: Principal(DEFAULT_TOKEN_NAME, "admin"))
    #: One-shot messages for the next page (what an action did, or why it was refused).
    flashes: list[tuple[str, str]] = field(default_factory=list)

    def flash(self, kind: str, message: str) -> None:
        self.flashes.append((kind, message))

    def take_flashes(self) -> list[tuple[str, str]]:
        taken, self.flashes = self.flashes, []
        return taken

    def may(self, role: str) -> bool:
        """Whether the session's token has ``role`` or a higher one."""
        return self.principal.allows(role)

    def may_act(self, action: str) -> bool:
        """Whether the session's token may take console action ``action``."""
        return self.principal.allows(action_role(action))

    def csrf_ok(self, presented: str | None) -> bool:
        return presented is not None and hmac.compare_digest(presented.encode(), self.csrf.encode())


class Sessions:
    """The daemon's console sessions; a login must present one of ``token`` (the API token, or
    the named tokens)."""

    def __init__(
        self, token: str | TokenSet, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._tokens = TokenSet.of(token)
        self._clock = clock
        self._live: OrderedDict[str, Session] = OrderedDict()

    def login(self, presented: str) -> Session | None:
        """A new session for a known token (compared in constant time), else ``None``."""
        principal = self._tokens.identify(presented.strip())
        if principal is None:
            return None
        session = Session(
            id=secrets.token_urlsafe(32),
            csrf=secrets.token_urlsafe(32),
            expires_at=self._clock() + SESSION_SECONDS,
            principal=principal,
        )
        self._live[session.id] = session
        while len(self._live) > MAX_SESSIONS:
            self._live.popitem(last=False)
        return session

    def get(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        session = self._live.get(session_id)
        if session is None:
            return None
        if session.expires_at <= self._clock():
            del self._live[session_id]
            return None
        return session

    def logout(self, session_id: str) -> None:
        self._live.pop(session_id, None)
