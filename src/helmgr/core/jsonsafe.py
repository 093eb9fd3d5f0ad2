"""Strict JSON: no NaN or Infinity in anything helmgr prints or writes.

A number that is not finite becomes `null`, and the object holding it says why in one `nulls`
map: `{"p99_ms": null, ..., "nulls": {"p99_ms": "no request completed after warm-up"}}`. A
number inside a list is named by its path from that object (`"r_star[3]"`). A producer that knows
the reason puts it in the object's `nulls` map before it is written; any other number gets a
generic reason (`"not a finite number (nan)"`). `nulls` appears only on an object that has one.
numpy scalars and arrays become plain numbers and lists; tuples become lists.
"""
from __future__ import annotations

import json
import math

import numpy as np

NULLS = "nulls"


def reason_for(x: float) -> str:
    return f"not a finite number ({x!r})"


def strict(obj):
    """A copy of `obj` that `json.dumps(..., allow_nan=False)` accepts (see the module doc)."""
    return _value(obj, None, "")


def dumps(obj, **kwargs) -> str:
    """`json.dumps` of `strict(obj)`, refusing NaN and Infinity should any remain."""
    return json.dumps(strict(obj), allow_nan=False, **kwargs)


def _dict(d: dict) -> dict:
    known = d.get(NULLS)
    nulls = dict(known) if isinstance(known, dict) else {}
    out = {k: _value(v, nulls, str(k)) for k, v in d.items() if k != NULLS}
    if nulls:
        out[NULLS] = {str(k): str(v) for k, v in nulls.items()}
    return out


def _value(v, nulls: dict | None, path: str):
    """`nulls` is the enclosing object's reason map (None at the top level, outside any object);
    `path` names `v` from that object."""
    if isinstance(v, dict):
        return _dict(v)
    if isinstance(v, np.ndarray):
        v = v.tolist()
    if isinstance(v, (list, tuple)):
        return [_value(x, nulls, f"{path}[{i}]") for i, x in enumerate(v)]
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        if nulls is not None:
            nulls.setdefault(path, reason_for(v))
        return None
    return v
