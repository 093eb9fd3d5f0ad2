"""How a simulated node serves the batch it takes when it frees up."""
from __future__ import annotations

import numpy as np

from helmgr.core.records import History, Request, Service
from helmgr.sim.config import SimConfig
from helmgr.sim.node import Node


class BatchServer:
    """How a node serves the batch it takes, by the config's engine:

    - `batched`: one compute for the whole batch on the batch-efficiency curve, after every
      request's rows are resident; the node takes its next batch when this one ends;
    - `pipelined` (two engines): as `batched`, but the node takes its next batch as soon as this
      one starts computing, so the link fetches the next batch's rows during this compute.

    With `bypass_caches` (queueing checks) a batch takes exponential draws of service instead, no
    caches. `serve` returns the services and when the node may take its next batch."""

    def __init__(self, cfg: SimConfig, history: History, rng: np.random.Generator):
        self.cfg, self.history, self.rng = cfg, history, rng
        self._draws: list[float] = []

    def serve(self, node: Node, batch: list[Request], now: float,
              compute_free: float = 0.0) -> tuple[list[tuple[Request, Service]], float]:
        if self.cfg.bypass_caches:
            served = self._exponential(node, batch, now)
            return served, served[-1][1].end
        services, launch = node.serve_batch(now, batch, self.history, compute_free)
        return list(zip(batch, services)), launch if self.cfg.engine == "pipelined" else services[-1].end

    def _exponential(self, node: Node, batch: list[Request], now: float) -> list[tuple[Request, Service]]:
        begin = max(now, node.blocked_until)
        end = begin + sum(self._draw() for _ in batch)
        return [(req, Service(begin, end, 0, 0, 0, 0, 0.0, 0.0, begin)) for req in batch]

    def _draw(self) -> float:
        if not self._draws:
            self._draws = self.rng.exponential(self.cfg.service_mean_s, 4096).tolist()
        return self._draws.pop()
