"""Daemon logs: stdlib logging, one line per event; ``text`` or ``json`` format.

Attempt events carry ``execution_id`` and ``epoch`` (as ``extra``), which the JSON format emits
as fields. Nothing here ever formats an input payload, a secret or a run-environment value.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Literal

__all__ = ["LogFormat", "TextFormatter", "configure_logging"]

LogFormat = Literal["text", "json"]
_EXTRA_FIELDS = ("execution_id", "epoch", "work_id", "owner")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in _EXTRA_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                out[name] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


#: Control characters (newline, carriage return, escape, …) as visible escapes.
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F)} | {
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    ord("\t"): "\\t",
}
_CONTROL |= {c: f"\\u{c:04x}" for c in (0x85, 0x2028, 0x2029)}


class TextFormatter(logging.Formatter):
    """One event, one line: text from users (a Work id, an event type, a reason) that carries a
    newline or another control character is escaped, so it can never forge a log line. A
    traceback, appended after the message, keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = super().formatMessage(record)
        # Every character ``_CONTROL`` maps is unprintable: a printable line (nearly every
        # line) needs no translation, and the check costs a tenth of one.
        return line if line.isprintable() else line.translate(_CONTROL)


def configure_logging(fmt: LogFormat = "text", level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # Neither format shows where a call was made, nor its thread or process: the records need
    # not find them (the stdlib's own advice for speed; ~4 µs of each line, two per attempt).
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    # One line per event of ours; uvicorn's access log would add one per request.
    logging.getLogger("uvicorn.access").disabled = True
    # psycopg's pool logs every failed reconnection attempt; the host logs a store outage once
    # when it starts and once when it ends (daemon/_outage.py).
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
