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

__all__ = ["LogFormat", "configure_logging"]

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


def configure_logging(fmt: LogFormat = "text", level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    # One line per event of ours; uvicorn's access log would add one per request.
    logging.getLogger("uvicorn.access").disabled = True
