"""How a cluster serves a class table (docs/tenancy.md): each node's queue, its KV eviction, the
pools of `--tenancy pools`, and which requests `--tenancy helm` sheds."""
from __future__ import annotations

from collections import deque

from helmgr.routing.base import Router
from helmgr.routing.pools import Pools
from helmgr.sim.config import SimConfig
from helmgr.sim.node import Node
from helmgr.sim.node_queue import ClassQueue


def node_queue(cfg: SimConfig, clock, replaces: deque | ClassQueue | None = None) -> deque | ClassQueue:
    """A node's queue: FCFS, or under a class-aware tenancy a `ClassQueue` reading `clock.now` (the
    cluster's), counting each band's service after the run's warm-up. `replaces`: the queue of a
    node that failed, whose counts the new one carries on."""
    if cfg.tenancy in ("blind", "quota", "pools"):
        return deque()
    q = ClassQueue(cfg.classes, clock, fair=cfg.tenancy == "helm",
                   count_from=cfg.metrics_warmup_s(clock.workload.duration_s))
    if replaces is not None:
        q.own, q.during = replaces.own, replaces.during
    return q


def class_memory(cfg: SimConfig, node: Node) -> None:
    """A fresh node's KV cache under a class-aware tenancy. `helm`: evicted by band, one LRU list
    per band, the lowest band (the highest number) first, each band down to its classes'
    `kv_floor` (memory/kv_table.py `_evict`); each request's prefix goes into its tenant's band.
    `quota`: one static partition per tenant, its share of the traffic, each evicting only its own."""
    t = cfg.classes
    if cfg.tenancy == "helm":
        node.kv.set_groups(t.band_floors)
        node.kv_group = t.tenant_band.tolist()
    elif cfg.tenancy == "quota":
        node.kv.set_groups([x.share for x in t.tenants], quotas=True)
        node.kv_group = list(range(len(t.tenants)))


def tail_scale(cfg: SimConfig, profile) -> list[float] | None:
    """Under `--tenancy helm`, per tenant, what its requests' latencies are multiplied by in the
    nodes' windows, the controller's input: the model's target over the tenant's class's target.
    A window's P99 is then the P99 of the requests' latencies as shares of their own targets (in
    the model's unit), so the class closest to breaking its target fills the tail the controller
    steers by. None (latencies as they are) under every other tenancy."""
    if cfg.tenancy != "helm":
        return None
    t = cfg.classes
    return [profile.model.slo_ms / t.classes[k].slo_ms for k in t.tenant_class]


def pooled(cfg: SimConfig, router: Router) -> Router:
    """The router the cluster routes with: under `--tenancy pools` one copy of `router` per class
    over that class's nodes (routing/pools.py), else `router` itself."""
    if cfg.tenancy != "pools":
        return router
    t = cfg.classes
    return Pools(router, t.pool_sizes(cfg.nodes), t.tenant_class.tolist(), t.class_names)


class Shedding:
    """`--tenancy helm` with a router that predicts completions (the HELM router): a request of a
    sheddable class predicted to finish past its class's target at the node the router chose
    (its best) is refused at once."""

    def __init__(self, limits: list[float]):
        self.limits = limits                 # per tenant: its target (s) if sheddable, else inf

    @classmethod
    def of(cls, cfg: SimConfig, router) -> "Shedding | None":
        """None where nothing is shed: another tenancy, or a router with no predicted completion."""
        if cfg.tenancy != "helm" or not hasattr(router, "last_decision"):
            return None
        t = cfg.classes
        return cls([t.classes[k].slo_ms * 1e-3 if t.classes[k].sheddable else float("inf") for k in t.tenant_class])

    def late(self, router, n: int, tenant: int, now: float) -> bool:
        """Whether a request of `tenant` arriving `now`, just routed to `n`, is predicted to finish
        there past its limit: the node's predicted free time in the router's books, then the
        request's predicted service."""
        limit = self.limits[tenant]
        if limit == float("inf"):
            return False
        return max(router.expected_free(n), now) + router.last_decision.service_s - now > limit


def band_shares(cluster) -> dict[str, float] | None:
    """Under a class queue (`strict`, `helm`), per class, its band's share of the work the nodes
    served while the band was backlogged after the warm-up (the run's measure of its `min_share`
    under `helm`); None under every other tenancy."""
    queues = [s.queue for s in cluster.slots if type(s.queue) is ClassQueue]
    if not queues:
        return None
    t = cluster.cfg.classes
    out = {}
    for c in t.classes:
        if c.band not in queues[0].during:           # a band no tenant is in never waits
            out[c.name] = float("nan")
            continue
        during = sum(q.during[c.band] for q in queues)
        out[c.name] = sum(q.own[c.band] for q in queues) / during if during else float("nan")
    return out
