"""The baseline routers and the registry of every router by name."""
from __future__ import annotations

import bisect
from collections import OrderedDict

from helmgr.core.errors import HelmInputError
from helmgr.core.hashing import hash_uniform_one
from helmgr.routing.base import DOWN, Router
from helmgr.routing.helm import Helm, HelmEmb, HelmKV, HelmLoad

class RoundRobin(Router):
    name = "round-robin"

    def bind(self, n_nodes, up, rng):
        super().bind(n_nodes, up, rng)
        self.next = 0

    def route(self, user, prefix_len, tokens):
        for _ in range(self.n):
            j = self.next
            self.next = j + 1 if j + 1 < self.n else 0
            if self.up[j]:
                return j
        raise RuntimeError("no node is up")


class LeastLoaded(Router):
    name = "least-loaded"

    def route(self, user, prefix_len, tokens):
        return self._least_loaded()


class PowerOfTwo(Router):
    """Two distinct nodes drawn at random; the less loaded one wins (Mitzenmacher 2001)."""

    name = "p2c"
    BLOCK = 4096

    def bind(self, n_nodes, up, rng):
        super().bind(n_nodes, up, rng)
        self._draws, self._pos = [], 0

    def _draw(self) -> tuple[int, int]:
        if self._pos >= len(self._draws):
            a = self.rng.integers(0, self.n, self.BLOCK)
            b = (a + self.rng.integers(1, max(self.n, 2), self.BLOCK)) % self.n
            self._draws, self._pos = list(zip(a.tolist(), b.tolist())), 0
        pair = self._draws[self._pos]
        self._pos += 1
        return pair

    def route(self, user, prefix_len, tokens):
        for _ in range(4 * self.n):
            a, b = self._draw()
            if self.up[a] and self.up[b]:
                return a if self.load[a] <= self.load[b] else b
            if self.up[a] or self.up[b]:
                return a if self.up[a] else b
        return self._least_loaded()


class Affinity(Router):
    """Consistent hashing of user ids on a ring of 64 virtual nodes per node; a down node's users
    move to the next node on the ring."""

    name = "affinity"
    VNODES = 64

    def bind(self, n_nodes, up, rng):
        super().bind(n_nodes, up, rng)
        points = sorted((hash_uniform_one(node * 1_000_003 + v, 11), node)
                        for node in range(n_nodes) for v in range(self.VNODES))
        self.ring = [p for p, _ in points]
        self.owner = [o for _, o in points]

    def route(self, user, prefix_len, tokens):
        i = bisect.bisect(self.ring, hash_uniform_one(user, 13))
        m = len(self.ring)
        for k in range(m):
            node = self.owner[(i + k) % m]
            if self.up[node]:
                return node
        raise RuntimeError("no node is up")


class PrefixAware(Router):
    """KV-prefix-aware routing after SGLang's cache-aware router (sgl-router `cache_aware`): the
    router keeps its own approximate map of where each user's prefix was sent and how long it was
    then. If the cluster is imbalanced (max - min outstanding > `abs_threshold` and max >
    `rel_threshold` x min) it sends the request to the least-loaded node; otherwise to the node
    holding the user's prefix when the match covers at least `cache_threshold` of it, else to the
    least-loaded node. SGLang's defaults are 32 / 1.0001 / 0.5 for LLM batch sizes; with one
    request in service per node, 4 outstanding requests is the comparable imbalance."""

    name = "prefix-aware"
    MEMORY = 1 << 20

    def __init__(self, abs_threshold: int = 4, rel_threshold: float = 1.5, cache_threshold: float = 0.5):
        self.abs_threshold, self.rel_threshold, self.cache_threshold = abs_threshold, rel_threshold, cache_threshold

    def bind(self, n_nodes, up, rng):
        super().bind(n_nodes, up, rng)
        self.where: OrderedDict[int, tuple[int, int]] = OrderedDict()

    def route(self, user, prefix_len, tokens):
        least = self._least_loaded()
        seen = self.where.get(user)
        if seen is None or not self.up[seen[0]]:
            return least
        node, cached = seen
        lo = self.load[least]
        hi = max(l for l in self.load if l < DOWN)
        if hi - lo > self.abs_threshold and hi > self.rel_threshold * lo:
            return least
        if prefix_len and min(cached, prefix_len) >= self.cache_threshold * prefix_len:
            return node
        return least

    def dispatched(self, node, user, tokens):
        self.load[node] += 1
        self.where[user] = (node, tokens)
        self.where.move_to_end(user)
        if len(self.where) > self.MEMORY:
            self.where.popitem(last=False)


ROUTERS = {r.name: r for r in (RoundRobin, LeastLoaded, PowerOfTwo, Affinity, PrefixAware, Helm, HelmKV, HelmEmb,
                               HelmLoad)}
ABLATIONS = ("helm-kv", "helm-emb", "helm-load")     # the HELM router with one term: to measure each term


def make_router(name: str) -> Router:
    try:
        return ROUTERS[name]()
    except KeyError:
        raise HelmInputError(f"unknown router {name!r} (known: {', '.join(ROUTERS)})") from None
