"""``open_store``: a store from its URL, with any password masked in every message."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import anyio.to_thread

from conduit_core.errors import StoreError
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
    if isinstance(url, Path):
        return _open_sqlite(url)
    masked = mask_url(url)
    scheme = urlsplit(url).scheme if "://" in url else ""
    if scheme == "sqlite":
        path = url[len("sqlite://") :]
        if not path:
            raise StoreError(f"store URL {masked} names no file", code="invalid_store_url")
        return _open_sqlite(Path(path))
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
    ``store_schema_newer``; in each of these cases nothing was written.
    """
    return await anyio.to_thread.run_sync(open_store_sync, url)


def _open_sqlite(path: Path) -> Store:
    from conduit_core.storage._sqlite import SqliteStore

    return SqliteStore.open(path)
