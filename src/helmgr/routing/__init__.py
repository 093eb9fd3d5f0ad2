"""Routing: the baseline routers, the HELM router, its compiled decision and the
residency index it reads."""
from helmgr.core.jitcache import clear_if_stale

clear_if_stale(__file__)     # before the compiled modules load

from helmgr.routing.routers import ROUTERS, Router, make_router  # noqa: E402

__all__ = ["ROUTERS", "Router", "make_router"]
