"""Refuse a SQLite store on a network filesystem: its locks do not hold across hosts."""

from __future__ import annotations

import os
from pathlib import Path

from conduit_core.errors import StoreError

__all__ = ["NETWORK_FILESYSTEMS", "check_local_filesystem", "filesystem_type"]

NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs", "nfs4", "cifs", "smb", "smb2", "smb3", "smbfs", "ncpfs", "afs", "9p",
        "ceph", "glusterfs", "lustre", "gpfs", "beegfs", "davfs", "fuse.sshfs",
        "fuse.glusterfs", "fuse.cephfs", "fuse.s3fs", "fuse.rclone", "fuse.davfs2",
    }
)  # fmt: skip


def _unescape(field: str) -> str:
    # /proc/mounts escapes space, tab, newline and backslash as octal.
    return (
        field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n")
        .replace("\\134", "\\")
    )  # fmt: skip


def filesystem_type(path: Path, mounts: str | None = None) -> str | None:
    """The type of the filesystem holding ``path`` (longest mount point that contains it)."""
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text()
        except OSError:
            return None
    target = os.path.realpath(path)
    best: tuple[int, str] | None = None
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        point = _unescape(parts[1])
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) > best[0]):
            best = (len(point), parts[2])
    return best[1] if best else None


def check_local_filesystem(sqlite_file: Path, mounts: str | None = None) -> None:
    """Raise ``StoreError`` (``store_on_network_fs``) when the file's folder is a network mount."""
    fstype = filesystem_type(sqlite_file.parent, mounts)
    if fstype is not None and (fstype in NETWORK_FILESYSTEMS or fstype.startswith("nfs")):
        raise StoreError(
            f"the SQLite store {sqlite_file} is on a network filesystem ({fstype}), where file "
            "locks do not protect it from another host; use a local disk, or a PostgreSQL store "
            '(settings.store = "postgresql://…") for daemons on several hosts',
            code="store_on_network_fs",
        )
