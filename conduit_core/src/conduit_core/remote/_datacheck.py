"""The core's check of a result's ``data`` against the JSON Schema the program declared.

The program validates ``data`` against its own type before sending; the core checks again on
receipt, so a program that skips or gets its own check wrong cannot store data of the wrong
shape. Only the JSON Schema keywords msgspec generates for Structs are understood (``type``,
``properties``, ``required``, ``additionalProperties``, ``items``, ``enum``, ``anyOf``,
``$ref`` into ``$defs``, ``minimum``/``maximum``); any other keyword is not checked.
"""

from __future__ import annotations

from typing import Any

from conduit_core.extension import OperationError

__all__ = ["check_config", "check_data"]

_TYPES: dict[str, Any] = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "null": type(None),
}


def check_data(schema: dict[str, Any], data: Any) -> None:
    """Raise ``invalid_result`` naming the ``$.data`` path of the first mismatch."""
    problem = _problem(schema, schema, data, "$.data")
    if problem is not None:
        raise OperationError("invalid_result", f"result data: {problem}")


def check_config(schema: dict[str, Any], config: Any) -> None:
    """Raise permanent ``invalid_config`` naming the ``$.path`` of a binding config's mismatch."""
    problem = _problem(schema, schema, config, "$")
    if problem is not None:
        raise OperationError("invalid_config", f"binding config: {problem}", permanent=True)


def _matches_type(name: str, value: Any) -> bool:
    if name == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if name == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    expected = _TYPES.get(name)
    return expected is None or isinstance(value, expected)


def _problem(root: dict[str, Any], schema: Any, value: Any, path: str) -> str | None:
    if not isinstance(schema, dict):
        return None
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        return _problem(root, root.get("$defs", {}).get(ref.removeprefix("#/$defs/")), value, path)
    if "anyOf" in schema and all(
        _problem(root, s, value, path) is not None for s in schema["anyOf"]
    ):
        return f"{path}: matches none of the allowed shapes"
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind] if isinstance(kind, str) else []
    if kinds and not any(_matches_type(k, value) for k in kinds):
        return f"{path}: expected {' or '.join(kinds)}, got {type(value).__name__}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{path}: {value!r} is not one of {schema['enum']}"
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            return f"{path}: {value} is below the minimum {schema['minimum']}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{path}: {value} is above the maximum {schema['maximum']}"
    if isinstance(value, dict):
        return _object_problem(root, schema, value, path)
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            problem = _problem(root, schema["items"], item, f"{path}[{i}]")
            if problem is not None:
                return problem
    return None


def _object_problem(
    root: dict[str, Any], schema: dict[str, Any], value: dict[str, Any], path: str
) -> str | None:
    properties = schema.get("properties", {})
    for name in schema.get("required", []):
        if name not in value:
            return f"{path}: missing required field {name!r}"
    for name, item in value.items():
        if name in properties:
            problem = _problem(root, properties[name], item, f"{path}.{name}")
            if problem is not None:
                return problem
        elif schema.get("additionalProperties") is False:
            return f"{path}: unknown field {name!r}"
    return None
