"""The values of the model's enums that CLI options offer, spelled out so that declaring the
commands (and ``conduit --help``) does not import the model; tests/cli/test_cli_imports.py
checks that they match :class:`WorkKind`, :class:`WorkStatus` and :class:`MisfirePolicy`."""

from __future__ import annotations

__all__ = ["LISTED_STATES", "MISFIRE_POLICIES", "WORK_KINDS", "WORK_STATUSES"]

WORK_KINDS = ("task", "standing", "run_once")
WORK_STATUSES = ("ready", "running", "waiting", "held", "completed", "failed", "cancelled")
#: What ``work list --status`` takes: a status, or ``exhausted`` (``http._search.LISTED_STATES``).
LISTED_STATES = (*WORK_STATUSES, "exhausted")
MISFIRE_POLICIES = ("coalesce", "skip")
