"""The OpenAPI 3.1 document, generated from the route table and the msgspec structs."""

from __future__ import annotations

import re
from typing import Any

import msgspec

from conduit_core._version import __version__
from conduit_core.http._schemas import ErrorBody

__all__ = ["openapi_document"]

_REF = "#/components/schemas/{name}"
_ERRORS = {
    "400": "Malformed JSON, an unknown or invalid field (the message names it)",
    "401": "Missing or wrong bearer token; nothing changed",
    "404": "Unknown Work id",
    "409": "The Work's state does not allow this",
    "422": "Unknown binding or scope",
    "503": "The store is unreachable or the daemon is stopping",
}


def openapi_document() -> dict[str, Any]:
    from conduit_core.http._app import ROUTES

    types: list[Any] = [ErrorBody]
    for route in ROUTES:
        types.append(route.response)
        if route.body is not None:
            types.append(route.body)
    for route in ROUTES:
        types.extend(kind for _, kind, _ in route.query if kind is not str and kind is not int)
    schemas, components = msgspec.json.schema_components(types, ref_template=_REF)
    by_type = dict(zip(types, schemas, strict=True))
    error_ref = {"$ref": _REF.format(name="ErrorBody")}
    paths: dict[str, dict[str, Any]] = {}
    for route in ROUTES:
        op: dict[str, Any] = {
            "operationId": _operation_id(route.method, route.path),
            "summary": route.summary,
            "responses": {
                str(route.status): {
                    "description": route.summary,
                    "content": {"application/json": {"schema": by_type[route.response]}},
                },
                **{
                    code: {
                        "description": text,
                        "content": {"application/json": {"schema": error_ref}},
                    }
                    for code, text in _ERRORS.items()
                },
            },
        }
        params: list[dict[str, Any]] = []
        if "{id}" in route.path:
            params.append(
                {"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}
            )
        for name, kind, text in route.query:
            schema = (
                {"type": "string"}
                if kind is str
                else {"type": "integer"}
                if kind is int
                else by_type[kind]
            )
            params.append(
                {"name": name, "in": "query", "required": False, "description": text,
                 "schema": schema}
            )  # fmt: skip
        if params:
            op["parameters"] = params
        if route.body is not None:
            op["requestBody"] = {
                "required": False,
                "content": {"application/json": {"schema": by_type[route.body]}},
            }
        paths.setdefault(route.path, {})[route.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "conduit daemon API",
            "version": __version__,
            "description": "Every request needs `Authorization: Bearer <token>` (the daemon's "
            'token file). Errors are `{"error": message, "code": code}`.',
        },
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "servers": [{"url": "http://127.0.0.1:8765"}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def _operation_id(method: str, path: str) -> str:
    words = [w for w in re.split(r"[/{}]+", path) if w and w != "v1"]
    return method.lower() + "".join(w.capitalize() for w in words)
