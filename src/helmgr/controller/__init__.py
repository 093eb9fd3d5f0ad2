"""The three-tier HELM controller (SPEC 6): base policy (PPO, exported to numpy), residual
adapter, burst-aware recovery, safety. `Controller.default().step(stats)` is the library API."""
from helmgr.controller.controller import Controller
from helmgr.controller.observe import WindowStats

__all__ = ["Controller", "WindowStats"]
