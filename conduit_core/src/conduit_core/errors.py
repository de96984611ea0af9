"""The one error base of conduit, and the errors a user or a plugin can meet.

Every error carries a stable ``code`` (snake_case) that scripts, the HTTP API and the CLI's
``--json`` output use; the message is for people and may change. Errors about something looked up
by id also subclass :class:`LookupError` and build their message from the id.
"""

from __future__ import annotations

__all__ = [
    "STORE_OUTAGE_CODES",
    "is_store_outage",
    "CapacityError",
    "ConduitError",
    "ConfigError",
    "DuplicateRegistrationError",
    "LeaseLostError",
    "ManifestError",
    "NotFoundError",
    "PluginLoadError",
    "StoreError",
    "UnsupportedGenerationError",
]


class ConduitError(Exception):
    """Base of every error conduit raises on purpose."""

    code: str = "conduit_error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class ConfigError(ConduitError):
    """A configuration file that cannot be used; the message names the file and the key path."""

    code = "invalid_config"


class ManifestError(ConduitError):
    """A plugin manifest that is malformed or disagrees with the plugin's registrations."""

    code = "invalid_manifest"


class PluginLoadError(ConduitError):
    """A plugin that could not be imported or whose hooks failed."""

    code = "plugin_load_failed"


class DuplicateRegistrationError(ConduitError):
    """Two plugins registered the same executor (name, generation) or gate name."""

    code = "duplicate_registration"


class NotFoundError(ConduitError, LookupError):
    """Something looked up by id does not exist."""

    code = "not_found"

    def __init__(self, kind: str, ident: str, *, code: str | None = None) -> None:
        super().__init__(f"unknown {kind} {ident!r}", code=code)
        self.kind = kind
        self.ident = ident


class UnsupportedGenerationError(ConduitError, LookupError):
    """No installed package implements this executor generation; never replaced silently."""

    code = "unsupported_generation"

    def __init__(self, executor: str, generation: int, *, installed: tuple[int, ...] = ()) -> None:
        have = ", ".join(str(g) for g in installed) if installed else "none"
        super().__init__(
            f"executor {executor!r} generation {generation} is not installed "
            f"(installed generations: {have}); install a package version that still declares "
            f"generation {generation} of {executor!r} (manifest 'generation' or "
            f"'historical_generations') to recover or control attempts pinned to it"
        )
        self.executor = executor
        self.generation = generation


class CapacityError(ConduitError):
    """A start refused by a capacity limit; ``code`` names the setting that holds it back."""

    code = "capacity_concurrency"

    def __init__(self, message: str, *, code: str, limit_name: str) -> None:
        super().__init__(message, code=code)
        self.limit_name = limit_name


class LeaseLostError(ConduitError):
    """A write on behalf of an attempt was refused: stale epoch, expired or released lease."""

    code = "lease_lost"


class StoreError(ConduitError):
    """The store cannot be opened or used (unreachable, corrupt, foreign, newer schema)."""

    code = "store_unavailable"


#: Codes that mean "the store cannot take this now" (it did not answer, or its disk is full), not
#: "the store refused this request": a daemon waits them out with backoff and logs them once.
STORE_OUTAGE_CODES = frozenset({"store_unavailable", "store_unreachable", "store_full"})


def is_store_outage(exc: BaseException) -> bool:
    """Whether ``exc`` says the store could not take a write now (not that it refused it): the
    write may or may not have committed. An executor whose ``persist_recovery`` meets one
    leaves what it started alone; recovery adopts it by its launch intent once the store is back.
    """
    return isinstance(exc, ConduitError) and exc.code in STORE_OUTAGE_CODES
