"""The daemon's bearer token: created once with mode 0600, refused if others can read it."""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from conduit_core.errors import ConduitError

__all__ = ["ensure_token", "read_token"]


def ensure_token(path: Path) -> str:
    """Read the token at ``path``, creating it (0600, parents 0700) on first start."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return read_token(path)
    with os.fdopen(fd, "w") as file:
        file.write(secrets.token_urlsafe(32) + "\n")
    return read_token(path)


def read_token(path: Path) -> str:
    """The token in ``path``; a file group or others may read is refused (never used)."""
    try:
        mode = path.stat().st_mode
        text = path.read_text().strip()
    except FileNotFoundError as exc:
        raise ConduitError(
            f"token file {path} does not exist: start the daemon first (`conduit daemon`)",
            code="token_missing",
        ) from exc
    except OSError as exc:
        raise ConduitError(
            f"cannot read token file {path}: {exc.strerror}", code="token_unreadable"
        ) from exc
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConduitError(
            f"token file {path} is accessible to other users (mode {stat.S_IMODE(mode):04o}); "
            f"run `chmod 600 {path}`",
            code="token_insecure",
        )
    if not text:
        raise ConduitError(
            f"token file {path} is empty; delete it and restart the daemon", code="token_unreadable"
        )
    return text
