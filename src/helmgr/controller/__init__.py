"""The three-tier HELM controller (docs/controller.md): base policy (PPO, exported), residual adapter,
burst-aware recovery, safety, run as one compiled step. `Controller.default().step(stats)` is
the library API."""
from helmgr.core.jitcache import clear_if_stale

clear_if_stale(__file__)     # before the compiled modules load

from helmgr.controller.controller import Controller  # noqa: E402
from helmgr.core.window import WindowStats  # noqa: E402

__all__ = ["Controller", "WindowStats"]
