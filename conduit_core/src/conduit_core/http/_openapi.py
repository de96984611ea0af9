"""The OpenAPI 3.1 document, generated from the route tables and the msgspec structs.

Every route the daemon serves is in it (``tests/daemon/test_api_fuzz.py`` fuzzes the daemon from
this document, so the two cannot drift apart).
"""

from __future__ import annotations

import re
from typing import Any, Literal, get_args, get_origin

import msgspec

from conduit_core._version import __version__
from conduit_core.http._schemas import ErrorBody
from conduit_core.validation import WORK_ID_PATTERN

__all__ = ["openapi_document"]

_REF = "#/components/schemas/{name}"
_ERRORS = {
    "400": "Malformed JSON, an unknown or invalid field, a body nested too deeply, a bad query "
    "parameter, or a batch over its item limit (the message names it)",
    "401": "Missing or wrong bearer token; nothing changed",
    "404": "Unknown Work or schedule id",
    "409": "The state does not allow this",
    "413": "The body is over `settings.http.max_body_bytes`; nothing was read past the limit",
    "422": "Unknown binding or scope",
    "429": "Too many wrong tokens from this address (`login_throttled`); see `Retry-After`",
    "503": "The store is unreachable or the daemon is stopping",
}
_SCHEDULE_ERRORS = {"403": "The schedule's source is observe-only"}
_ROLE_ERROR = {"403": "The token's role may not do this (`forbidden_role`)"}


def _all_routes() -> tuple[Any, ...]:
    from conduit_core.http._app import ROUTES
    from conduit_core.http.routes_schedules import SCHEDULE_ROUTES

    return (*ROUTES, *SCHEDULE_ROUTES)


def _required_body(struct: type[msgspec.Struct]) -> bool:
    """A body is required when its Struct has a required field (an empty body is ``{}``)."""
    info = msgspec.inspect.type_info(struct)
    assert isinstance(info, msgspec.inspect.StructType)
    return any(field.required for field in info.fields)


def openapi_document() -> dict[str, Any]:
    routes = _all_routes()
    types: list[Any] = [ErrorBody]
    for route in routes:
        if route.response is not None:
            types.append(route.response)
        if route.body is not None:
            types.append(route.body)
        types.extend(kind for _, kind, _ in route.query if kind is not str and kind is not int)
    schemas, components = msgspec.json.schema_components(types, ref_template=_REF)
    by_type = {repr(kind): schema for kind, schema in zip(types, schemas, strict=True)}
    error_ref = {"$ref": _REF.format(name="ErrorBody")}
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        success: dict[str, Any] = {"description": route.summary}
        if route.response is not None:
            success["content"] = {"application/json": {"schema": by_type[repr(route.response)]}}
        errors = _ERRORS | (_ROLE_ERROR if route.method not in ("GET", "HEAD") else {})
        if route.path.startswith("/v1/schedules"):
            errors |= _SCHEDULE_ERRORS if route.method in ("GET", "HEAD") else {
                "403": f"{_ROLE_ERROR['403']}, or the schedule's source is observe-only"
            }
        op: dict[str, Any] = {
            "operationId": _operation_id(route.method, route.path),
            "summary": route.summary,
            "responses": {
                **{str(status): success for status in (route.status, *route.also)},
                **{
                    code: {
                        "description": text,
                        "content": {"application/json": {"schema": error_ref}},
                    }
                    for code, text in sorted(errors.items())
                },
            },
        }
        params: list[dict[str, Any]] = []
        if "{id}" in route.path:
            # Work ids follow the id grammar; a schedule id is `<source>:<id>` or a Routine id.
            id_schema: dict[str, Any] = (
                {"type": "string", "pattern": WORK_ID_PATTERN}
                if route.path.startswith("/v1/work/")
                else {"type": "string", "minLength": 1}
            )
            params.append({"name": "id", "in": "path", "required": True, "schema": id_schema})
        if "{attempt}" in route.path:
            params.append({"name": "attempt", "in": "path", "required": True,
                           "schema": {"type": "integer", "minimum": 1}})  # fmt: skip
        for name, kind, text in route.query:
            params.append(
                {"name": name, "in": "query", "required": False, "description": text,
                 "schema": _query_schema(name, kind, by_type)}
            )  # fmt: skip
        if params:
            op["parameters"] = params
        if route.body is not None:
            op["requestBody"] = {
                "required": _required_body(route.body),
                "content": {"application/json": {"schema": by_type[repr(route.body)]}},
            }
        paths.setdefault(route.path, {})[route.method.lower()] = op
    paths["/v1/openapi.json"] = {
        "get": {
            "operationId": "getOpenapi",
            "summary": "This document",
            "responses": {
                "200": {
                    "description": "The OpenAPI 3.1 document",
                    "content": {"application/json": {"schema": {"type": "object"}}},
                },
                **{
                    code: {
                        "description": _ERRORS[code],
                        "content": {"application/json": {"schema": error_ref}},
                    }
                    for code in ("401", "429")
                },
            },
        }
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "conduit daemon API",
            "version": __version__,
            "description": "Every request needs `Authorization: Bearer <token>` (the daemon's "
            "token file, or a named `[[tokens]]` one: a `viewer` reads, an `operator` also acts, "
            "an `admin` also confirms stops and creates, edits or deletes schedules). Errors are "
            '`{"error": message, "code": code}`.',
        },
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        # Relative: the daemon serves wherever `settings.http.listen` (or its unix socket) says.
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def _query_schema(name: str, kind: Any, by_type: dict[str, Any]) -> dict[str, Any]:
    from conduit_core.http._app import PAGE_LIMIT

    if kind is str:
        return {"type": "string"}
    if get_origin(kind) is Literal:
        return {"type": "string", "enum": list(get_args(kind))}
    if kind is int and name == "tail":
        from conduit_core.http._output import MAX_TAIL

        return {"type": "integer", "minimum": 1, "maximum": MAX_TAIL}
    if kind is int and name == "limit":
        low, high = PAGE_LIMIT
        return {"type": "integer", "minimum": low, "maximum": high}
    if kind is int:
        return {"type": "integer"}
    schema: dict[str, Any] = by_type[repr(kind)]
    return schema


def _operation_id(method: str, path: str) -> str:
    words = [w for w in re.split(r"[/{}\-]+", path) if w and w != "v1"]
    return method.lower() + "".join(w.capitalize() for w in words)
