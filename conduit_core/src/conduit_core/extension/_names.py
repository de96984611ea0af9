"""File-system names for executions, shared by executors that keep files per attempt."""

from __future__ import annotations

import hashlib
import re

__all__ = ["execution_dir_name"]

# 128 bits of sha256: a collision between two execution ids is out of reach, and the name stays
# short enough for any file system.
_DIGEST_HEX_CHARS = 32
_PREFIX_CHARS = 40
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def execution_dir_name(execution_id: str) -> str:
    """``<prefix>-<digest>``: a directory name for an execution id, injective and always safe.

    Sanitizing alone collides (``k:0`` and ``k_0``), so the name carries the first 32 hex digits
    of the sha256 of the exact id; the prefix (the id's first 40 characters, everything but
    ``A-Z a-z 0-9 _ -`` replaced by ``_``) only helps a person find it, and can never name a path
    outside its parent.
    """
    digest = hashlib.sha256(execution_id.encode("utf-8", "surrogatepass")).hexdigest()
    prefix = _UNSAFE.sub("_", execution_id)[:_PREFIX_CHARS]
    return f"{prefix}-{digest[:_DIGEST_HEX_CHARS]}"
