"""The cluster simulator's event loop.

Events live in one heap of `(time, priority, seq, kind, node, generation)`; arrivals come from the
workload's chunks, already in time order, and are merged with the heap: an arrival is handled
after every event due at or before its time. Only the loop advances `now`. Every random draw
comes from generators seeded by the run's seed, so a run replays bit for bit. The periodic
events (windows, ticks, refreshes) and node resizes are `Periodic`'s (`periodic.py`), node
failures `Faults`' (`faults.py`).
"""
from __future__ import annotations

import copy
from collections import deque
from dataclasses import dataclass, field
from heapq import heappop, heappush

import numpy as np

from helmgr.core.errors import HelmInputError
from helmgr.core.profiles import NodeProfile
from helmgr.core.records import NodeConfig, Request
from helmgr.policy.base import MemoryPolicy
from helmgr.routing.residency import ResidencyReporter
from helmgr.routing.pools import Pools
from helmgr.routing.routers import Router
from helmgr.sim.config import SimConfig
from helmgr.sim.events import DEPART, DOWN, LAUNCH, REFILL, REFRESH, TICK, UP, WINDOW
from helmgr.sim.faults import Faults
from helmgr.sim.metrics import Recorder
from helmgr.sim.node import Node
from helmgr.sim.node_queue import ClassQueue
from helmgr.sim.tenancy import Shedding, class_memory, node_queue, pooled, tail_scale
from helmgr.sim.periodic import Periodic
from helmgr.sim.service import BatchServer
from helmgr.sim.windows import WindowBook
from helmgr.workload import Workload


@dataclass(slots=True, eq=False)
class Slot:
    """One place in the cluster: the node serving there, its queue and what it is doing."""

    node: Node
    queue: deque | ClassQueue = field(default_factory=deque)
    busy: bool = False               # a batch is being taken in (the node takes no other until it frees)
    gen: int = 0                     # bumped when the node fails: events it had pending go stale
    inflight: deque = field(default_factory=deque)    # batches in service, oldest first: ([(Request, Service)], frees at end)
    compute_free: float = 0.0        # when the node's compute engine finishes its last batch
    refill_at: float | None = None   # when the refill mode's next step is due (one at a time)


class Cluster(Faults, Periodic):
    def __init__(self, cfg: SimConfig, workload: Workload, profile: NodeProfile, router: Router,
                 policy: MemoryPolicy, on_progress=None):
        self.cfg, self.workload, self.profile = cfg, workload, profile
        self.router = router = pooled(cfg, router)
        self.policy = policy
        self.on_progress = on_progress
        n = cfg.nodes
        self.node_config = NodeConfig(ratio=cfg.ratio, r_min=cfg.r_min, r_max=cfg.r_max, refill=cfg.refill,
                                      refill_share=cfg.refill_share, emb_policy=cfg.emb_policy,
                                      kv_tail_first=cfg.kv_tail_first, host_kv_gib=cfg.host_kv_gib,
                                      emb_sample=cfg.emb_sample)
        self.ids_per_refresh = self._ids_per_refresh()
        self._warmed_emb = None                  # the first node's warm EMB cache: the others copy it
        self.slots = [Slot(self._fresh_node(i), node_queue(cfg, self)) for i in range(n)]
        self.retired: list[Node] = []            # nodes replaced after a failure, for the totals
        self.shared: deque = deque()             # the central queue, when cfg.central_queue
        self.up = [True] * n                     # shared with the router (it routes to up nodes only)
        self.server = BatchServer(cfg, workload.history, np.random.default_rng([cfg.seed, 101]))
        router.bind(n, self.up, np.random.default_rng([cfg.seed, 102]))
        self.heap: list = []
        self.seq = 0
        self.now = 0.0
        self.index = router.attach(self.slots[0].node.cost, workload.n_items, overlapped=cfg.engine == "pipelined",
                                   segments=workload.n_segments, emb_sample=cfg.emb_sample)
        self.reporters: list[ResidencyReporter] | None = None
        if self.index is not None:
            self.reporters = [ResidencyReporter(i, s.node) for i, s in enumerate(self.slots)]
            for i in range(n):
                self.report(i, emb=True)
        self.rec = Recorder(n)
        self.shedding = Shedding.of(cfg, router)
        self.tail_scale = tail_scale(cfg, profile)   # the windows' latencies against each class's target
        self.windows = WindowBook(self.nodes)
        for i, s in enumerate(self.slots):
            policy.attach(i, s.node)
        self.rerouted = 0
        self.stop_periodic = False               # set once the last arrival is in: ticks etc. stop
        self.next_rid = 0
        self.watch_from, self.watch_done = 1 << 62, 0
        self.path, self.path_reason = None, None       # set by begin: "compiled" or "python" (and why)
        self.engine = None                             # the compiled path's run (sim/engine.py), when it takes it
        for i, s in enumerate(self.slots):
            self.rec.ratio_change(0.0, i, s.node.ratio)

    def queue_len(self, n: int) -> int:
        """Requests waiting at node n (the compiled path replaces this with its own count)."""
        return len(self.slots[n].queue)

    @property
    def nodes(self) -> list[Node]:
        return [s.node for s in self.slots]

    def _ids_per_refresh(self) -> float:
        """Accesses a node sees per refresh, estimated from the first simulated second: scales the
        warm-start prior into count units."""
        ids, requests, span_s = self.workload.first_second_lookups()
        if not requests:
            return 1.0
        return ids / max(span_s, 1e-9) * self.cfg.refresh_s / self.cfg.nodes

    def _fresh_node(self, i: int) -> Node:
        node = Node(self.profile, self.workload.n_items, self.node_config, node_id=i)
        class_memory(self.cfg, node)
        if self.workload.prior is not None:
            warmed = self._warmed_emb                     # every node warms from the same prior
            if warmed is not None and node.emb.can_warm_from(warmed):
                node.emb.warm_from(warmed)
            else:
                node.emb.warm_items(self.workload.prior, self.ids_per_refresh)
                self._warmed_emb = node.emb
        return node

    def push(self, t: float, kind: int, node: int = -1) -> None:
        self.seq += 1
        heappush(self.heap, (t, kind, self.seq, kind, node, self.slots[node].gen if node >= 0 else 0))

    # -- the loop -------------------------------------------------------------------------
    def run(self) -> None:
        """The whole workload: begin, feed every chunk, finish — on the compiled path when the
        configuration allows it (`cfg.path`: auto | compiled | python), `self.path` says which."""
        self.begin()
        for chunk in self.workload.chunks(1.0):
            self.feed(chunk)
            if self.on_progress and len(chunk):
                self.on_progress(min(float(chunk.t[-1]), self.workload.duration_s))
        self.finish()

    def choose_path(self) -> tuple[str, str | None]:
        """("compiled", None) or ("python", why) for this run (`cfg.path`); `compiled` asked for
        where the engine cannot run is a named error."""
        from helmgr.sim.engine_modes import unsupported
        why = unsupported(self) if self.cfg.path != "python" else "asked for (--sim-path python)"
        if why is None:
            return "compiled", None
        if self.cfg.path == "compiled":
            raise HelmInputError(f"--sim-path compiled cannot run this configuration: {why}")
        return "python", why

    def begin(self) -> None:
        """Schedule the periodic events and choose the path (`choose_path`: compiled where the
        configuration allows and `cfg.path` does not say python); on the compiled path feed,
        advance, set_ratio, fork, watch, run_until_served and finish go through the engine."""
        cfg = self.cfg
        if type(self.policy).decide is not MemoryPolicy.decide or "decide" in vars(self.policy):
            self.push(cfg.tick_s, TICK)          # (a policy that never decides needs no ticks)
        self.push(cfg.refresh_s, REFRESH)
        self.push(cfg.window_s, WINDOW)
        for f in cfg.faults:
            self.push(f.down_s, DOWN, f.node)
            if f.up_s is not None:
                self.push(f.up_s, UP, f.node)
        self.next_rid = 0
        self.path, self.path_reason = self.choose_path()
        if self.path == "compiled":
            from helmgr.sim import engine
            self.engine = engine.CompiledRun(self)

    def feed(self, chunk) -> None:
        """Arrive every request of `chunk`, each after the events due at or before its time."""
        tenant = None
        if self.cfg.classes is not None:
            tenant = self.cfg.classes.assign(chunk.user, chunk.burst, self.cfg.seed)
            self.rec.tenant.extend(tenant)
        if self.engine is not None:
            self.engine.feed(chunk, tenant)
            return
        heap, handle = self.heap, self._handle
        ts, users, prefix = chunk.t.tolist(), chunk.user.tolist(), chunk.prefix_len.tolist()
        io, co, burst = chunk.item_offsets.tolist(), chunk.cand_offsets.tolist(), chunk.burst.tolist()
        segment = chunk.segment.tolist()
        items, cands = chunk.item_ids, chunk.cand_ids
        rid = self.next_rid
        tenant = [-1] * len(ts) if tenant is None else tenant.tolist()
        for i, t in enumerate(ts):
            while heap and heap[0][0] <= t:
                handle(heappop(heap))
            self.now = t
            self.arrive(Request(rid, t, users[i], prefix[i], items[io[i]:io[i + 1]], cands[co[i]:co[i + 1]], burst[i],
                                segment=segment[i], tenant=tenant[i]))
            rid += 1
        self.next_rid = rid

    def finish(self) -> None:
        """No more arrivals: stop the periodic events and run until every request is done."""
        self.stop_periodic = True
        if self.engine is not None:
            self.engine.finish()
            return
        self.advance(float("inf"))
        self.rec.requests = self.next_rid

    def advance(self, t: float) -> None:
        """Process every event due at or before t; the clock then reads t (at most the last event's
        time when t is infinite)."""
        if self.engine is not None:
            self.engine.advance(t)
            return
        heap, handle = self.heap, self._handle
        while heap and heap[0][0] <= t:
            handle(heappop(heap))
        if t != float("inf"):
            self.now = max(self.now, t)

    def _handle(self, ev) -> None:
        t, _, _, kind, node, gen = ev
        self.now = t
        if kind == DEPART:
            if gen == self.slots[node].gen:
                self.depart(node)
        elif kind == LAUNCH:
            if gen == self.slots[node].gen:
                self.take_next(node)
        elif kind == REFILL:
            if gen == self.slots[node].gen:
                self.slots[node].refill_at = None
                self._schedule_refill(node, self.slots[node].node.refill_step(t))
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
    def arrive(self, req: Request) -> None:
        if not any(self.up):
            raise HelmInputError(f"every node is down at t={self.now:.3f} s; nothing can serve")
        if self.cfg.central_queue:
            idle = next((i for i, s in enumerate(self.slots) if self.up[i] and not s.busy), None)
            if idle is None:
                self.shared.append(req)
            else:
                self.start(idle, [req])
            return
        if type(self.router) is Pools:
            n = self.router.route_tenant(req.tenant, self.now, req.user, req.prefix_len, req.items, req.cands,
                                         req.segment)
        else:
            n = self.router.route_request(self.now, req.user, req.prefix_len, req.items, req.cands, req.segment)
        if self.shedding is not None and self.shedding.late(self.router, n, req.tenant, self.now):
            self.rec.shed.append(req.rid)
            return
        self.router.dispatched(n, req.user, req.tokens)
        self.windows.arrived(n)
        slot = self.slots[n]
        if slot.busy and type(slot.queue) is ClassQueue:
            node = slot.node                      # charged its uncached work: what the node must compute
            slot.queue.append(req, req.batch_tokens - min(req.prefix_len, node.kv.peek(req.user)))
        elif slot.busy:
            slot.queue.append(req)
        else:
            self.start(n, [req])

    def start(self, n: int, batch: list[Request]) -> None:
        """Node n takes `batch` and, FCFS up to the batch size and the token budget, the head of
        its queue."""
        slot, now, cfg = self.slots[n], self.now, self.cfg
        q = self.shared if cfg.central_queue else slot.queue
        if len(batch) < cfg.max_batch and q:
            tokens = sum(r.batch_tokens for r in batch)
            while len(batch) < cfg.max_batch and q and tokens + q[0].batch_tokens <= cfg.token_budget:
                tokens += q[0].batch_tokens
                batch.append(q.popleft())
        served, free_at = self.server.serve(slot.node, batch, now, slot.compute_free)
        if self.reporters is not None and not cfg.bypass_caches:
            self.report(n)
        end = served[-1][1].end
        slot.busy, slot.compute_free = True, end
        slot.inflight.append((served, free_at >= end))
        self.push(end, DEPART, n)
        if free_at < end:
            self.push(free_at, LAUNCH, n)

    def take_next(self, n: int) -> None:
        """Node n is free to take a batch: the head of its queue, if any."""
        slot = self.slots[n]
        slot.busy = False
        q = self.shared if self.cfg.central_queue else slot.queue
        if q:
            self.start(n, [q.popleft()])

    def depart(self, n: int) -> None:
        now, rec, router, windows, slot = self.now, self.rec, self.router, self.windows, self.slots[n]
        central, scale = self.cfg.central_queue, self.tail_scale
        served, frees = slot.inflight.popleft()
        for req, svc in served:
            rec.complete(req, svc, n, now)
            if req.rid >= self.watch_from:
                self.watch_done += 1
            latency = now - req.t if scale is None else (now - req.t) * scale[req.tenant]
            windows.completed(n, latency, svc.fetch_s, svc.recompute_s)
            if not central:
                router.completed(n, now)
        if frees:
            self.take_next(n)

    def report(self, n: int, emb: bool = False) -> None:
        """Deliver node n's residency reports to the router's index: its KV events, and with
        `emb` a fresh EMB summary (after a refresh or resize)."""
        rep = self.reporters[n]
        batch = rep.kv_batch()
        if batch is not None:
            self.index.apply_kv(batch)
        if emb:
            self.index.apply_summary(rep.summary(self.now))

    # -- replays (the oracle, the training environment's twin) -------------------------------
    def fork(self) -> "Cluster":
        """An independent copy to replay from: same state, a fresh recorder, shared workload."""
        memo = {id(self.workload): self.workload, id(self.profile): self.profile,
                id(self.rec): Recorder(self.cfg.nodes)}
        return copy.deepcopy(self, memo)

    def watch(self) -> None:
        """Count completions of the requests fed from now on (for `run_until_served`)."""
        if self.engine is not None:
            self.engine.watch()
            return
        self.watch_from, self.watch_done = self.next_rid, 0

    def run_until_served(self) -> None:
        """Process events until every watched request has completed. Later arrivals could never
        have delayed them (queues and the link are FIFO), so this is their whole story."""
        if self.engine is not None:
            self.engine.run_until_served()
            return
        heap, handle = self.heap, self._handle
        while self.watch_done < self.next_rid - self.watch_from and heap:
            handle(heappop(heap))
