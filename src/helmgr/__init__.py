"""HELM: adaptive EMB/KV memory split and cache-aware routing for generative-recommender serving.

`helmgr.Controller` (the three-tier controller's library API) is loaded on first use."""
from __future__ import annotations

__all__ = ["Controller", "WindowStats"]


def __getattr__(name: str):
    if name in __all__:
        from helmgr import controller
        return getattr(controller, name)
    raise AttributeError(f"module 'helmgr' has no attribute {name!r}")
