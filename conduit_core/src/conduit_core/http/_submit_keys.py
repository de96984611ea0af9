"""The dedup or debounce key of a submit: from the request, else the binding's template.

A request's own ``dedup_key`` / ``debounce.key`` is used as written; a binding's ``dedup_key``
or ``debounce.key`` is a template over the first input (``"order-{order_id}"``). A submit carries
one key: dedup or debounce, never both (they answer different questions: "is this already
queued?" and "wait until the submits stop"). docs/dedup.md has the semantics.
"""

from __future__ import annotations

from conduit_core.config import Binding
from conduit_core.http._schemas import SubmitRequest
from conduit_core.runtime import binding_key, debounce_key, dedup_scope
from conduit_core.storage import SubmitKey
from conduit_core.validation import InvalidValueError

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
        spec = req.debounce
        return debounce_key(spec.key, spec.quiet, spec.max_wait, "$.debounce")
    if req.dedup_key is not None:
        scope, window = dedup_scope(req.dedup, req.dedup_window, binding)
        return SubmitKey(key=req.dedup_key, scope=scope, window_ms=window)
    if (req.dedup is not None or req.dedup_window is not None) and binding.dedup_key is None:
        raise InvalidValueError(
            "$.dedup_key", f"a dedup scope needs a key (binding {req.binding!r} has no "
            "dedup_key template)", code="dedup_without_key",
        )  # fmt: skip
    return binding_key(binding, req.input, dedup=req.dedup, dedup_window=req.dedup_window)
