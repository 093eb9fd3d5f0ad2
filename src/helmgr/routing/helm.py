"""The HELM router (docs/routing.md) and its ablations."""
from __future__ import annotations

import inspect
from collections import deque
from heapq import heapify, heappop, heappush
from typing import NamedTuple

import numpy as np

from helmgr.routing import kernel as route_kernel
from helmgr.routing.base import Router
from helmgr.routing.kernel import decide as _decide
from helmgr.routing.residency import HISTORY_MISS, ResidencyIndex

FREE_HEAP = 4        # the free-time heap is rebuilt past this many entries a node, plus 64 (Helm._moved)


class Decision(NamedTuple):
    """A routing decision: the node and what its books take on for the request there (its
    predicted service; on pipelined nodes, its predicted completion less when the node would
    have run out of work: compute alone behind other work)."""

    node: int
    service_s: float


class Helm(Router):
    """The HELM router: send each request where it is predicted to finish first.

    For each candidate node, predicted completion = when the node runs out of the work this router
    has sent it (each request's predicted service, added at dispatch; at a completion the node's
    clock restarts from now plus what is still outstanding) or, if later, when a sync refill
    releases it + the request's predicted service there from the cost model (on nodes whose link
    fetches a batch's rows while the batch before it computes, `attach(..., overlapped=True)`: the
    larger of that and when its rows are in, + its compute, and the node's books move to that
    completion; `overlap=False` prices and books them in series): the prefix positions
    the node does not hold are recomputed and their rows looked up, the request's rows miss where
    the node's hot-set summary says they are absent (new-token ids exactly, candidates from an
    evenly spaced sample of `sample`), the recomputed prefix rows miss at the node's reported
    history miss rate, and a node with background refill traffic adds one refill chunk to the
    misses' wait. To that comes the work the placement wastes (its service beyond the cheapest
    candidate's) times the number of later requests it delays, (rho + rate x backlog) / (1 - rho)
    from the router's own load estimate, or a fixed `waste` weight. On nodes whose link fetches a
    batch's rows while the previous batch computes (`attach(..., overlapped=True)`: the pipelined
    engine) the waste is the compute part alone: there a miss's link time delays no later request
    unless the link binds, and counting it made the least-missing node take every cold history
    in a burst (`link_waste` sets it either way). One unit, seconds; the minimum wins, exact ties
    go to a seeded draw. docs/routing.md has the reasoning and figures.

    Candidates: the nodes that hold the user's prefix, the node that runs out of work first in the
    router's books (a heap of free times kept at dispatch, completion and failure), `d` nodes
    drawn at random, and the least busy node of the previous decision (power of d choices with
    memory: Mitzenmacher, Prabhakar and Shah, 2002), so a decision costs O(1) in cluster size.

    Homes: a request whose user holds no prefix anywhere (a new session) and names an interest
    segment (the cluster attaches the workload's count) also prices its segment's home node
    (`kernel.home_node`), and goes there unless home would finish later than the best other
    candidate by more than `home_slack` x its service at home x (1 - rho) (rho: the router's load
    estimate; `home_by_load` False: without the load factor; `home_slack_s`: a slack in seconds
    instead of the share; a slack of 0: no homes). A session then stays where its prefix is, so
    each node's EMB cache comes to hold its segments' rows and misses less on them, which the
    bitmap prices; the slack is what starts it, since all caches begin alike (docs/routing.md,
    Homes).

    Ablations: `kv_term=False` knows nothing of prefixes (every node recomputes, holders are not
    candidates), `emb_term=False` prices every node's misses at the cluster's mean rate.
    """

    name = "helm"
    residency = True
    BLOCK = 4096

    RHO_SPAN_S = 0.5            # how often the load estimate behind the waste weight is renewed
    MAX_WASTE = 1000.0          # the most later requests one placement's waste is taken to delay

    HOME_SLACK = 1.0            # how much later a new session may finish at its home node and still go there,
                                # as a share of its service there, on an idle cluster: x (1 - rho) at load rho
                                # (docs/routing.md, Homes)

    def __init__(self, d: int = 2, kv_term: bool = True, emb_term: bool = True, sample: int = 32,
                 waste: float | None = None, link_waste: bool | None = None, home_slack: float | None = None,
                 home_slack_s: float | None = None, home_by_load: bool = True, overlap: bool = True):
        home_slack = self.HOME_SLACK if home_slack is None else home_slack
        slack = home_slack if home_slack_s is None else home_slack_s
        if d < 1 or sample < 1 or (waste is not None and not waste >= 0) or not slack >= 0:
            raise ValueError(f"helm router needs d >= 1, sample >= 1, waste >= 0, home slack >= 0; got {d}, "
                             f"{sample}, {waste}, {slack}")
        self.d, self.kv_term, self.emb_term, self.sample, self.waste = d, kv_term, emb_term, sample, waste
        self.link_waste, self.home_slack, self.home_slack_s = link_waste, home_slack, home_slack_s
        self.home_by_load, self.overlap = home_by_load, overlap

    @classmethod
    def revision(cls) -> str:
        """The defaults a stored result of this router depends on (evaluation keys, the
        showcase's stored capacity), read from the constructor's defaults and the class constants,
        so that changing any of them makes another revision: `helm(d=2,...,HOME_SLACK=1.0,...)`."""
        defaults = [f"{k}={v.default}" for k, v in inspect.signature(cls.__init__).parameters.items() if k != "self"]
        constants = [f"{k}={getattr(cls, k)}" for k in ("HOME_SLACK", "RHO_SPAN_S", "MAX_WASTE", "BLOCK")]
        return f"{cls.name}({','.join(defaults + constants)})"

    def bind(self, n_nodes, up, rng):
        super().bind(n_nodes, up, rng)
        self.mine = np.zeros((n_nodes, 2))     # FREE: when the node runs out of the work sent to it; UP
        self.mine[:, route_kernel.UP] = 1.0
        self.work = [0.0] * n_nodes             # predicted service of the requests outstanding there
        self.pending = [deque() for _ in range(n_nodes)]
        self.index: ResidencyIndex | None = None
        self._draws = np.zeros(0)
        self._now = 0.0
        self.rho = 0.0                          # load estimate: predicted work sent / capacity, EWMA
        self.rate = 0.0                         # requests sent per node-second, EWMA
        self._work_sent, self._sent, self._rho_t = 0.0, 0, 0.0
        self._last = (-1, 0.0)                  # (node, predicted service): priced at the next dispatch
        self._freeing = [(0.0, i, 0) for i in range(n_nodes)]   # heap of (FREE, node, version): soonest first
        self._version = [0] * n_nodes

    def attach(self, cost, n_items, overlapped=False, segments=0, emb_sample=1):
        shift = emb_sample.bit_length() - 1
        self.index = ResidencyIndex(self.n, -(-n_items >> shift), shift)
        link_waste = not overlapped if self.link_waste is None else self.link_waste
        self.consts = route_kernel.constants(cost, self.emb_term, self.d, self.sample, self.waste, self.MAX_WASTE,
                                             link_waste, segments,
                                             self.home_slack if self.home_slack_s is None else self.home_slack_s,
                                             self.home_by_load, self.home_slack_s is None, shift,
                                             overlapped and self.overlap)
        self.consts[route_kernel.N_UP] = self.mine[:, route_kernel.UP].sum()
        self._clean()
        # the index's containers, held directly (they are updated in place, never replaced)
        self._holders, self._bits, self._node = self.index.holders, self.index.bits, self.index.node
        self._left = 0
        return self.index

    def route_request(self, now, user, prefix_len, new_ids, cand_ids, segment=-1):
        self._now = now
        hn0 = ht0 = hn1 = ht1 = -1
        where = self._holders.get(user) if self.kv_term else None
        if where:
            if len(where) == 1:
                (hn0, ht0), = where.items()
            else:                               # the two longest cached prefixes
                (hn0, ht0), (hn1, ht1) = sorted(where.items(), key=lambda kv: -kv[1])[:2]
        if now - self._rho_t >= self.RHO_SPAN_S:
            self._update_load(now)
        self._left -= 1
        if self._left < 0:                      # a fresh block of draws (the kernel walks c[POS])
            self._draws = self.rng.random(self.BLOCK * (self.d + route_kernel.DRAWS))
            self.consts[route_kernel.POS] = 0
            self._left = self.BLOCK - 1
        node, svc = _decide(now, prefix_len, new_ids, cand_ids, hn0, ht0, hn1, ht1, user, segment, self._draws,
                            self._bits, self._node, self.mine, self.consts)
        if node < 0:                            # every candidate was down
            node, svc = self._least_loaded(), 0.0
        self._last = (node, svc)               # a plain tuple: a NamedTuple here costs 0.2 us a decision
        return node

    def _update_load(self, now: float) -> None:
        """Renew the load estimate behind the waste weight: predicted work sent per node-second
        (rho) and requests sent per node-second (rate), EWMA over RHO_SPAN_S spans."""
        span = now - self._rho_t
        up = int(self.mine[:, route_kernel.UP].sum())
        if span > 0 and up:
            rho, rate = self._work_sent / (span * up), self._sent / (span * up)
            first = self._rho_t == 0.0
            self.rho = rho if first else 0.5 * self.rho + 0.5 * rho
            self.rate = rate if first else 0.5 * self.rate + 0.5 * rate
        self._work_sent, self._sent, self._rho_t = 0.0, 0, now
        self.consts[route_kernel.RHO], self.consts[route_kernel.RATE] = self.rho, self.rate
        if not self.emb_term:                   # helm-kv prices misses at the cluster's mean rate
            self.consts[route_kernel.MEAN_MISS] = float(self.index.node[:, HISTORY_MISS].mean())

    @property
    def last_decision(self) -> Decision:
        """The decision `route_request` made last (what `dispatched` prices by default)."""
        return Decision(*self._last)

    def expected_free(self, node: int) -> float:
        """When `node` runs out of the work this router has sent it (router-local)."""
        return float(self.mine[node, route_kernel.FREE])

    def dispatched(self, node, user, tokens, decision: Decision | None = None):
        """The request went to `node`, priced by `decision` (default: the last one made; a
        serving router that decides ahead of the dispatch passes the decision it kept)."""
        self.load[node] += 1
        chosen, svc = self._last if decision is None else decision
        if chosen != node:                      # placed by someone else: price it like the average
            svc = self.work[node] / len(self.pending[node]) if self.pending[node] else 0.0
        self._work_sent += svc
        self._sent += 1
        row = self.mine[node]
        free = row[route_kernel.FREE]
        row[route_kernel.FREE] = (free if free > self._now else self._now) + svc
        self.work[node] += svc
        self.pending[node].append(svc)
        self._moved(node)
        if self.kv_term:
            self.index.expect(node, user, tokens)

    def completed(self, node, now=0.0):
        self.load[node] -= 1
        if self.pending[node]:
            self.work[node] -= self.pending[node].popleft()
        if not self.pending[node]:
            self.work[node] = 0.0               # no float drift across an idle period
        self.mine[node, route_kernel.FREE] = now + self.work[node]
        self._moved(node)

    def _moved(self, node: int) -> None:
        """Node's FREE changed: its heap entry is renewed (older ones go stale)."""
        self._version[node] += 1
        heap = self._freeing
        heappush(heap, (self.mine[node, route_kernel.FREE], node, self._version[node]))
        if len(heap) > FREE_HEAP * self.n + 64:  # stale entries pile up behind late ones: rebuild
            free = self.mine[:, route_kernel.FREE]
            heap[:] = [(free[i], i, self._version[i]) for i in range(self.n)]
            heapify(heap)
        self._clean()

    def _clean(self) -> None:
        """Drop stale and down entries off the heap's top, so that its top is the up node whose
        FREE is earliest; hand it to the kernel (-1: none). Done at dispatch, completion and
        failure, never inside a decision."""
        heap, version, up = self._freeing, self._version, self.mine[:, route_kernel.UP]
        while heap and (heap[0][2] != version[heap[0][1]] or not up[heap[0][1]]):
            heappop(heap)
        if hasattr(self, "consts"):
            self.consts[route_kernel.SOONEST] = heap[0][1] if heap else -1

    def _soonest(self) -> int:
        return int(self.consts[route_kernel.SOONEST])

    def _count_up(self) -> None:
        """The kernel's count of up nodes: with d or fewer up, it prices every one of them (a
        cluster that lists more slots than it has nodes, such as a serving app's, would otherwise
        draw down slots and leave a user's prefix holder without a rival)."""
        if hasattr(self, "consts"):
            self.consts[route_kernel.N_UP] = self.mine[:, route_kernel.UP].sum()

    def node_up(self, node):
        super().node_up(node)
        self.mine[node, route_kernel.UP] = 1.0
        self._count_up()
        self._moved(node)

    def node_down(self, node):
        super().node_down(node)
        self.mine[node] = 0.0                  # FREE and UP
        self._count_up()
        self.pending[node].clear()
        self.work[node] = 0.0
        self._version[node] += 1                # its heap entries go stale
        self._clean()
        if self.index is not None:
            self.index.forget(node)


class HelmKV(Helm):
    """Ablation: KV term + load (every node's misses priced at the cluster's mean rate)."""

    name = "helm-kv"

    def __init__(self, **kw):
        super().__init__(**({"emb_term": False} | kw))


class HelmEmb(Helm):
    """Ablation: EMB term + load (no knowledge of prefixes)."""

    name = "helm-emb"

    def __init__(self, **kw):
        super().__init__(**({"kv_term": False} | kw))


class HelmLoad(Helm):
    """Ablation: load only (predicted work, power of d choices with memory)."""

    name = "helm-load"

    def __init__(self, **kw):
        super().__init__(**({"kv_term": False, "emb_term": False} | kw))
