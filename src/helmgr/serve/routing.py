"""The HELM router's state inside a Ray Serve request router, without Ray.

`HelmRouting` keeps the simulator's `Helm` router and its `ResidencyIndex` and adds what a
serving router needs around them:
- replica ids <-> node indices (`ReplicaNodes`): a replica that appears takes the lowest free
  index; one that leaves (died, scaled down) is a node down, its residency forgotten; an index
  that a new replica takes starts from version 0 again (the new replica numbers its reports anew);
- replica reports (`helmgr.serve.report`) applied to the index at every replica-set broadcast;
- in-flight work counted in the router itself: +1 when a replica accepts a request, -1 when
  it completes. Ray calls the completion hook for sends a replica *rejected* too (they are
  cancelled) and for errors, so only keys that were counted in are counted out.
The decision itself is `Helm.route_request`, unchanged; the remaining candidates follow in the
order of when the router expects them to be free, as fallbacks.
"""
from __future__ import annotations

import time
from collections import Counter, OrderedDict
from typing import Callable, Hashable

import numpy as np

from helmgr.core.costs import CostModel
from helmgr.routing.helm import Decision, Helm
from helmgr.serve.config import ServeConfig
from helmgr.routing.report import apply_report


class ReplicaNodes:
    """Replica id <-> node index, for at most `capacity` replicas at once."""

    def __init__(self, capacity: int):
        self.of: dict[Hashable, int] = {}
        self.ids: list[Hashable | None] = [None] * capacity

    def sync(self, replica_ids) -> tuple[list[int], list[int]]:
        """Make the mapping hold exactly `replica_ids` (those beyond capacity stay unmapped).
        Returns (nodes added, nodes removed)."""
        keep = set(replica_ids)
        removed = [self.of.pop(r) for r in list(self.of) if r not in keep]
        for n in removed:
            self.ids[n] = None
        added = []
        for r in replica_ids:
            if r in self.of or None not in self.ids:
                continue
            n = self.ids.index(None)
            self.of[r], self.ids[n] = n, r
            added.append(n)
        return added, removed


class HelmRouting:
    CHOICES = 1 << 14          # decisions remembered until their request is accepted somewhere

    def __init__(self, cfg: ServeConfig, capacity: int | None = None, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        capacity = capacity or 2 * cfg.replicas + 2
        self.nodes = ReplicaNodes(capacity)
        self.helm = Helm()
        self.helm.bind(capacity, [False] * capacity, np.random.default_rng(cfg.seed))
        self.index = self.helm.attach(CostModel.from_profile(cfg.node_profile()), cfg.n_items)
        for n in range(capacity):
            self.helm.node_down(n)
        self.open: Counter = Counter()                 # (replica id, request id) -> accepted, not completed
        self.choices: OrderedDict[str, Decision] = OrderedDict()
        self.bad_reports = 0

    # -- replica set ----------------------------------------------------------------------
    def sync(self, replicas: list[tuple[Hashable, dict]]) -> None:
        """The deployment's running replicas with their latest reports."""
        added, removed = self.nodes.sync([rid for rid, _ in replicas])
        for n in removed:
            self.helm.node_down(n)
        for n in added:
            self.index.reset(n)
            self.helm.node_up(n)
        self.open = Counter({k: v for k, v in self.open.items() if k[0] in self.nodes.of})
        for rid, stats in replicas:
            n = self.nodes.of.get(rid)
            if n is not None and not apply_report(self.index, n, stats):
                self.bad_reports += 1

    def drop(self, replica_id: Hashable) -> None:
        """A replica died: a node down until Ray's next broadcast says otherwise."""
        self.sync([(r, {}) for r in self.nodes.of if r != replica_id])

    # -- decisions ------------------------------------------------------------------------
    def rank(self, replica_ids: list[Hashable], request_id: str | None, user: int | None, prefix_len: int = 0,
             new_ids: np.ndarray | None = None, cand_ids: np.ndarray | None = None) -> list[Hashable]:
        """`replica_ids` in order of preference: HELM's choice first, then by expected free time."""
        free = self.helm.expected_free
        key = lambda r: (0, free(self.nodes.of[r])) if r in self.nodes.of else (1, 0.0)
        order = sorted(replica_ids, key=key)
        if user is None or new_ids is None or cand_ids is None:
            return order
        node = self.helm.route_request(self.clock(), user, prefix_len, new_ids, cand_ids)
        chosen = self.nodes.ids[node]
        if request_id is not None and chosen in replica_ids:
            self.choices[request_id] = self.helm.last_decision
            if len(self.choices) > self.CHOICES:
                self.choices.popitem(last=False)
        if chosen in replica_ids:
            order.remove(chosen)
            order.insert(0, chosen)
        return order

    def routed(self, replica_id: Hashable, request_id: str, user: int | None, tokens: int) -> None:
        """A replica accepted the request."""
        n = self.nodes.of.get(replica_id)
        if n is None:
            return
        self.open[(replica_id, request_id)] += 1
        # priced with the decision made for this request (later decisions may have come between)
        decision = self.choices.pop(request_id, Decision(-1, 0.0))
        self.helm.dispatched(n, -1 if user is None else user, tokens, decision)

    def completed(self, replica_id: Hashable, request_id: str) -> None:
        key = (replica_id, request_id)
        if self.open.get(key, 0) <= 0:              # a rejected send, or one counted out already
            return
        self.open[key] -= 1
        if not self.open[key]:
            del self.open[key]
        self.helm.completed(self.nodes.of[replica_id], self.clock())

    def in_flight(self, replica_id: Hashable) -> int:
        n = self.nodes.of.get(replica_id)
        return 0 if n is None else self.helm.load[n]
