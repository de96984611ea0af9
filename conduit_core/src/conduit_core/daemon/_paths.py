"""Where a daemon keeps things, resolved from its config (relative paths: the config's folder)."""

from __future__ import annotations

import hashlib
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from conduit_core.config import Config

__all__ = [
    "DaemonPaths",
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
    #: The store URL to open: a resolved SQLite path, or the PostgreSQL URL as written.
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
            sqlite_file = resolve(raw)
            store = str(sqlite_file)
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

    def read_pid_file(self) -> PidRecord | None:
        """The pid file's record, or ``None`` without a readable one."""
        try:
            return PidRecord.parse(self.pid_file.read_text())
        except (OSError, ValueError):
            return None

    def running_pid(self) -> int | None:
        """The pid in the pid file if that daemon still runs, else ``None``.

        A dead pid never counts, a zombie (killed, not yet reaped) included; nor does a live
        process that merely reuses the pid (after a reboot or wrap-around): the file records the
        process's boot id and start time, and a process that does not match them is another one.
        """
        record = self.read_pid_file()
        if record is None:
            return None
        pid = record.pid
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass  # alive, another user's: the identity below still tells
        current = process_identity(pid)
        if current is None:
            return pid  # no /proc (not Linux): liveness is all there is to go on
        if current == _GONE:
            return None
        if record.identity:
            return pid if record.identity == current else None
        # A file without an identity (an older conduit wrote it): only a conduit process counts.
        return pid if _looks_like_conduit(pid) else None

    def dead_predecessor(self) -> str | None:
        """The owner id of the daemon that last ran on this data dir, if it is provably dead.

        Proof, all from the pid file it left (a SIGKILLed daemon leaves it behind): it names
        its owner id and was written on this host (hostname), in this boot (boot id) and in
        this pid namespace, and its process is gone — no process with that pid, a zombie, or
        a process with another start time. Anything less (no file, an older file without an
        owner, another host or container, no ``/proc``) proves nothing: ``None``, and its
        leases wait for their expiry as any other owner's.
        """
        record = self.read_pid_file()
        if record is None or record.owner is None or not record.identity:
            return None
        boot = record.identity.partition(":")[0]
        if (record.host, record.pid_ns, boot) != (
            socket.gethostname(),
            pid_namespace(),
            _boot_id(),
        ):
            return None
        current = process_identity(record.pid)
        if current is None:
            return None  # cannot tell
        if current != _GONE and current == record.identity:
            return None  # it still runs
        return record.owner

    def write_pid_file(self, owner: str | None = None) -> None:
        """Record this process, with its identity (see :meth:`running_pid`) and, for
        :meth:`dead_predecessor`, its owner id, host name and pid namespace."""
        pid = os.getpid()
        identity = process_identity(pid)
        record = PidRecord(
            pid=pid,
            identity=identity if identity not in (None, _GONE) else "",
            owner=owner,
            host=socket.gethostname(),
            pid_ns=pid_namespace(),
        )
        partial = self.pid_file.with_name(self.pid_file.name + ".partial")
        partial.write_text(record.text())
        partial.replace(self.pid_file)  # never a half-written file for the next start to read


@dataclass(frozen=True)
class PidRecord:
    """What ``daemon.pid`` says: line one ``<pid> [<identity>]`` (the format older conduits
    read), then ``key value`` lines."""

    pid: int
    identity: str = ""
    owner: str | None = None
    host: str | None = None
    pid_ns: str | None = None

    @classmethod
    def parse(cls, text: str) -> PidRecord:
        first, *rest = text.strip().splitlines() or [""]
        pid_text, _, identity = first.strip().partition(" ")
        fields = dict(line.strip().partition(" ")[::2] for line in rest if line.strip())
        return cls(
            pid=int(pid_text),
            identity=identity.strip(),
            owner=fields.get("owner") or None,
            host=fields.get("host") or None,
            pid_ns=fields.get("pidns") or None,
        )

    def text(self) -> str:
        lines = [f"{self.pid} {self.identity}".rstrip()]
        for key, value in (("owner", self.owner), ("host", self.host), ("pidns", self.pid_ns)):
            if value:
                lines.append(f"{key} {value}")
        return "\n".join(lines) + "\n"


_GONE = "gone"


def _looks_like_conduit(pid: int) -> bool:
    try:
        return b"conduit" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # cannot tell: keep refusing rather than risk two daemons


def pid_namespace() -> str | None:
    """This process's pid namespace (``pid:[inode]``), ``None`` without ``/proc``: two
    containers sharing a data dir have the same boot id but pids from different namespaces."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def process_identity(pid: int) -> str | None:
    """``<boot id>:<start time in clock ticks>`` of a running process, :data:`_GONE` for a dead
    or zombie one, ``None`` where ``/proc`` cannot tell (not Linux)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except FileNotFoundError:
        return _GONE if Path("/proc/self/stat").exists() else None
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: fields resume after the last ')'.
    fields = stat[stat.rfind(")") + 2 :].split()
    if len(fields) < 20:
        return None
    if fields[0] in ("Z", "X", "x"):  # zombie or dead: it holds nothing any more
        return _GONE
    return f"{boot}:{fields[19]}"
