"""The cluster simulator (SPEC 4): a discrete-event loop over N nodes, a router and a memory policy."""
from helmgr.sim.config import FaultSpec, SimConfig, parse_fault
from helmgr.sim.run import SimResult, simulate

__all__ = ["SimConfig", "FaultSpec", "parse_fault", "SimResult", "simulate"]
