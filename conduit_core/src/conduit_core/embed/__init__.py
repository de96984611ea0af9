"""Run the scheduler inside a Python process (docs/python.md, "Embedding the scheduler").

The same assembly ``conduit daemon`` runs (it is built on this): the host loop, recovery of
expired attempts, the takeover of a provably dead predecessor's leases, Routines, on SQLite or
PostgreSQL; submit and wait from the same process without HTTP::

    from conduit_core import embed

    async with embed.run("conduit.toml") as scheduler:
        work = await scheduler.submit("nightly-report", {"day": "2026-12-01"})
        outcome = await scheduler.wait(work.work.id, timeout=600)

    with embed.Embedded("conduit.toml") as scheduler:    # no event loop: a thread runs it
        outcome = scheduler.wait(scheduler.submit("nightly-report").work.id)

:class:`PidFile` is the dead-predecessor proof on its own: a pid file's path is all it needs.
"""

from __future__ import annotations

import os
from typing import Any

from conduit_core.config import Config, parse_config
from conduit_core.daemon import PidFile, PidRecord
from conduit_core.embed._assembly import Assembly, new_owner, take_over_dead_predecessor
from conduit_core.embed._blocking import Embedded
from conduit_core.embed._scheduler import EmbeddedScheduler

__all__ = [
    "Assembly",
    "Embedded",
    "EmbeddedScheduler",
    "PidFile",
    "PidRecord",
    "new_owner",
    "parse_config",
    "run",
    "take_over_dead_predecessor",
]


def run(config: Config | str | os.PathLike[str], **options: Any) -> EmbeddedScheduler:
    """``async with embed.run(config) as scheduler``: the scheduler runs until the block ends
    (then stops gracefully: running attempts are handed over, not killed). ``config``: a
    conduit.toml path or a :class:`~conduit_core.config.Config` (:func:`parse_config`);
    ``options``: ``owner``, ``rescan_s``, ``plugins``, ``routines`` (see
    :class:`EmbeddedScheduler`)."""
    return EmbeddedScheduler(config, **options)
