"""Named API tokens with roles (``[[tokens]]``), and the throttle on wrong ones.

A request presents one token; the daemon knows it by its name and role only. The token itself
is compared in constant time against every known token and is never logged or stored: what a
write records as its ``actor`` is the token's name.

Roles, each including the one before: ``viewer`` reads everything; ``operator`` also acts on
Work and schedules (submit, input, inject, cancel, retry, interrupt, approve, refuse, release,
pause, resume, run now); ``admin`` also confirms stops and creates, edits or deletes schedules.
The daemon's own token file (``settings.http.token_file``) is the token named ``default``, an
``admin``, unless a ``[[tokens]]`` entry names that same file (its name and role apply then).
"""

from __future__ import annotations

import hmac
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.datastructures import Headers

from conduit_core.errors import ConduitError
from conduit_core.http._token import ensure_token, read_token

if TYPE_CHECKING:
    from conduit_core.config import Config

__all__ = [
    "DEFAULT_TOKEN_NAME",
    "ROLES",
    "LoginThrottle",
    "Principal",
    "RoleError",
    "ThrottledError",
    "TokenSet",
    "actor_of",
    "client_address",
    "load_tokens",
    "principal_of",
    "require",
    "token_files",
    "token_problems",
]

log = logging.getLogger("conduit.http")

#: Least to most allowed; each role may do what the ones before it may.
ROLES = ("viewer", "operator", "admin")
_RANK = {role: rank for rank, role in enumerate(ROLES)}
#: The name of the daemon's own token file's token.
DEFAULT_TOKEN_NAME = "default"


@dataclass(frozen=True)
class Principal:
    """Who a request's token is: its ``[[tokens]]`` name and role (never the token)."""

    name: str
    role: str

    def allows(self, needed: str) -> bool:
        return _RANK[self.role] >= _RANK[needed]


class RoleError(ConduitError):
    """The token's role may not do this (HTTP 403, code ``forbidden_role``)."""

    code = "forbidden_role"
    http_status = 403

    def __init__(self, principal: Principal, needed: str, what: str) -> None:
        super().__init__(
            f"token {principal.name!r} has role {principal.role!r}; {what} needs role "
            f"{needed!r} or above",
            code=self.code,
        )


def require(principal: Principal | None, needed: str, what: str) -> None:
    """Refuse (``forbidden_role``) unless ``principal`` has ``needed`` or a higher role.
    ``None`` (a bare app without named tokens) is allowed: its one token is the admin's."""
    if principal is not None and not principal.allows(needed):
        raise RoleError(principal, needed, what)


class TokenSet:
    """The tokens the daemon accepts, each with its principal."""

    def __init__(self, entries: Iterable[tuple[str, Principal]]) -> None:
        self._entries = [(token.encode(), principal) for token, principal in entries]
        names = [p.name for _, p in self._entries]
        if len(set(names)) != len(names):
            raise ConduitError("two tokens share a name", code="invalid_tokens")
        if len({t for t, _ in self._entries}) != len(self._entries):
            dup = [p.name for t, p in self._entries if [x for x, _ in self._entries].count(t) > 1]
            raise ConduitError(
                f"tokens {', '.join(sorted(dup))} are the same secret: give each its own",
                code="invalid_tokens",
            )

    @classmethod
    def of(cls, token: str | TokenSet) -> TokenSet:
        """A set as given, or the one token of a daemon without ``[[tokens]]`` (an admin)."""
        if isinstance(token, TokenSet):
            return token
        return cls([(token, Principal(DEFAULT_TOKEN_NAME, "admin"))])

    @property
    def principals(self) -> list[Principal]:
        return [p for _, p in self._entries]

    def identify(self, presented: str) -> Principal | None:
        """The principal of a token, compared in constant time with every known one."""
        raw = presented.encode()
        found: Principal | None = None
        for token, principal in self._entries:
            if hmac.compare_digest(raw, token):
                found = principal
        return found

    def from_headers(self, headers: Headers) -> Principal | None:
        """The principal of ``Authorization: Bearer <token>``, else ``None``."""
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme != "Bearer" or not token:
            return None
        return self.identify(token)


def principal_of(request: Any) -> Principal | None:
    """The named token of a request (the guard puts it in ``request.state``), else ``None``."""
    principal = getattr(request.state, "principal", None)
    return principal if isinstance(principal, Principal) else None


def actor_of(request: Any) -> str | None:
    """The name of the request's token: the ``actor`` its writes record."""
    principal = principal_of(request)
    return principal.name if principal is not None else None


def client_address(scope: Any) -> str:
    """The peer's address (``unix`` for the Unix socket, which has none)."""
    client = scope.get("client")
    return str(client[0]) if client else "unix"


class LoginThrottle:
    """Wrong tokens per client address: past ``limit`` in ``window`` seconds, the address is
    refused (429 with ``Retry-After``) for ``block`` seconds, doubling with each further block
    up to ``max_block``. At most ``max_clients`` addresses are remembered (least recent dropped),
    so a flood from many addresses cannot grow memory."""

    def __init__(
        self,
        *,
        limit: int = 10,
        window: float = 60.0,
        block: float = 30.0,
        max_block: float = 900.0,
        max_clients: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit, self.window, self.block, self.max_block = limit, window, block, max_block
        self.max_clients = max_clients
        self._clock = clock
        #: address -> [failures in window, window start, blocked until, blocks so far]
        self._clients: OrderedDict[str, list[float]] = OrderedDict()

    def retry_after(self, address: str) -> int | None:
        """Seconds the address must still wait, or ``None`` when it may try."""
        state = self._clients.get(address)
        if state is None:
            return None
        left = state[2] - self._clock()
        return math.ceil(left) if left > 0 else None

    def failed(self, address: str) -> None:
        now = self._clock()
        state = self._clients.pop(address, None) or [0, now, 0.0, 0]
        if now - state[1] > self.window:
            state[0], state[1] = 0, now
        state[0] += 1
        if state[0] >= self.limit:
            state[2] = now + min(self.block * 2 ** state[3], self.max_block)
            state[3] += 1
            state[0], state[1] = 0, now
            log.warning(
                "wrong tokens from %s: refused for %ds", address, math.ceil(state[2] - now)
            )
        self._clients[address] = state
        while len(self._clients) > self.max_clients:
            self._clients.popitem(last=False)

    def succeeded(self, address: str) -> None:
        self._clients.pop(address, None)

    def __len__(self) -> int:
        return len(self._clients)


class ThrottledError(ConduitError):
    """Too many wrong tokens from this address (HTTP 429 with ``Retry-After``)."""

    code = "login_throttled"
    http_status = 429

    def __init__(self, retry_after: int) -> None:
        super().__init__(
            f"too many wrong tokens from this address: try again in {retry_after} s",
            code=self.code,
        )
        self.retry_after = retry_after


def token_files(config: Config, default_file: Path) -> list[tuple[Principal, Path]]:
    """Each token's principal and file: ``[[tokens]]`` and the daemon's own token file (as
    ``default``/``admin`` unless an entry names that file). Paths resolve like the others,
    relative to the config file."""
    base = Path(config.source).resolve().parent
    out: list[tuple[Principal, Path]] = []
    for spec in config.tokens:
        path = Path(spec.file).expanduser()
        out.append((Principal(spec.name, spec.role), path if path.is_absolute() else base / path))
    if not any(_same(path, default_file) for _, path in out):
        out.insert(0, (Principal(DEFAULT_TOKEN_NAME, "admin"), default_file))
    return out


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return a == b


def token_problems(config: Config, default_file: Path) -> list[ConduitError]:
    """What would stop the daemon reading its tokens (``conduit doctor``, ``config check``):
    each ``[[tokens]]`` file that is missing, unreadable, empty or readable by others, two
    tokens with the same secret. The daemon's own token file may be missing (the daemon
    creates it at its first start)."""
    problems: list[ConduitError] = []
    entries: list[tuple[str, Principal]] = []
    for principal, path in token_files(config, default_file):
        if _same(path, default_file) and not path.exists():
            continue
        try:
            entries.append((read_token(path), principal))
        except ConduitError as exc:
            problems.append(
                ConduitError(f"token {principal.name!r}: {exc.message}", code=exc.code)
            )
    try:
        TokenSet(entries)
    except ConduitError as exc:
        problems.append(exc)
    return problems


def load_tokens(config: Config, default_file: Path) -> TokenSet:
    """Every token, read with the token file's checks (mode 0600, not empty); the daemon's own
    token file is created on first start, the ``[[tokens]]`` files must exist. A problem is a
    ``ConduitError`` naming the token and file."""
    entries: list[tuple[str, Principal]] = []
    for principal, path in token_files(config, default_file):
        try:
            token = ensure_token(path) if _same(path, default_file) else read_token(path)
        except ConduitError as exc:
            raise ConduitError(f"token {principal.name!r}: {exc.message}", code=exc.code) from exc
        entries.append((token, principal))
    return TokenSet(entries)
