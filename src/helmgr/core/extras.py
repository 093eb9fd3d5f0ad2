"""Optional extras (pyproject's optional-dependencies): which commands need which packages.

The core install (numpy, numba, click, rich, matplotlib) runs the simulator, the experiments and
the controller library. Training, the real data path and serving need an extra each; a command
that needs one calls `require` before it imports anything heavy, so a missing extra is one line
and exit 2 (HelmInputError), not a traceback.

`require` only looks modules up (importlib.util.find_spec on top-level names): it imports
nothing, so the check costs microseconds and a present module is loaded only where it is used.
"""
from __future__ import annotations

import importlib.util

from helmgr.core.errors import HelmInputError

# extra -> the top-level modules its commands import (import names, not distribution names)
EXTRAS: dict[str, tuple[str, ...]] = {
    "train": ("gymnasium", "stable_baselines3", "torch"),
    "real": ("torch", "safetensors"),
    # ray[serve] brings fastapi, pydantic, starlette, uvicorn, prometheus_client and aiohttp
    "serve": ("ray", "fastapi", "pydantic", "starlette", "uvicorn", "prometheus_client", "aiohttp", "torch", "safetensors"),
    "redis": ("redis",),
}


def missing(*modules: str) -> list[str]:
    """The modules of `modules` that cannot be found (a dotted name counts by its top level)."""
    out = []
    for name in modules:
        top = name.partition(".")[0]
        try:
            found = importlib.util.find_spec(top) is not None
        except (ImportError, ValueError):         # a finder that refuses it, a module without a spec
            found = False
        if not found:
            out.append(name)
    return out


def require(extra: str, *modules: str, what: str | None = None) -> None:
    """Raise HelmInputError naming `extra` and its pip line unless every module of `modules`
    (default: the extra's own, EXTRAS[extra]) can be imported. `what` names the caller in the
    message, e.g. "helmgr train"."""
    if not modules:
        if extra not in EXTRAS:
            raise KeyError(f"unknown extra {extra!r}; known: {', '.join(EXTRAS)}")
        modules = EXTRAS[extra]
    lost = missing(*modules)
    if lost:
        who = f"{what} " if what else ""
        raise HelmInputError(f"{who}needs the [{extra}] extra (not installed: {', '.join(lost)}): "
                             f"pip install 'helmgr[{extra}]'")
