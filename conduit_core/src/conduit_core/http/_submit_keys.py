"""The dedup or debounce key of a submit: from the request, else the binding's template.

A request's own ``dedup_key`` / ``debounce.key`` is used as written; a binding's ``dedup_key``
or ``debounce.key`` is a template over the first input (``"order-{order_id}"``). A submit carries
one key: dedup or debounce, never both (they answer different questions: "is this already
queued?" and "wait until the submits stop"). docs/dedup.md has the semantics.
"""

from __future__ import annotations

from typing import Any

from conduit_core.config import Binding
from conduit_core.http._schemas import SubmitRequest
from conduit_core.storage import DedupScope, SubmitKey
from conduit_core.validation import InvalidValueError, duration_ms, render_key_template

__all__ = ["submit_key_for"]


def submit_key_for(req: SubmitRequest, binding: Binding) -> SubmitKey | None:
    """The key ``req`` is submitted under (``None``: an ordinary submit), or a refusal naming
    the field at fault."""
    asks_dedup = req.dedup_key is not None or req.dedup is not None or req.dedup_window
    if req.debounce is not None and asks_dedup:
        raise InvalidValueError(
            "$.debounce", "a submit is either deduplicated or debounced, not both",
            code="dedup_and_debounce",
        )  # fmt: skip
    if req.dedup is not None and req.dedup_window is not None:
        raise InvalidValueError(
            "$.dedup_window", "give a dedup scope or a window, not both", code="invalid_value"
        )
    if req.debounce is not None:
        return _debounce(req.debounce.key, req.debounce.quiet, req.debounce.max_wait, "$.debounce")
    if req.dedup_key is not None:
        scope, window = _scope(req.dedup, req.dedup_window, binding)
        return SubmitKey(key=req.dedup_key, scope=scope, window_ms=window)
    if (req.dedup is not None or req.dedup_window is not None) and binding.dedup_key is None:
        raise InvalidValueError(
            "$.dedup_key", f"a dedup scope needs a key (binding {req.binding!r} has no "
            "dedup_key template)", code="dedup_without_key",
        )  # fmt: skip
    if binding.debounce is not None:
        spec = binding.debounce
        key = render_key_template(spec.key, req.input, "$.bindings.debounce.key")
        return _debounce(key, spec.quiet, spec.max_wait, "$.bindings.debounce")
    if binding.dedup_key is not None:
        key = render_key_template(binding.dedup_key, req.input, "$.bindings.dedup_key")
        scope, window = _scope(req.dedup, req.dedup_window, binding)
        return SubmitKey(key=key, scope=scope, window_ms=window)
    return None


def _scope(asked: str | None, window: str | None, binding: Binding) -> tuple[DedupScope, int]:
    if window is not None:
        return DedupScope.WINDOW, duration_ms(window, "$.dedup_window")
    if asked is not None:
        return DedupScope(asked), 0
    if binding.dedup_window is not None:
        return DedupScope.WINDOW, duration_ms(binding.dedup_window, "$.bindings.dedup_window")
    return DedupScope(binding.dedup), 0


def _debounce(key: str, quiet: str, max_wait: str | None, field: str) -> SubmitKey:
    quiet_ms = duration_ms(quiet, f"{field}.quiet")
    wait_ms: Any = None if max_wait is None else duration_ms(max_wait, f"{field}.max_wait")
    return SubmitKey(key=key, quiet_ms=quiet_ms, max_wait_ms=wait_ms)
