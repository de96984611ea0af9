"""Where the daemon is and its token: arguments, else ``CONDUIT_URL`` / ``CONDUIT_TOKEN``,
else the conduit config file the CLI would use (``CONDUIT_CONFIG``, else ./conduit.toml)."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from conduit_core.client._errors import ConduitClientError
from conduit_core.errors import ConduitError

__all__ = ["URL_ENV", "TOKEN_ENV", "CONFIG_ENV", "Address", "resolve"]

URL_ENV = "CONDUIT_URL"
TOKEN_ENV = "CONDUIT_TOKEN"
CONFIG_ENV = "CONDUIT_CONFIG"


@dataclass(frozen=True)
class Address:
    """A TCP ``host``/``port`` or a ``unix_socket`` path."""

    host: str = "127.0.0.1"
    port: int = 8765
    unix_socket: str | None = None

    @property
    def where(self) -> str:
        return f"unix:{self.unix_socket}" if self.unix_socket else f"http://{self.host}:{self.port}"


def parse_url(url: str) -> Address:
    """``http://host:port`` or ``unix:/path/to/socket``."""
    if url.startswith("unix:"):
        path = unquote(url[len("unix:") :].removeprefix("//"))
        if not path:
            raise _config_error(f"daemon url {url!r} names no socket path")
        return Address(unix_socket=path)
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme != "http" or not parts.hostname:
        raise _config_error(
            f"daemon url {url!r} must be http://HOST:PORT or unix:/PATH (the daemon serves "
            "plain HTTP)"
        )
    try:
        port = parts.port or 80
    except ValueError:
        raise _config_error(f"daemon url {url!r} has an invalid port") from None
    return Address(host=parts.hostname, port=port)


def resolve(
    url: str | None, token: str | None, config: str | os.PathLike[str] | None
) -> tuple[Address, str]:
    """The daemon's address and token, each from the first place that has it."""
    url = url or os.environ.get(URL_ENV) or None
    token = token or os.environ.get(TOKEN_ENV) or None
    if url is not None and token is not None:
        return parse_url(url), token
    found = _from_config(config)
    if found is None:
        missing = " and ".join(
            what
            for what, value in (("address", url), ("token", token))
            if value is None
        )  # fmt: skip
        raise _config_error(
            f"no daemon {missing}: pass url=/token=, set {URL_ENV}/{TOKEN_ENV}, or point at "
            f"the daemon's config with config= or {CONFIG_ENV} (./conduit.toml does not exist)"
        )
    address, config_token = found
    return (parse_url(url) if url is not None else address), (token or config_token())


def _from_config(
    config: str | os.PathLike[str] | None,
) -> tuple[Address, Callable[[], str]] | None:
    path = Path(config) if config is not None else Path(os.environ.get(CONFIG_ENV, "conduit.toml"))
    if config is None and CONFIG_ENV not in os.environ and not path.exists():
        return None
    # The config's own loader and paths (as the CLI resolves them): imported only here.
    from conduit_core.config import load_config
    from conduit_core.daemon import DaemonPaths
    from conduit_core.http import read_token

    if not path.exists():
        raise _config_error(f"{path}: no such config file")
    try:
        paths = DaemonPaths.from_config(load_config(path))
    except ConduitError as exc:
        raise ConduitClientError(exc.message, code=exc.code) from exc
    if paths.unix_socket is not None:
        address = Address(unix_socket=str(paths.unix_socket))
    else:
        address = parse_url(paths.listen)
    token_file = paths.token_file

    def token() -> str:
        try:
            return read_token(token_file)
        except ConduitError as exc:
            raise ConduitClientError(exc.message, code=exc.code) from exc

    return address, token


def _config_error(message: str) -> ConduitClientError:
    return ConduitClientError(message, code="client_config")
