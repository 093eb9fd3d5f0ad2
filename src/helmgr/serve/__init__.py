"""Serving (docs/serving.md): the real data path behind Ray Serve, routed by the HELM router.

`ServeConfig`, `ServeNode`, `HelmRouting` and the report codec import without Ray; the
deployment, router and ingress modules need `ray[serve]`. Nothing heavy (torch, Ray) is imported
until it is used, so `helmgr --help` stays fast."""
from helmgr.serve.config import ServeConfig

__all__ = ["ServeConfig", "build_app", "start", "stop"]


def __getattr__(name):
    if name in ("build_app", "start", "stop"):
        from helmgr.serve import app
        return getattr(app, name)
    raise AttributeError(name)
