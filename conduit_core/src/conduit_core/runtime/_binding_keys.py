"""A binding's own dedup or debounce key (docs/dedup.md, "A binding's default key").

A binding's ``dedup_key`` or ``debounce.key`` is a template over the first input; every submit
to the binding that carries no key of its own is submitted under it: an HTTP, CLI or client
submit (``http/_submit_keys``), and a Routine's fire (``routines/fire``).
"""

from __future__ import annotations

from typing import Any

from conduit_core.config import Binding
from conduit_core.storage import DedupScope, SubmitKey
from conduit_core.validation import duration_ms, render_key_template

__all__ = ["binding_key", "debounce_key", "dedup_scope"]


def binding_key(
    binding: Binding, payload: Any, *, dedup: str | None = None, dedup_window: str | None = None
) -> SubmitKey | None:
    """The key a submit of ``payload`` to ``binding`` goes under by the binding's templates
    (``dedup`` / ``dedup_window``: a submit's own scope over the binding's), or ``None``; a
    refusal naming the field if the input lacks what a template reads."""
    if binding.debounce is not None:
        spec = binding.debounce
        key = render_key_template(spec.key, payload, "$.bindings.debounce.key")
        return debounce_key(key, spec.quiet, spec.max_wait, "$.bindings.debounce")
    if binding.dedup_key is not None:
        key = render_key_template(binding.dedup_key, payload, "$.bindings.dedup_key")
        scope, window = dedup_scope(dedup, dedup_window, binding)
        return SubmitKey(key=key, scope=scope, window_ms=window)
    return None


def dedup_scope(
    asked: str | None, window: str | None, binding: Binding
) -> tuple[DedupScope, int]:
    """A dedup key's scope and window: the submit's own, else the binding's."""
    if window is not None:
        return DedupScope.WINDOW, duration_ms(window, "$.dedup_window")
    if asked is not None:
        return DedupScope(asked), 0
    if binding.dedup_window is not None:
        return DedupScope.WINDOW, duration_ms(binding.dedup_window, "$.bindings.dedup_window")
    return DedupScope(binding.dedup), 0


def debounce_key(key: str, quiet: str, max_wait: str | None, field: str) -> SubmitKey:
    quiet_ms = duration_ms(quiet, f"{field}.quiet")
    wait_ms = None if max_wait is None else duration_ms(max_wait, f"{field}.max_wait")
    return SubmitKey(key=key, quiet_ms=quiet_ms, max_wait_ms=wait_ms)
