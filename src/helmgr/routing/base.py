"""The router interface: where each request goes.

A router keeps its own view of load: requests dispatched to a node and not yet completed,
updated at dispatch and completion (never a stale poll). The cluster tells it which nodes are up.
A router that sets `residency = True` also gets a `ResidencyIndex` fed by the nodes' events.
"""
from __future__ import annotations

import numpy as np

from helmgr.core.costs import CostModel
from helmgr.routing.residency import ResidencyIndex

DOWN = 1 << 40                          # the load a router sees on a node that is down


class Router:
    name = ""
    residency = False                     # True: wants node residency events (see attach)

    def bind(self, n_nodes: int, up: list[bool], rng: np.random.Generator) -> None:
        self.n = n_nodes
        self.up = up                      # shared with the cluster: True while a node serves
        self.rng = rng
        self.load = [0] * n_nodes         # dispatched, not yet completed
        self._turn = 0                    # where the next tie-break scan starts

    def route(self, user: int, prefix_len: int, tokens: int) -> int:
        raise NotImplementedError

    def route_request(self, now: float, user: int, prefix_len: int, new_ids: np.ndarray,
                      cand_ids: np.ndarray, segment: int = -1) -> int:
        """The whole request; routers that look only at the user and its length use `route`.
        `segment`: the user's interest segment, if the workload names one (-1: unknown)."""
        return self.route(user, prefix_len, prefix_len + len(new_ids))

    def attach(self, cost: CostModel, n_items: int, overlapped: bool = False,
               segments: int = 0, emb_sample: int = 1) -> ResidencyIndex | None:
        """The cluster's cost model and item count, whether its nodes fetch a batch's rows while
        the previous batch computes (`overlapped`: the pipelined engine), how many interest
        segments its requests name (0: none) and one in how many item ids EMB caches track; a
        residency router returns the index the cluster should feed."""
        return None

    def dispatched(self, node: int, user: int, tokens: int) -> None:
        self.load[node] += 1

    def completed(self, node: int, now: float = 0.0) -> None:
        self.load[node] -= 1

    def node_down(self, node: int) -> None:
        self.load[node] = DOWN          # never the least loaded while down

    def node_up(self, node: int) -> None:
        self.load[node] = 0

    def _least_loaded(self) -> int:
        """Fewest outstanding requests; ties go to the first node from a start that advances
        every call, so equal nodes take turns instead of the lowest index winning (a C-level
        scan: min, then index)."""
        load, start = self.load, self._turn
        self._turn = start + 1 if start + 1 < self.n else 0
        m = min(load)
        try:
            return load.index(m, start)
        except ValueError:
            return load.index(m)
