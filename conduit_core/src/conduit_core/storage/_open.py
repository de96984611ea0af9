"""``open_store``: a store from its URL, with any password masked in every message."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlsplit, urlunsplit

import anyio.to_thread

from conduit_core.errors import StoreError
from conduit_core.extension import refuse_unprovided_switches
from conduit_core.storage._contract import Store

__all__ = ["mask_url", "open_store", "open_store_sync"]


def mask_url(url: str) -> str:
    """``url`` with its password replaced by ``***``."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def open_store_sync(url: str | Path) -> Store:
    """Blocking :func:`open_store`, for scripts and worker processes."""
    refuse_unprovided_switches()
    if isinstance(url, Path):
        return _open_sqlite(url)
    masked = mask_url(url)
    scheme = urlsplit(url).scheme if "://" in url else ""
    if scheme == "sqlite":
        path, _, query = url[len("sqlite://") :].partition("?")
        if not path:
            raise StoreError(f"store URL {masked} names no file", code="invalid_store_url")
        return _open_sqlite(Path(path), **_sqlite_options(query, masked))
    if scheme in ("postgresql", "postgres"):
        try:
            from conduit_core.storage._postgres import PostgresStore
        except ImportError as exc:  # pragma: no cover - depends on the installed extra
            raise StoreError(
                f"store {masked} needs psycopg: pip install 'conduit-core[postgres]'",
                code="invalid_store_url",
            ) from exc
        return PostgresStore.open(url, masked_url=masked)
    if scheme == "" and "://" not in url:
        return _open_sqlite(Path(url))
    raise StoreError(
        f"store URL {masked} has an unknown scheme {scheme!r}; "
        "use a file path, sqlite:///path or postgresql://…",
        code="invalid_store_url",
    )


async def open_store(url: str | Path) -> Store:
    """Open the store at ``url``: a file path, ``sqlite:///path`` or ``postgresql://…``.

    Forward migrations are applied on open. Errors (``StoreError``) name the store and carry a
    code: ``invalid_store_url``, ``store_unreachable``, ``store_corrupt``, ``foreign_store``,
    ``store_schema_newer``; in each of these cases nothing was written. A test-only switch
    variable set without the test plugin installed is ``test_switch_without_test_plugin``.
    """
    return await anyio.to_thread.run_sync(open_store_sync, url)


def _open_sqlite(path: Path, **options: str) -> Store:
    from conduit_core.storage._sqlite import SqliteStore

    return SqliteStore.open(path, **options)


#: ``sqlite:///path?synchronous=normal`` trades durability on power loss (never on a process
#: crash: WAL keeps every commit of a killed process) for fewer disk syncs.
_SYNCHRONOUS = {"full": "FULL", "normal": "NORMAL"}


def _sqlite_options(query: str, masked: str) -> dict[str, str]:
    options: dict[str, str] = {}
    for key, values in parse_qs(query, keep_blank_values=True).items():
        value = values[-1].lower()
        if key != "synchronous" or value not in _SYNCHRONOUS:
            raise StoreError(
                f"store URL {masked}: unknown option {key}={values[-1]!r} "
                "(supported: synchronous=full|normal)",
                code="invalid_store_url",
            )
        options["synchronous"] = _SYNCHRONOUS[value]
    return options
