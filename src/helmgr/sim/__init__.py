"""The cluster simulator (SPEC 4): a discrete-event loop over N nodes, a router and a memory policy."""
from helmgr.sim.config import FaultSpec, SimConfig, parse_fault
from helmgr.sim.policies import POLICIES, MemoryPolicy, make_policy
from helmgr.sim.routers import ROUTERS, Router, make_router
from helmgr.sim.run import SimResult, simulate

__all__ = ["SimConfig", "FaultSpec", "parse_fault", "POLICIES", "MemoryPolicy", "make_policy",
           "ROUTERS", "Router", "make_router", "SimResult", "simulate"]
