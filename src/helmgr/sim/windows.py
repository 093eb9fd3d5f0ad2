"""Each node's open metrics window in the simulator: what was routed to it, what completed, and
its counters when the window opened. Closing a window builds the node's `NodeWindow` through
`core.window.node_window`, the computation serving uses too."""
from __future__ import annotations

import numpy as np

from helmgr.core.window import NodeCounters, NodeWindow, node_window
from helmgr.sim.metrics import Column


class WindowBook:
    def __init__(self, nodes: list):
        n = len(nodes)
        self.arrivals = [0] * n
        self.latency = [Column(np.float64) for _ in range(n)]       # s, per completed request
        self.fetch = [Column(np.float64) for _ in range(n)]         # its EMB fetch s
        self.recompute = [Column(np.float64) for _ in range(n)]     # its prefix recompute s
        self.opened: list[NodeCounters] = [node.counters() for node in nodes]

    def arrived(self, n: int) -> None:
        self.arrivals[n] += 1

    def completed(self, n: int, latency: float, fetch_s: float, recompute_s: float) -> None:
        self.latency[n].append(latency)
        self.fetch[n].append(fetch_s)
        self.recompute[n].append(recompute_s)

    def restart(self, n: int, node) -> None:
        """Node n came back as a fresh node: its window counts from the new node's counters."""
        self.opened[n] = node.counters()

    def close(self, n: int, node, now: float, span_s: float, queue_len: int) -> NodeWindow:
        """Node n's window ending at `now`; the next one opens."""
        counters = node.counters()
        w = node_window(n, now, span_s, node.ratio, self.arrivals[n], self.latency[n], queue_len,
                        counters.since(self.opened[n]), (self.fetch[n], self.recompute[n]))
        self.opened[n] = counters
        self.arrivals[n] = 0
        self.latency[n], self.fetch[n], self.recompute[n] = (Column(np.float64) for _ in range(3))
        return w
