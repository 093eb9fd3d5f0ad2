"""A recommend request's body, read and checked before any work, without Ray.

- `read_body`: at most `limit` bytes. A `Content-Length` above it is refused before a byte is
  read; a body that streams past it (no or a false length) is refused at the chunk that crosses.
- `parse_body`: strict JSON — `NaN`, `Infinity` and numbers that overflow to infinity (`1e400`),
  which Python's `json` accepts, are refused with the field they sit in — then the pydantic
  model. Every error is 422 with the field in `loc`, the problem in `msg`, and never the input
  (pydantic's `input` and `ctx` would echo a body of any size back to the client).
- `request_class`: the class a request names (its `tenant`'s, or its `class`) in the app's class
  table; an unknown one is 422 naming it.
"""
from __future__ import annotations

import json
import math
from typing import Annotated, AsyncIterator

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from helmgr.core.classes import ClassTable

Id = Annotated[int, Field(ge=0)]
Name = Annotated[str, Field(min_length=1, max_length=64)]
MAX_ERRORS = 10                 # a body with 4,096 bad ids gets ten errors and a count, not 4,096


class RecommendRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    user_id: Id
    new_items: list[Id] = Field(min_length=1, max_length=256)
    candidates: list[Id] = Field(min_length=1, max_length=4096)
    prefix_len: Id | None = None
    tenant: Name | None = None                              # a tenant of the app's class table ...
    slo_class: Name | None = Field(None, alias="class")     # ... or a class of it


class BodyError(Exception):
    """A body refused before any work: the HTTP status and FastAPI-style `detail`."""

    def __init__(self, status: int, detail):
        super().__init__(status, detail)
        self.status, self.detail = status, detail


def error(loc: list, kind: str, msg: str) -> dict:
    return {"loc": loc, "type": kind, "msg": msg}


async def read_body(chunks: AsyncIterator[bytes], content_length: str | None, limit: int) -> bytes:
    too_large = BodyError(413, [error(["body"], "too_large", f"the body is larger than {limit} bytes")])
    if content_length is not None:
        if not content_length.strip().isdigit():
            raise BodyError(400, [error(["header", "content-length"], "invalid", "Content-Length is not a number")])
        if int(content_length) > limit:
            raise too_large
    parts, size = [], 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise too_large
        parts.append(chunk)
    return b"".join(parts)


class _NonFinite:
    """Where a non-finite number stood in the parsed body (found only when there was one)."""

    def __init__(self, text: str):
        self.text = text


def _number(text: str):
    x = float(text)
    return x if math.isfinite(x) else _NonFinite(text)


def _find(obj, path: list) -> tuple[list, str] | None:
    if isinstance(obj, _NonFinite):
        return path, obj.text
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else ()
    for k, v in items:
        got = _find(v, path + [k])
        if got is not None:
            return got
    return None


def parse_body(raw: bytes) -> RecommendRequest:
    seen = []

    def constant(text: str):
        seen.append(text)
        return _NonFinite(text)

    def number(text: str):
        x = _number(text)
        if isinstance(x, _NonFinite):
            seen.append(text)
        return x

    try:
        obj = json.loads(raw, parse_constant=constant, parse_float=number)
    except (ValueError, RecursionError) as exc:       # UnicodeDecodeError and JSONDecodeError are ValueErrors
        where = f" at position {exc.pos}" if isinstance(exc, json.JSONDecodeError) else ""
        raise BodyError(422, [error(["body"], "json_invalid", f"the body is not valid JSON{where}")]) from None
    if seen:
        try:
            path, text = _find(obj, ["body"])
        except RecursionError:
            path, text = ["body"], seen[0]
        raise BodyError(422, [error(path, "finite_number", f"{text[:20]} is not a finite number")])
    try:
        return RecommendRequest.model_validate(obj)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_context=False, include_input=False)
        detail = [error(["body", *e["loc"]], e["type"], e["msg"]) for e in errors[:MAX_ERRORS]]
        if len(errors) > MAX_ERRORS:
            detail.append(error(["body"], "more_errors", f"{len(errors) - MAX_ERRORS} more errors not shown"))
        raise BodyError(422, detail) from None


def request_class(table: ClassTable | None, req: RecommendRequest) -> int | None:
    """The index in `table.classes` of the class `req` names — its tenant's, or its `class` (both
    given: they must agree); None for a request that names neither. 422 naming the field for a
    name the table does not hold, or for an app without a table."""
    if req.tenant is None and req.slo_class is None:
        return None
    field = "tenant" if req.tenant is not None else "class"
    if table is None:
        raise BodyError(422, [error(["body", field], "no_classes", "this app serves no class table")])
    names = table.class_names
    if req.tenant is not None:
        tenant = next((t for t in table.tenants if t.name == req.tenant), None)
        if tenant is None:
            raise BodyError(422, [error(["body", "tenant"], "unknown_tenant", f"unknown tenant {req.tenant!r} "
                                        f"(known: {', '.join(table.tenant_names)})")])
        if req.slo_class is not None and req.slo_class != tenant.slo_class:
            raise BodyError(422, [error(["body", "class"], "class_mismatch", f"tenant {req.tenant!r} is in class "
                                        f"{tenant.slo_class!r}, not {req.slo_class!r}")])
        return names.index(tenant.slo_class)
    if req.slo_class not in names:
        raise BodyError(422, [error(["body", "class"], "unknown_class", f"unknown class {req.slo_class!r} "
                                    f"(known: {', '.join(names)})")])
    return names.index(req.slo_class)
