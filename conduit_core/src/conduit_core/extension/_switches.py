"""Test-only switches: the core holds none of its own.

A race detector needs a negative control (one protection switched off) and a crash test needs a
daemon killed at an exact launch point. A production process must never obey either, so nothing
shipped reads a switch from the environment: the core asks a *switch provider*, an object a
test-only distribution registers under the entry point group :data:`SWITCH_ENTRY_POINT_GROUP`
(``tests/plugins/conduit_test_plugin``, which ``scripts/setup.sh`` installs into the test venv
only, never into a user's). Without a provider every protection is on and every fault point is
inert; and a conduit process that finds one of :data:`SWITCH_VARIABLES` set refuses to start
(``test_switch_without_test_plugin``, naming the variable) rather than quietly ignore what someone
meant to switch on. With a provider, the daemon logs the active switches at start and
``conduit doctor`` lists them.

The provider is looked up once per process (a spawned racer or a daemon subprocess looks it up
again, and reads its own environment); :func:`protection_off` is a set lookup after that.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Protocol, runtime_checkable

from conduit_core._switch_names import SWITCH_VARIABLES as _SWITCH_VARIABLES
from conduit_core._switch_names import UNSAFE_VARIABLE
from conduit_core.errors import ConduitError

__all__ = [
    "PROTECTIONS",
    "SWITCH_ENTRY_POINT_GROUP",
    "SWITCH_VARIABLES",
    "ActiveSwitches",
    "SwitchProvider",
    "active_switches",
    "fault_point",
    "fault_point_sync",
    "protection_off",
    "refuse_unprovided_switches",
]

#: Where a test-only distribution registers its :class:`SwitchProvider`.
SWITCH_ENTRY_POINT_GROUP = "conduit.test_switches"

#: Every variable a switch provider reads. Set without a provider, any of them stops a conduit
#: process from starting. ``CONDUIT_TEST_UNSAFE`` names protections (:data:`PROTECTIONS`) to
#: switch off; ``CONDUIT_TEST_FAULT`` names fault points (``shell.after_spawn:kill``,
#: ``store.capacity_counted:sleep=0.3``, …).
SWITCH_VARIABLES = _SWITCH_VARIABLES

#: The protections a provider may switch off, each for one race detector's negative control.
PROTECTIONS = {
    "capacity_check": "a claim never refuses for capacity (slots counted, never enforced)",
    "capacity_lock": "on PostgreSQL a claim does not lock the capacity rows it counts, so two "
    "claimers may both count the same free slot (SQLite has one writer by nature: no effect)",
    "key_check": "a claim never refuses for a concurrency key, and reads Work of every key from "
    "the ready queue (keys counted, never enforced)",
    "label_filter": "a claim from the ready queue and the expired-attempt read ignore the host's "
    "labels: a daemon reads the Work of every binding, whatever its requires (host labels)",
    "submit_key_lock": "a keyed submit (dedup, debounce) reads the key's holder without "
    "inserting or locking the key's row first, then creates its Work: racing submitters on "
    "PostgreSQL may each find no holder and each create one (SQLite has one writer: no effect)",
    "work_exclusion": "a claim of a named Work (claim_attempt) does not refuse it for being "
    "running, held, without input or with an attempt still holding its slot; the store's "
    "unique index conduit_execution_one_live still refuses a second live attempt, so a "
    "negative control drops that index too (both stores)",
}


@runtime_checkable
class SwitchProvider(Protocol):
    """What a test-only distribution registers (the entry point names an instance)."""

    def active(self) -> Mapping[str, str]:
        """Each switch variable this process obeys, with its value (empty: none is set)."""
        ...

    def protections_off(self) -> frozenset[str]:
        """Which of :data:`PROTECTIONS` this process runs without (read once, at look-up)."""
        ...

    async def fault_point(self, point: str) -> None:
        """Called at a named point of a launch; may kill the process or wait there."""
        ...

    def fault_point_sync(self, point: str) -> None:
        """The same at a point in blocking code (a store transaction, in its worker thread)."""
        ...


@dataclass(frozen=True)
class ActiveSwitches:
    """The switch providers installed in this process and what they switched on."""

    providers: tuple[str, ...] = ()
    variables: Mapping[str, str] = field(default_factory=dict)
    protections_off: frozenset[str] = frozenset()
    _impls: tuple[SwitchProvider, ...] = ()


@functools.cache
def _installed() -> ActiveSwitches:
    providers: list[str] = []
    impls: list[SwitchProvider] = []
    for ep in sorted(entry_points(group=SWITCH_ENTRY_POINT_GROUP), key=lambda e: e.name):
        try:
            impl = ep.load()
        except Exception as exc:
            raise ConduitError(
                f"test switch provider {ep.name!r} ({ep.value}) failed to load: {exc}",
                code="test_switch_provider_failed",
            ) from exc
        if not isinstance(impl, SwitchProvider):
            raise ConduitError(
                f"test switch provider {ep.name!r} ({ep.value}) is not a SwitchProvider",
                code="test_switch_provider_failed",
            )
        dist = ep.dist.name if ep.dist is not None else ep.value
        providers.append(f"{ep.name} ({dist})")
        impls.append(impl)
    off = frozenset().union(*(impl.protections_off() for impl in impls))
    unknown = sorted(off - PROTECTIONS.keys())
    if unknown:
        raise ConduitError(
            f"{UNSAFE_VARIABLE} names unknown protection(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(PROTECTIONS))}",
            code="test_switch_unknown",
        )
    variables: dict[str, str] = {}
    for impl in impls:
        variables.update(impl.active())
    return ActiveSwitches(tuple(providers), variables, off, tuple(impls))


def active_switches() -> ActiveSwitches:
    """The installed providers and the switches they obey (after the start-up check)."""
    refuse_unprovided_switches()
    return _installed()


def refuse_unprovided_switches(environ: Mapping[str, str] | None = None) -> None:
    """Refuse to start with a switch variable set and no provider installed to read it.

    Every conduit entry point calls this before it acts (the CLI, the daemon, :func:`open_store`).
    Raises :class:`ConduitError` ``test_switch_without_test_plugin`` naming the variable.
    """
    env = os.environ if environ is None else environ
    installed = _installed()  # looked up here, at start, never first inside a claim
    stray = [name for name in SWITCH_VARIABLES if env.get(name)]
    if stray and not installed.providers:
        names = ", ".join(stray)
        raise ConduitError(
            f"{names} set: a test-only switch, obeyed only when the test plugin is installed, "
            f"and none is (entry point group {SWITCH_ENTRY_POINT_GROUP!r}); a production "
            f"install never obeys one: unset {names}",
            code="test_switch_without_test_plugin",
        )


def protection_off(protection: str) -> bool:
    """Whether a test switched ``protection`` off in this process (never, without a provider)."""
    return protection in _installed().protections_off


async def fault_point(point: str) -> None:
    """A named point of a launch where a crash test may kill this process (inert by default)."""
    for impl in _installed()._impls:
        await impl.fault_point(point)


def fault_point_sync(point: str) -> None:
    """A named point in blocking code (``store.capacity_counted``: a claim transaction has
    counted the slot holders and not yet committed) where a test may kill this process or wait,
    to widen a race's window (inert by default)."""
    for impl in _installed()._impls:
        impl.fault_point_sync(point)
