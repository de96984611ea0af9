"""The tail of an attempt's stdout/stderr, running or ended, as its executor offers it.

The executor's optional ``output_tail`` (``conduit_core.extension.Executor``) reads it: the shell
and python executors from the job's workspace files, the container executor from the engine's log
(then the tail captured when the container ended). An executor that keeps no output answers
``available: false`` with why.
"""

from __future__ import annotations

import msgspec

from conduit_core.errors import ConduitError

__all__ = ["MAX_TAIL", "OUTPUT_STREAMS", "STREAMS", "OutputTail", "check_stream", "check_tail"]

STREAMS = ("stdout", "stderr")
OUTPUT_STREAMS = STREAMS
#: The most one request reads (the default is 64 KiB).
MAX_TAIL = 1024 * 1024
DEFAULT_TAIL = 64 * 1024


class OutputTail(msgspec.Struct, frozen=True, kw_only=True):
    work_id: str
    attempt: int
    epoch: int
    stream: str
    #: Whether the attempt still runs (the text grows: poll again).
    running: bool
    #: Whether the executor offers this output at all (``note`` says why not).
    available: bool
    #: The tail as text (UTF-8, undecodable bytes replaced); empty when none was written yet.
    text: str = ""
    #: Bytes in ``text`` (at most the ``tail`` asked for).
    bytes: int = 0
    note: str | None = None


def check_stream(stream: str) -> str:
    if stream not in STREAMS:
        raise ConduitError(
            f"query parameter 'stream': {stream!r} is not one of {', '.join(STREAMS)}",
            code="invalid_query",
        )
    return stream


def check_tail(raw: str | None) -> int:
    if raw is None:
        return DEFAULT_TAIL
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_TAIL:
        raise ConduitError(
            f"query parameter 'tail' must be an integer from 1 to {MAX_TAIL}, not {raw!r}",
            code="invalid_query",
        )
    return int(raw)
