"""Ready Work this daemon cannot start never holds up the Work it can (issue 32).

A claim reads only as many of the oldest ready rows as it has free slots. Where every binding
of the daemon counts against one pool, that read took Work of any binding, so when the oldest
ready Work were of a binding the daemon lacks (removed from its config with Work still queued,
or added to another daemon's config first), every pass read those, could not pin them ("cannot
be pinned: unknown binding", twice a second in the log) and started nothing else: every other
Work waited for ever. The read now takes only the bindings the daemon starts, as it already did
with more than one pool, and such a Work says why it waits (``unknown_binding``).

A real daemon on either store, with one pool for its bindings; the Work of the binding it lacks
are written into the store before it starts, as a daemon whose config had the binding left them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio

from conduit_core.model import Event, Work
from conduit_core.storage import open_store
from tests.daemon.conftest import Daemon

#: Every binding a shell binding: the daemon's one pool, ``jobs``.
CONFIG = """\
[settings]
store = "{store}"
data_dir = "{data}"
job_concurrency = 2
http.listen = "127.0.0.1:{port}"

[bindings.ok]
executor = "shell"
config = {{ command = 'echo "$CONDUIT_WORK_ID run" >> {side}' }}
"""

LEFT = 6  # more than the daemon's free slots


async def _leave_work_of_a_retired_binding(store: str) -> list[str]:
    async with await open_store(store) as opened:
        items = []
        for n in range(LEFT):
            work_id = f"retired-{n}"
            now = 1_700_000_000_000 + n  # older than anything submitted today
            work = Work(id=work_id, scope="root", binding="retired", created_at_ms=now,
                        updated_at_ms=now)  # fmt: skip
            first = Event(id=f"{work_id}/in", delivery_id=f"{work_id}/in", type="core.input",
                          work_id=work_id, scope="root", pending=True, accepted_at_ms=now)  # fmt: skip
            items.append((work, first))
        stored = await opened.create_works(items)
    assert all(isinstance(w, Work) for w in stored), stored
    return [work.id for work, _ in items]


def test_work_of_a_binding_the_daemon_lacks_never_holds_up_its_own(
    make_daemon: Callable[..., Daemon], store: str
) -> None:
    retired = anyio.run(_leave_work_of_a_retired_binding, store)
    daemon = make_daemon()
    daemon.config.write_text(
        CONFIG.format(store=store, data=daemon.data, port=daemon.port, side=daemon.side)
    )
    daemon.start()
    mine = [daemon.submit("ok") for _ in range(4)]
    for work_id in mine:
        daemon.wait_status(work_id, "completed", timeout=20)
    assert daemon.runs(mine[0]) == 1
    # The Work it lacks the binding of stays ready, untouched, and says why.
    for work_id in retired:
        shown: Any = daemon.show(work_id)
        assert str(shown.work.status) == "ready", work_id
        assert not shown.attempts, work_id
        assert shown.waiting is not None, work_id
        assert shown.waiting.code == "unknown_binding", shown.waiting
        assert "'retired' is not in this daemon's config" in shown.waiting.message
    assert "cannot be pinned" not in daemon.log()
