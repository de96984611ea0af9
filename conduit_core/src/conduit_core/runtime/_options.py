"""Scheduler options: the policy knobs, with the reference's defaults, copied at construction."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from conduit_core.config import Binding, Budget, Config
from conduit_core.extension import protection_off
from conduit_core.storage import CapacityLimits

__all__ = ["JOBS_POOL", "SchedulerOptions"]

JOBS_POOL = "jobs"


@dataclass(frozen=True, kw_only=True)
class SchedulerOptions:
    """Defaults: 4 concurrent attempts, a one-minute lease, a one-hour timeout, three attempts."""

    owner: str = "conduit"
    config_generation: int = 1
    concurrency: int = 4
    job_concurrency: int = 4
    lease_ms: int = 60_000
    timeout_ms: int = 3_600_000
    retry_delays_ms: tuple[int, ...] = (300_000, 600_000)
    bindings: Mapping[str, Binding] = field(default_factory=dict)
    #: Scope tree: scope → parent (root has none) and the scopes' own concurrency limits.
    scope_parents: Mapping[str, str] = field(default_factory=dict)
    scope_limits: Mapping[str, int] = field(default_factory=dict)
    #: The host's state directory; each executor gets ``<state_dir>/<executor name>``
    #: (``ExecutionContext.state_dir``).
    state_dir: str | None = None
    #: How many pending inputs one attempt takes (None: all of them).
    max_inputs: int | None = None
    #: Budgets Start enforces after capacity (none: nothing is charged or held).
    budgets: tuple[Budget, ...] = ()
    #: Limits of executor pools other than ``jobs`` (``[pools.NAME] concurrency``).
    pool_limits: Mapping[str, int] = field(default_factory=dict)
    #: How long a held recovery waits before it is tried again (a start or reload tries at once).
    recovery_retry_ms: int = 30_000
    #: How many recoveries ask their executor (``recover``, or a relaunch) at once; the rest
    #: wait their turn, holding their leases. Each adoption ends in a fenced write, so this is
    #: also how many of those can share a store transaction (64 made a restart adopting 1,000
    #: jobs wait on four times as many commits); executors that call an engine bound their own
    #: calls (the container executor's limiter), and the shell executor checks them in one look.
    recovery_concurrency: int = 256
    #: The pool of each binding's executor (``None``: none), filled in by the Scheduler from its
    #: plugins: claims read only the ready Work of bindings with a free slot.
    binding_pools: Mapping[str, str | None] = field(default_factory=dict)
    #: How long a host gives one stop, interrupt or inject it starts on its own (the daemon's
    #: stop/confirm pass and control dispatch) before it gives up and tries again later.
    executor_call_timeout_ms: int = 60_000
    #: This host's labels (``settings.labels``): it starts and recovers only the Work of
    #: bindings whose ``requires`` are all among them.
    labels: frozenset[str] = frozenset()
    #: The bindings whose ``requires`` this host lacks (derived from ``bindings``/``labels``).
    lacking_bindings: tuple[str, ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        # Copy the mappings so a caller mutating theirs cannot change a running scheduler.
        object.__setattr__(self, "bindings", dict(self.bindings))
        object.__setattr__(self, "scope_parents", dict(self.scope_parents))
        object.__setattr__(self, "scope_limits", dict(self.scope_limits))
        object.__setattr__(self, "budgets", tuple(self.budgets))
        object.__setattr__(self, "pool_limits", dict(self.pool_limits))
        object.__setattr__(self, "binding_pools", dict(self.binding_pools))
        object.__setattr__(self, "labels", frozenset(self.labels))
        lacking = sorted(
            name for name, b in self.bindings.items() if not self.labels.issuperset(b.requires)
        )
        if protection_off("label_filter"):  # a race detector's negative control (test only)
            lacking = []
        object.__setattr__(self, "lacking_bindings", tuple(lacking))

    @classmethod
    def from_config(
        cls, config: Config, *, config_generation: int, owner: str, state_dir: str | None = None
    ) -> SchedulerOptions:
        settings = config.settings
        return cls(
            owner=owner,
            config_generation=config_generation,
            concurrency=settings.concurrency,
            job_concurrency=settings.job_concurrency,
            lease_ms=int(settings.lease_seconds * 1000),
            timeout_ms=int(settings.timeout_seconds * 1000),
            retry_delays_ms=tuple(int(d * 1000) for d in settings.retry_delays_seconds),
            bindings=config.bindings,
            scope_parents={k: s.parent for k, s in config.scopes.items() if s.parent is not None},
            scope_limits={
                k: s.limits.concurrency
                for k, s in config.scopes.items()
                if s.limits.concurrency is not None
            },
            state_dir=state_dir,
            budgets=tuple(config.budgets),
            pool_limits={name: pool.concurrency for name, pool in config.pools.items()},
            executor_call_timeout_ms=int(settings.executor_call_timeout_seconds * 1000),
            labels=frozenset(settings.labels),
        )

    def executor_state_dir(self, executor: str) -> str | None:
        """``<state_dir>/<executor name>``: each executor its own, so two executors' files
        never meet (``ExecutionContext.state_dir``, ``StopTarget.state_dir``)."""
        return None if self.state_dir is None else os.path.join(self.state_dir, executor)

    def capacity(self) -> CapacityLimits:
        return CapacityLimits(
            global_limit=self.concurrency,
            pool_limits={**self.pool_limits, JOBS_POOL: self.job_concurrency},
            scope_limits=dict(self.scope_limits),
            scope_parents=dict(self.scope_parents),
            binding_pools=dict(self.binding_pools),
            skip_bindings=self.lacking_bindings,
            concurrency_keys=any(b.concurrency_key for b in self.bindings.values()),
        )

    def scope_chain(self, scope: str) -> tuple[str, ...]:
        """The scope and its ancestors, root first."""
        chain = [scope]
        while (parent := self.scope_parents.get(chain[-1])) is not None and parent not in chain:
            chain.append(parent)
        return tuple(reversed(chain))
