"""`--tenancy pools`, the baseline of separate nodes per class: the cluster's nodes split into one
pool per class (`ClassTable.pool_sizes`: by the classes' shares of the base traffic), each pool
routed by its own copy of the router over its own nodes and residency index, a request only
within its tenant's class's pool. Nothing is shared between pools, so a busy pool cannot lend a
node to an idle one: the static split the class-aware tenancies are measured against.
"""
from __future__ import annotations

import copy

import numpy as np

from helmgr.core.errors import HelmInputError
from helmgr.routing.base import Router
from helmgr.routing.residency import ResidencyIndex


class Pools(Router):
    """Routers of the pools, seen by the cluster as one router of its global node numbers.
    `route_tenant` routes a request of a tenant; the other verbs take global node numbers and go
    to the pool that owns the node, in its local numbers. The load and up-state are the pools'
    routers' own; this one keeps only the mapping."""

    def __init__(self, router: Router, sizes: list[int], tenant_pool: list[int], names: list[str] | None = None):
        if min(sizes) < 1:
            raise ValueError(f"every pool needs a node, got sizes {sizes}")
        self.name, self.residency = router.name, router.residency
        self.sizes, self.tenant_pool = list(sizes), list(tenant_pool)
        self.names = names or [str(p) for p in range(len(sizes))]            # each pool's class, for errors
        self.pools = [router] + [copy.deepcopy(router) for _ in sizes[1:]]    # unbound: nothing shared
        self.first = np.concatenate([[0], np.cumsum(sizes)[:-1]]).tolist()    # each pool's first global node
        self.where = [(p, i) for p, k in enumerate(sizes) for i in range(k)]  # global node -> (pool, local)

    def bind(self, n_nodes, up, rng):
        if n_nodes != sum(self.sizes):
            raise ValueError(f"pools of {self.sizes} nodes bound to a cluster of {n_nodes}")
        self.n = n_nodes
        self.up_of = [[up[self.first[p] + i] for i in range(k)] for p, k in enumerate(self.sizes)]
        # the first pool draws from the cluster's generator (one pool routes as the router alone would)
        rngs = [rng] + rng.spawn(len(self.sizes) - 1)
        for p, r in enumerate(self.pools):
            r.bind(self.sizes[p], self.up_of[p], rngs[p])

    def attach(self, cost, n_items, overlapped=False, segments=0, emb_sample=1):
        indexes = [r.attach(cost, n_items, overlapped, segments, emb_sample) for r in self.pools]
        return None if indexes[0] is None else PooledIndex(self, indexes)

    def route_tenant(self, tenant: int, now, user, prefix_len, new_ids, cand_ids, segment=-1) -> int:
        """The global node for a request of `tenant`; a pool with every node down has nowhere to
        put it (as a cluster with every node down: `HelmInputError`)."""
        p = self.tenant_pool[tenant]
        if not any(self.up_of[p]):
            raise HelmInputError(f"every node of the pool of class {self.names[p]!r} is down at t={now:.3f} s; "
                                 f"nothing can serve it (--tenancy pools)")
        return self.first[p] + self.pools[p].route_request(now, user, prefix_len, new_ids, cand_ids, segment)

    def route_request(self, now, user, prefix_len, new_ids, cand_ids, segment=-1):
        raise TypeError("pools route by tenant (route_tenant)")

    def dispatched(self, node, user, tokens):
        p, i = self.where[node]
        self.pools[p].dispatched(i, user, tokens)

    def completed(self, node, now=0.0):
        p, i = self.where[node]
        self.pools[p].completed(i, now)

    def node_down(self, node):
        p, i = self.where[node]
        self.up_of[p][i] = False
        self.pools[p].node_down(i)

    def node_up(self, node):
        p, i = self.where[node]
        self.up_of[p][i] = True
        self.pools[p].node_up(i)


class PooledIndex:
    """The cluster's one residency index over the pools' own: a node's reports go to its pool's
    index in that pool's node numbers."""

    def __init__(self, pools: Pools, indexes: list[ResidencyIndex]):
        self.where, self.indexes = pools.where, indexes

    def apply_kv(self, batch) -> None:
        p, i = self.where[batch.node]
        self.indexes[p].apply_kv(batch._replace(node=i))

    def apply_summary(self, s) -> None:
        p, i = self.where[s.node]
        self.indexes[p].apply_summary(s._replace(node=i))
