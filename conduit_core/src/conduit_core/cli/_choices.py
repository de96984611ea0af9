"""The values of the model's enums that CLI options offer, spelled out so that declaring the
commands (and ``conduit --help``) does not import the model; tests/cli/test_cli_imports.py
checks that they match :class:`WorkKind`, :class:`WorkStatus` and :class:`MisfirePolicy`."""

from __future__ import annotations

__all__ = ["MISFIRE_POLICIES", "WORK_KINDS", "WORK_STATUSES"]

WORK_KINDS = ("task", "standing", "run_once")
WORK_STATUSES = ("ready", "running", "waiting", "held", "completed", "failed", "cancelled")
MISFIRE_POLICIES = ("coalesce", "skip")
