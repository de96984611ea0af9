"""Plain-text descriptions of API views, shared by the CLI's tables and the web console's pages.

Both surfaces say the same thing about a Work (its note, an attempt's outcome, a segment's
launch-phase trail, where its job output is); only the markup differs, so the wording lives here
once. Nothing here formats for a terminal or for HTML.
"""

from __future__ import annotations

from conduit_core.extension import Artifact
from conduit_core.http._schemas import AttemptView, WorkDetail, WorkView
from conduit_core.model import Segment

__all__ = ["attempt_outcome", "launch_trail", "latest_artifacts", "segment_marks", "work_note"]


def work_note(work: WorkView) -> str:
    """What the status alone does not say: a pending retry, or why the Work is blocked."""
    if work.retry_pending:
        return "retry pending"
    if work.blocked_reason:
        return work.blocked_reason
    return ""


def attempt_outcome(attempt: AttemptView) -> str:
    """A failure's ``code: message``, or the result's summary; empty while it runs."""
    if attempt.failure_code:
        return f"{attempt.failure_code}: {attempt.failure_message or ''}".strip()
    if attempt.result is not None:
        return attempt.result.summary
    return ""


def segment_marks(segment: Segment) -> list[str]:
    """``recovered`` / ``relaunched``: how the segment came to be, when not a first start."""
    return [m for m, on in (("recovered", segment.recovered), ("relaunched", segment.relaunched))
            if on]  # fmt: skip


def launch_trail(segment: Segment) -> str:
    """The launch phases in order; ``…`` marks one still open, an outcome other than ok is named."""
    return ", ".join(
        f"{p.name}{'' if p.ended_at_ms is not None else '…'}"
        + (f" ({p.outcome})" if p.outcome not in (None, "ok") else "")
        for p in segment.launch
    )


def latest_artifacts(detail: WorkDetail) -> tuple[AttemptView, list[Artifact]] | None:
    """The latest finished attempt that produced artifacts (a shell job's stdout and stderr)."""
    for attempt in reversed(detail.attempts):
        if attempt.result is not None and attempt.result.artifacts:
            return attempt, list(attempt.result.artifacts)
    return None
