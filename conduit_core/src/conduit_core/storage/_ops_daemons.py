"""The daemon registry: one row per daemon start, written by the daemon itself."""

from __future__ import annotations

from conduit_core.model import DaemonRecord
from conduit_core.storage._sql import Codec, Cx, dump

#: A registry row not written for this long is dropped at the next daemon's write (a stopped or
#: lost daemon stays listed for a week).
FORGET_AFTER_MS = 7 * 24 * 3600 * 1000


def record_daemon(cx: Cx, daemon: DaemonRecord) -> None:
    cx.run(
        "INSERT INTO conduit_daemon (id, last_seen, data) VALUES (?, ?, ?) "
        "ON CONFLICT (id) DO UPDATE SET last_seen = excluded.last_seen, data = excluded.data",
        (daemon.id, daemon.last_seen_ms, dump(daemon)),
    )
    cx.run(
        "DELETE FROM conduit_daemon WHERE last_seen < ?", (daemon.last_seen_ms - FORGET_AFTER_MS,)
    )


def list_daemons(cx: Cx) -> list[DaemonRecord]:
    rows = cx.rows("SELECT data FROM conduit_daemon ORDER BY id")
    return [Codec.daemon.decode(r[0]) for r in rows]
