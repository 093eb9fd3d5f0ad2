"""The three-tier HELM controller (SPEC 6): base policy (PPO, exported), residual adapter,
burst-aware recovery, safety, run as one compiled step. `Controller.default().step(stats)` is
the library API."""
from helmgr.controller.controller import Controller
from helmgr.core.window import WindowStats

__all__ = ["Controller", "WindowStats"]
