"""A SQLite store URL's options in conduit.toml reach the store the daemon opens.

``store = "sqlite:///path/conduit.db?synchronous=normal"`` used to open a file named
``conduit.db?synchronous=normal`` beside the intended one, with the default (full) syncs.
"""

from __future__ import annotations

from pathlib import Path

from conduit_core.config import parse_config
from conduit_core.daemon._paths import DaemonPaths
from conduit_core.storage import open_store_sync
from conduit_core.storage._sqlite import SqliteStore


def _paths(tmp_path: Path, store: str) -> DaemonPaths:
    config = parse_config(f'[settings]\nstore = "{store}"\n', source=str(tmp_path / "c.toml"))
    return DaemonPaths.from_config(config)


def _synchronous(paths: DaemonPaths) -> int:
    store = open_store_sync(paths.store)
    try:
        assert isinstance(store, SqliteStore)
        return int(store._conn.execute("PRAGMA synchronous").fetchone()[0])
    finally:
        store.close()


def test_sqlite_url_options_reach_the_store_and_the_file_is_the_path(tmp_path: Path) -> None:
    paths = _paths(tmp_path, f"sqlite://{tmp_path}/conduit.db?synchronous=normal")
    assert paths.sqlite_file == tmp_path / "conduit.db"
    assert _synchronous(paths) == 1  # NORMAL
    assert sorted(p.name for p in tmp_path.glob("conduit.db*"))[0] == "conduit.db"
    assert not list(tmp_path.glob("*synchronous*"))


def test_a_relative_sqlite_url_with_options_resolves_beside_the_config(tmp_path: Path) -> None:
    paths = _paths(tmp_path, "sqlite://data/c.db?synchronous=normal")
    assert paths.sqlite_file == tmp_path / "data" / "c.db"
    assert paths.store == f"sqlite://{tmp_path / 'data' / 'c.db'}?synchronous=normal"


def test_without_options_the_store_is_the_resolved_path(tmp_path: Path) -> None:
    paths = _paths(tmp_path, "sqlite://c.db")
    assert paths.store == str(tmp_path / "c.db")
    assert _synchronous(paths) == 2  # FULL, the default
