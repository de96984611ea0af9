"""A claim reads as much of a limited scope's ready Work as the scope has room for.

Sized by the pool alone, a claim read (and locked, ``FOR UPDATE SKIP LOCKED``) three rows of a
scope with room for one: it took one, refused two, and a second claimer at the same moment found
those rows locked and nothing left to take (the two-daemon scope control missed the race it
looks for in 4 of 20 runs). The slices ``capacity_sized`` gives: the pool's read outside every
limited scope, and a read per limited scope sized by its room. The race itself is
tests/daemon/test_capacity_daemons.py's scope control (bench/race_controls.py --daemons).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from conduit_core.storage import CapacityLimits
from conduit_core.storage._ops_work import Slots
from conduit_core.storage._ready_reads import ReadySlice, capacity_sized

LIMITS = CapacityLimits(
    global_limit=8,
    scope_limits={"team": 2, "squad": 3},
    scope_parents={"team": "root", "squad": "team", "ops": "root", "free": "root"},
)


def _slots(in_use: dict[str, int]) -> Slots:
    cx: Any = SimpleNamespace(locks_rows=False)
    slots = Slots(cx, LIMITS, lock=False)
    for scope, n in in_use.items():
        slots.take(None, scope, n)
    return slots


def test_a_limited_scope_is_read_only_as_far_as_it_has_room() -> None:
    sliced = capacity_sized(_slots({"squad": 1}), limit=8)
    assert sliced is not None
    # squad (limit 3) sits under team (limit 2): one read of both, sized by team's room (1).
    assert set(sliced.parts) == {
        ReadySlice(7, scopes_out=("squad", "team")),
        ReadySlice(1, scopes_in=("squad", "team")),
    }


def test_a_full_scope_is_skipped_and_others_keep_their_own_room() -> None:
    limits_two = CapacityLimits(
        global_limit=8, scope_limits={"a": 1, "b": 3}, scope_parents={"a": "root", "b": "root"}
    )
    cx: Any = SimpleNamespace(locks_rows=False)
    slots = Slots(cx, limits_two, lock=False)
    slots.take(None, "a", 1)
    sliced = capacity_sized(slots, limit=8)
    assert sliced is not None
    assert sliced.skip_scopes == ("a",)
    assert set(sliced.parts) == {ReadySlice(7, scopes_out=("b",)), ReadySlice(3, scopes_in=("b",))}


def test_without_scope_limits_the_read_is_the_pool_s_alone() -> None:
    cx: Any = SimpleNamespace(locks_rows=False)
    slots = Slots(cx, CapacityLimits(global_limit=4), lock=False)
    sliced = capacity_sized(slots, limit=8)
    assert sliced is not None
    assert sliced.parts == (ReadySlice(4),)
