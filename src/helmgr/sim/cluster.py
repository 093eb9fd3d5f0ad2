"""The cluster simulator's event loop (SPEC 4).

Events live in one heap of `(time, priority, seq, kind, node, generation)`; arrivals come from the
workload's chunks, already in time order, and are merged with the heap: an arrival is handled
after every event due at or before its time. Only the loop advances `now`. Every random draw
comes from generators seeded by the run's seed, so a run replays bit for bit.
"""
from __future__ import annotations

import copy
from collections import deque
from heapq import heappop, heappush

import numpy as np

from helmgr.core.errors import HelmInputError
from helmgr.core.window import node_window
from helmgr.core.records import NodeConfig, Service
from helmgr.sim.node import Node
from helmgr.core.profiles import NodeProfile
from helmgr.sim.config import SimConfig
from helmgr.sim.metrics import Recorder
from helmgr.policy.policies import MemoryPolicy
from helmgr.routing.residency import ResidencyReporter
from helmgr.routing.routers import Router
from helmgr.workload import Workload

# event kinds, in the order they run when due at the same time (arrivals run last)
DEPART, REFILL, DOWN, UP, REFRESH, TICK, WINDOW = range(7)


class Cluster:
    def __init__(self, cfg: SimConfig, workload: Workload, profile: NodeProfile, router: Router,
                 policy: MemoryPolicy, on_progress=None):
        self.cfg, self.workload, self.profile = cfg, workload, profile
        self.router, self.policy = router, policy
        self.on_progress = on_progress
        n = cfg.nodes
        self.node_config = NodeConfig(ratio=cfg.ratio, r_min=cfg.r_min, r_max=cfg.r_max, refill=cfg.refill,
                                      refill_share=cfg.refill_share, emb_policy=cfg.emb_policy,
                                      kv_tail_first=cfg.kv_tail_first, host_kv_gib=cfg.host_kv_gib)
        self.ids_per_refresh = self._ids_per_refresh()
        self.nodes = [self._fresh_node(i) for i in range(n)]
        self.retired: list[Node] = []            # nodes replaced after a failure, for the totals
        self.queues = [deque() for _ in range(n)]
        self.shared: deque = deque()             # the central queue, when cfg.central_queue
        self.busy = [False] * n
        self.up = [True] * n
        self.gen = [0] * n
        self.inflight: list[list] = [[] for _ in range(n)]
        self.refill_at: list[float | None] = [None] * n
        self.rng = np.random.default_rng([cfg.seed, 101])
        router.bind(n, self.up, np.random.default_rng([cfg.seed, 102]))
        self.heap: list = []
        self.seq = 0
        self.now = 0.0
        self.index = router.attach(self.nodes[0].cost, workload.n_items)
        self.reporters: list[ResidencyReporter] | None = None
        if self.index is not None:
            self.reporters = [ResidencyReporter(i, node) for i, node in enumerate(self.nodes)]
            for i in range(n):
                self.report(i, emb=True)
        self.rec = Recorder(n)
        self._win_latency: list[list[float]] = [[] for _ in range(n)]
        self._win_parts: list[list[tuple[float, float]]] = [[] for _ in range(n)]   # (fetch, recompute)
        self._win_arrivals = [0] * n
        self._win_prev: list[tuple] = [node.counters() for node in self.nodes]
        for i, node in enumerate(self.nodes):
            policy.attach(i, node)
        self.rerouted = 0
        self.stop_periodic = False               # set once the last arrival is in: ticks etc. stop
        self.next_rid = 0
        self.watch_from, self.watch_done = 1 << 62, 0
        self._service_draws: list[float] = []
        for i, node in enumerate(self.nodes):
            self.rec.ratio_change(0.0, i, node.ratio)

    # -- set-up ---------------------------------------------------------------------------
    def _ids_per_refresh(self) -> float:
        """Accesses a node sees per refresh, estimated from the first simulated second: scales the
        warm-start prior into count units."""
        ids, requests, span_s = self.workload.first_second_lookups()
        if not requests:
            return 1.0
        return ids / max(span_s, 1e-9) * self.cfg.refresh_s / self.cfg.nodes

    def _fresh_node(self, i: int) -> Node:
        node = Node(self.profile, self.workload.n_items, self.node_config, node_id=i)
        if self.workload.prior is not None:
            node.emb.warm(self.workload.prior, per_refresh=self.ids_per_refresh)
        return node

    def push(self, t: float, kind: int, node: int = -1) -> None:
        self.seq += 1
        heappush(self.heap, (t, kind, self.seq, kind, node, self.gen[node] if node >= 0 else 0))

    # -- the loop -------------------------------------------------------------------------
    def run(self) -> None:
        """The whole workload: begin, feed every chunk, finish."""
        self.begin()
        for chunk in self.workload.chunks(1.0):
            self.feed(chunk)
            if self.on_progress and len(chunk):
                self.on_progress(min(float(chunk.t[-1]), self.workload.duration_s))
        self.finish()

    def begin(self) -> None:
        cfg = self.cfg
        self.push(cfg.tick_s, TICK)
        self.push(cfg.refresh_s, REFRESH)
        self.push(cfg.window_s, WINDOW)
        for f in cfg.faults:
            self.push(f.down_s, DOWN, f.node)
            if f.up_s is not None:
                self.push(f.up_s, UP, f.node)
        self.next_rid = 0

    def feed(self, chunk) -> None:
        """Arrive every request of `chunk`, each after the events due at or before its time."""
        heap, handle = self.heap, self._handle
        ts, users, prefix = chunk.t.tolist(), chunk.user.tolist(), chunk.prefix_len.tolist()
        io, co, burst = chunk.item_offsets.tolist(), chunk.cand_offsets.tolist(), chunk.burst.tolist()
        items, cands = chunk.item_ids, chunk.cand_ids
        rid = self.next_rid
        for i, t in enumerate(ts):
            while heap and heap[0][0] <= t:
                handle(heappop(heap))
            self.now = t
            self.arrive([rid, t, users[i], prefix[i], items[io[i]:io[i + 1]], cands[co[i]:co[i + 1]], burst[i], 0])
            rid += 1
        self.next_rid = rid

    def finish(self) -> None:
        """No more arrivals: stop the periodic events and run until every request is done."""
        self.stop_periodic = True
        heap, handle = self.heap, self._handle
        while heap:
            handle(heappop(heap))
        self.rec.requests = self.next_rid

    def watch(self) -> None:
        """Count completions of the requests fed from now on (for `run_until_served`)."""
        self.watch_from, self.watch_done = self.next_rid, 0

    def run_until_served(self) -> None:
        """Process events until every watched request has completed. Later arrivals could never
        have delayed them (queues and the link are FIFO), so this is their whole story."""
        heap, handle = self.heap, self._handle
        while self.watch_done < self.next_rid - self.watch_from and heap:
            handle(heappop(heap))

    def _handle(self, ev) -> None:
        t, _, _, kind, node, gen = ev
        self.now = t
        if kind == DEPART:
            if gen == self.gen[node]:
                self.depart(node)
        elif kind == REFILL:
            if gen == self.gen[node]:
                self.refill_at[node] = None
                self._schedule_refill(node, self.nodes[node].refill_step(t))
        elif kind == TICK:
            self.tick()
        elif kind == REFRESH:
            self.refresh()
        elif kind == WINDOW:
            self.window()
        elif kind == DOWN:
            self.node_down(node)
        elif kind == UP:
            self.node_up(node)

    # -- requests -------------------------------------------------------------------------
    def arrive(self, req: list) -> None:
        user, prefix = req[2], req[3]
        if not any(self.up):
            raise HelmInputError(f"every node is down at t={self.now:.3f} s; nothing can serve")
        if self.cfg.central_queue:
            idle = next((i for i in range(len(self.busy)) if self.up[i] and not self.busy[i]), None)
            if idle is None:
                self.shared.append(req)
            else:
                self.start(idle, [req])
            return
        n = self.router.route_request(self.now, user, prefix, req[4], req[5])
        self.router.dispatched(n, user, prefix + len(req[4]))
        self._win_arrivals[n] += 1
        if self.busy[n]:
            self.queues[n].append(req)
        else:
            self.start(n, [req])

    def start(self, n: int, batch: list) -> None:
        node, now = self.nodes[n], self.now
        q = self.shared if self.cfg.central_queue else self.queues[n]
        while len(batch) < self.cfg.max_batch and q:
            batch.append(q.popleft())
        end = now
        served = []
        if self.cfg.bypass_caches:                # queueing checks: exponential service, no caches
            begin = max(now, node.blocked_until)
            end = begin + sum(self._service_time() for _ in batch)
            served = [(req, Service(begin, end, 0, 0, 0, 0, 0.0, 0.0)) for req in batch]
        else:
            t = now
            launch = node.cost.launch_overhead_s
            for k, req in enumerate(batch):
                svc = node.serve(t, req[2], req[3], req[4], req[5], self.workload.history)
                served.append((req, svc))
                end = svc.end
                t = svc.end - launch      # a batch shares its kernel launches
            if self.reporters is not None:
                self.report(n)
        self.busy[n] = True
        self.inflight[n] = served
        self.push(end, DEPART, n)

    def _service_time(self) -> float:
        if not self._service_draws:
            self._service_draws = self.rng.exponential(self.cfg.service_mean_s, 4096).tolist()
        return self._service_draws.pop()

    def depart(self, n: int) -> None:
        now, rec, router = self.now, self.rec, self.router
        central = self.cfg.central_queue
        lat = self._win_latency[n]
        parts = self._win_parts[n]
        for req, svc in self.inflight[n]:
            rec.complete(req, svc, n, now)
            if req[0] >= self.watch_from:
                self.watch_done += 1
            lat.append(now - req[1])
            parts.append((svc.fetch_s, svc.recompute_s))
            if not central:
                router.completed(n, now)
        self.inflight[n] = []
        self.busy[n] = False
        q = self.shared if central else self.queues[n]
        if q:
            self.start(n, [q.popleft()])

    def report(self, n: int, emb: bool = False) -> None:
        """Deliver node n's residency reports to the router's index: its KV events, and with
        `emb` a fresh EMB summary (after a refresh or resize)."""
        rep = self.reporters[n]
        batch = rep.kv_batch()
        if batch is not None:
            self.index.apply_kv(batch)
        if emb:
            self.index.apply_summary(rep.summary(self.now))

    # -- windows --------------------------------------------------------------------------
    def window(self) -> None:
        """Close a metrics window: record it, and show each up node's window to the policy."""
        now, span = self.now, self.cfg.window_s
        self.rec.window(now, [len(q) for q in self.queues])
        for i, node in enumerate(self.nodes):
            cur = node.counters()
            w = node_window(i, now, span, node.ratio, self._win_arrivals[i], self._win_latency[i],
                            len(self.queues[i]), cur.since(self._win_prev[i]), self._win_parts[i])
            self._win_prev[i] = cur
            self._win_latency[i], self._win_parts[i], self._win_arrivals[i] = [], [], 0
            if self.up[i]:
                self.policy.observe(i, w, node)
        if not self.stop_periodic:
            self.push(now + span, WINDOW)

    # -- memory ---------------------------------------------------------------------------
    def _schedule_refill(self, n: int, wake: float | None) -> None:
        if wake is not None and self.refill_at[n] is None:
            self.refill_at[n] = wake
            self.push(wake, REFILL, n)

    def tick(self) -> None:
        now = self.now
        for i, node in enumerate(self.nodes):
            if self.up[i]:
                ratio = self.policy.decide(i, node, now)
                if ratio is not None:
                    self.set_ratio(i, ratio)
        if not self.stop_periodic:
            self.push(now + self.cfg.tick_s, TICK)

    def set_ratio(self, i: int, ratio: float) -> None:
        """Resize node i's pool now (if that moves a page) and start its refill."""
        node = self.nodes[i]
        if node.pool.pages_for(ratio) != node.pool.emb_pages:
            _, wake = node.resize(ratio, self.now)
            self._schedule_refill(i, wake)
            self.rec.ratio_change(self.now, i, node.ratio)
            if self.reporters is not None:
                self.report(i, emb=True)

    # -- replays (the oracle) --------------------------------------------------------------
    def advance(self, t: float) -> None:
        """Process every event due at or before t; the clock then reads t."""
        heap, handle = self.heap, self._handle
        while heap and heap[0][0] <= t:
            handle(heappop(heap))
        self.now = max(self.now, t)

    def fork(self) -> "Cluster":
        """An independent copy to replay from: same state, a fresh recorder, shared workload."""
        memo = {id(self.workload): self.workload, id(self.profile): self.profile,
                id(self.rec): Recorder(self.cfg.nodes)}
        return copy.deepcopy(self, memo)

    def refresh(self) -> None:
        for i, node in enumerate(self.nodes):
            if self.up[i]:
                self._schedule_refill(i, node.refresh(self.now))
                if self.reporters is not None:
                    self.report(i, emb=True)
        if not self.stop_periodic:
            self.push(self.now + self.cfg.refresh_s, REFRESH)

    # -- faults ---------------------------------------------------------------------------
    def node_down(self, n: int) -> None:
        """Node n fails: its queued and in-service requests are routed again (counted)."""
        if not self.up[n]:
            return
        self.up[n] = False
        self.gen[n] += 1
        stranded = [req for req, _ in self.inflight[n]] + list(self.queues[n])
        self.inflight[n], self.queues[n] = [], deque()
        self.busy[n] = False
        self.refill_at[n] = None
        self.router.node_down(n)
        self.rec.ratio_change(self.now, n, None)
        for req in stranded:
            req[7] = 1
        self.rerouted += len(stranded)
        if self.cfg.central_queue:
            self.shared.extendleft(reversed(stranded))
            self._start_idle()
        else:
            for req in stranded:
                self.arrive(req)

    def _start_idle(self) -> None:
        for i in range(len(self.busy)):
            if self.up[i] and not self.busy[i] and self.shared:
                self.start(i, [self.shared.popleft()])

    def node_up(self, n: int) -> None:
        if self.up[n]:
            return
        self.retired.append(self.nodes[n])
        self.nodes[n] = self._fresh_node(n)     # HBM state is gone: cold KV, EMB reloaded warm
        self._win_prev[n] = self.nodes[n].counters()
        self.policy.attach(n, self.nodes[n])
        self.up[n] = True
        self.router.node_up(n)
        if self.reporters is not None:
            self.reporters[n] = ResidencyReporter(n, self.nodes[n], after=self.reporters[n])
            self.report(n, emb=True)
        self.rec.ratio_change(self.now, n, self.nodes[n].ratio)
        if self.cfg.central_queue:
            self._start_idle()
