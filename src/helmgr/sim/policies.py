"""Memory policies (SPEC 5): what sets each node's EMB:KV ratio. Called at every controller tick
with the node; returns the new ratio, or None to leave it."""
from __future__ import annotations

from helmgr.errors import HelmInputError


class MemoryPolicy:
    name = ""

    def decide(self, index: int, node, now: float) -> float | None:
        return None


class Static(MemoryPolicy):
    """A fixed ratio, set when the node starts."""

    name = "static"


class Scheduled(MemoryPolicy):
    """Ratios set at given times (for experiments and tests): [(time, ratio), ...]."""

    name = "scheduled"

    def __init__(self, steps: list[tuple[float, float]], nodes: set[int] | None = None):
        self.steps = sorted(steps)
        self.nodes = nodes

    def decide(self, index, node, now):
        if self.nodes is not None and index not in self.nodes:
            return None
        ratio = None
        for t, r in self.steps:
            if t <= now:
                ratio = r
        return ratio


POLICIES = {"static": Static}


def make_policy(name: str) -> MemoryPolicy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise HelmInputError(f"unknown policy {name!r} (known: {', '.join(POLICIES)})") from None
