"""Where a daemon keeps things, resolved from its config (relative paths: the config's folder)."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from conduit_core.config import Config
from conduit_core.daemon._pidfile import PidFile, PidRecord, pid_namespace, process_identity

__all__ = [
    "DaemonPaths",
    "PidFile",
    "PidRecord",
    "default_data_dir",
    "is_postgres",
    "pid_namespace",
    "process_identity",
]


def default_data_dir(config_file: Path) -> Path:
    """A per-user state folder for one config: ``$XDG_STATE_HOME/conduit/<stem>-<digest>``.

    The digest of the config's absolute path keeps two configs with one name apart.
    """
    state_home = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    digest = hashlib.sha256(str(config_file).encode()).hexdigest()[:12]
    return Path(state_home) / "conduit" / f"{config_file.stem}-{digest}"


def is_postgres(store: str) -> bool:
    return "://" in store and urlsplit(store).scheme in ("postgresql", "postgres")


@dataclass(frozen=True)
class DaemonPaths:
    config_file: Path
    data_dir: Path
    #: The store URL to open: a resolved SQLite path (``sqlite://PATH?OPTIONS`` when the
    #: config gives options), or the PostgreSQL URL as written.
    store: str
    #: The SQLite file, or ``None`` on PostgreSQL.
    sqlite_file: Path | None
    token_file: Path
    pid_file: Path
    unix_socket: Path | None
    listen: str

    @classmethod
    def from_config(cls, config: Config) -> DaemonPaths:
        base = Path(config.source).resolve().parent
        settings = config.settings

        def resolve(value: str) -> Path:
            path = Path(os.path.expanduser(value))
            return path if path.is_absolute() else base / path

        config_file = Path(config.source).resolve()
        data_dir = (
            resolve(settings.data_dir) if settings.data_dir else default_data_dir(config_file)
        )
        store = settings.store or str(data_dir / "conduit.db")
        sqlite_file: Path | None = None
        if not is_postgres(store):
            raw = store[len("sqlite://") :] if store.startswith("sqlite://") else store
            # The options after ``?`` (``synchronous=normal``) are the store's, not the file's.
            raw, _, options = raw.partition("?") if store.startswith("sqlite://") else (raw, "", "")
            sqlite_file = resolve(raw)
            store = f"sqlite://{sqlite_file}?{options}" if options else str(sqlite_file)
        http = settings.http
        return cls(
            config_file=config_file,
            data_dir=data_dir,
            store=store,
            sqlite_file=sqlite_file,
            token_file=resolve(http.token_file) if http.token_file else data_dir / "token",
            pid_file=data_dir / "daemon.pid",
            unix_socket=resolve(http.unix_socket) if http.unix_socket else None,
            listen=http.listen,
        )

    @property
    def pidfile(self) -> PidFile:
        return PidFile(self.pid_file)

    def read_pid_file(self) -> PidRecord | None:
        return self.pidfile.read()

    def running_pid(self) -> int | None:
        """See :meth:`PidFile.running_pid`."""
        return self.pidfile.running_pid()

    def dead_predecessor(self) -> str | None:
        """See :meth:`PidFile.dead_predecessor`."""
        return self.pidfile.dead_predecessor()

    def write_pid_file(self, owner: str | None = None) -> None:
        self.pidfile.write(owner)
