"""Test-only switches that each remove one protection, so a race detector can show that it
fails without it (its negative control). Never set in production.

``CONDUIT_TEST_UNSAFE`` is a comma-separated list, read once when a process imports the store
(spawned racers and daemon subprocesses inherit it through their environment):

- ``capacity_check``: a claim never refuses for capacity (slots are counted, never enforced).
- ``capacity_lock``: on PostgreSQL a claim does not lock the capacity rows it counts, so two
  claimers may both count the same free slot (SQLite has one writer by nature: no effect).
"""

from __future__ import annotations

import os

__all__ = ["UNSAFE", "unsafe"]

UNSAFE = frozenset(s.strip() for s in os.environ.get("CONDUIT_TEST_UNSAFE", "").split(",") if s)


def unsafe(protection: str) -> bool:
    """Whether a test switched ``protection`` off in this process."""
    return protection in UNSAFE
