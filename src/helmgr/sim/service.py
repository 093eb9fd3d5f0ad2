"""How a simulated node serves the batch it takes when it frees up."""
from __future__ import annotations

import numpy as np

from helmgr.core.records import History, Request, Service
from helmgr.sim.config import SimConfig
from helmgr.sim.node import Node


class BatchServer:
    """The node model serves a batch's requests one after the other, sharing their kernel
    launches; with `bypass_caches` (queueing checks) a batch takes exponential draws of service
    instead, no caches."""

    def __init__(self, cfg: SimConfig, history: History, rng: np.random.Generator):
        self.cfg, self.history, self.rng = cfg, history, rng
        self._draws: list[float] = []

    def serve(self, node: Node, batch: list[Request], now: float) -> list[tuple[Request, Service]]:
        if self.cfg.bypass_caches:
            return self._exponential(node, batch, now)
        t, launch, history = now, node.cost.launch_overhead_s, self.history
        served = []
        for req in batch:
            svc = node.serve(t, req.user, req.prefix_len, req.items, req.cands, history)
            served.append((req, svc))
            t = svc.end - launch
        return served

    def _exponential(self, node: Node, batch: list[Request], now: float) -> list[tuple[Request, Service]]:
        begin = max(now, node.blocked_until)
        end = begin + sum(self._draw() for _ in batch)
        return [(req, Service(begin, end, 0, 0, 0, 0, 0.0, 0.0)) for req in batch]

    def _draw(self) -> float:
        if not self._draws:
            self._draws = self.rng.exponential(self.cfg.service_mean_s, 4096).tolist()
        return self._draws.pop()
