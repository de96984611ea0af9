"""Print the manifest JSON Schema: ``python -m conduit_core.extension.schema``."""

from __future__ import annotations

import json

from conduit_core.extension._manifest import manifest_json_schema


def render() -> str:
    return json.dumps(manifest_json_schema(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    print(render(), end="")
