"""Print the wire protocol's JSON Schema: ``python -m conduit_core.extension.wire.schema``."""

from __future__ import annotations

import json

from conduit_core.extension.wire._messages import wire_json_schema


def render() -> str:
    return json.dumps(wire_json_schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    print(render(), end="")
