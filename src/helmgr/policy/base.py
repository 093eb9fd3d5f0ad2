"""The memory-policy interface, and the two policies that only hold or schedule a ratio.

A policy is attached to every node when it starts (`attach`), sees a `NodeWindow` of that node at
the end of every metrics window (`observe`), and is asked at every controller tick for the next
ratio (`decide`; None leaves it). Observations are plain data, the same for every policy.
"""
from __future__ import annotations

from helmgr.core.window import NodeWindow


class MemoryPolicy:
    name = ""

    def attach(self, index: int, node) -> None:
        """Called when node `index` starts (and restarts after a failure)."""

    def observe(self, index: int, window: NodeWindow, node) -> None:
        """Called at the end of every metrics window."""

    def decide(self, index: int, node, now: float) -> float | None:
        return None

    def report(self) -> dict:
        """Anything the policy adds to the run's results (merged into the summary)."""
        return {}


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
