"""The daemon's bearer token: created once with mode 0600, refused if others can read it."""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import tempfile
from pathlib import Path

from conduit_core.errors import ConduitError

__all__ = ["ensure_token", "read_token"]


def ensure_token(path: Path) -> str:
    """Read the token at ``path``, creating it (0600, parents 0700) on first start.

    The token is written whole to a private file beside ``path`` and then hard-linked to
    ``path``, which fails if ``path`` exists: a client that reads the file as soon as it appears
    (``conduit`` commands, scripts waiting for the daemon) never sees it empty or partial, and of
    two daemons starting at once the first link wins and both serve that token."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.exists():
        return read_token(path)
    fd, partial = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as file:  # mkstemp makes it 0600
            file.write(secrets.token_urlsafe(32) + "\n")
            file.flush()
            os.fsync(file.fileno())
        try:
            os.link(partial, path)
        except FileExistsError:
            pass  # another daemon's token came first: serve that one
        except OSError:  # a file system without hard links: a rename is as whole, not exclusive
            if not path.exists():
                os.replace(partial, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(partial)
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
