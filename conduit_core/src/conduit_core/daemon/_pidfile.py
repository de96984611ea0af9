"""The pid file a scheduler leaves in its data dir, and the proof that its process is dead.

:class:`PidFile` needs only the file's path, not a daemon config: ``conduit daemon`` and every
process that embeds the scheduler (:mod:`conduit_core.embed`) use it alike. The proof lets a
successor take over a predecessor's leases at once instead of waiting for their expiry.
"""

from __future__ import annotations

import contextlib
import os
import socket
from dataclasses import dataclass
from pathlib import Path

__all__ = ["PidFile", "PidRecord", "pid_namespace", "process_identity"]


@dataclass(frozen=True)
class PidFile:
    """One pid file: ``daemon.pid`` in a data dir (:meth:`in_dir`), or any path."""

    path: Path

    @classmethod
    def in_dir(cls, data_dir: Path) -> PidFile:
        return cls(Path(data_dir) / "daemon.pid")

    def read(self) -> PidRecord | None:
        """The file's record, or ``None`` without a readable one."""
        try:
            return PidRecord.parse(self.path.read_text())
        except (OSError, ValueError):
            return None

    def running_pid(self) -> int | None:
        """The pid in the pid file if that daemon still runs, else ``None``.

        A dead pid never counts, a zombie (killed, not yet reaped) included; nor does a live
        process that merely reuses the pid (after a reboot or wrap-around): the file records the
        process's boot id and start time, and a process that does not match them is another one.
        """
        record = self.read()
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
        record = self.read()
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

    def serves_http(self) -> bool:
        """Whether the recorded process answers the HTTP API (a daemon does; a process that
        embeds the scheduler does not, and the CLI then works on the store directly). A file
        that does not say (an older conduit's) was a daemon's."""
        record = self.read()
        return record is None or record.http

    def write(self, owner: str | None = None, *, http: bool = True) -> None:
        """Record this process, with its identity (see :meth:`running_pid`) and, for
        :meth:`dead_predecessor`, its owner id, host name and pid namespace; ``http``: whether
        it serves the HTTP API."""
        pid = os.getpid()
        identity = process_identity(pid)
        record = PidRecord(
            pid=pid,
            identity=identity if identity not in (None, _GONE) else "",
            owner=owner,
            host=socket.gethostname(),
            pid_ns=pid_namespace(),
            http=http,
        )
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text(record.text())
        partial.replace(self.path)  # never a half-written file for the next start to read

    def remove(self) -> None:
        """Remove the file (a graceful stop: nothing is left to take over)."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


@dataclass(frozen=True)
class PidRecord:
    """What ``daemon.pid`` says: line one ``<pid> [<identity>]`` (the format older conduits
    read), then ``key value`` lines."""

    pid: int
    identity: str = ""
    owner: str | None = None
    host: str | None = None
    pid_ns: str | None = None
    #: Serves the HTTP API (written ``http no`` only when not: older files are daemons').
    http: bool = True

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
            http=fields.get("http") != "no",
        )

    def text(self) -> str:
        lines = [f"{self.pid} {self.identity}".rstrip()]
        for key, value in (("owner", self.owner), ("host", self.host), ("pidns", self.pid_ns)):
            if value:
                lines.append(f"{key} {value}")
        if not self.http:
            lines.append("http no")
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
