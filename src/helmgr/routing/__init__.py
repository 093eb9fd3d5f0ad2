"""Routing (SPEC 7): the baseline routers, the HELM router, its compiled decision and the
residency index it reads."""
from helmgr.routing.routers import ROUTERS, Router, make_router

__all__ = ["ROUTERS", "Router", "make_router"]
