"""The cluster simulator (docs/simulator.md): a discrete-event loop over N nodes, a router and a memory policy."""
from helmgr.core.jitcache import clear_if_stale

clear_if_stale(__file__, "memory", "routing")    # the compiled path inlines their compiled code

from helmgr.sim.config import FaultSpec, SimConfig, parse_fault  # noqa: E402
from helmgr.sim.run import RunStopped, SimResult, simulate  # noqa: E402

__all__ = ["SimConfig", "FaultSpec", "parse_fault", "RunStopped", "SimResult", "simulate"]
