"""The compiled per-request path of the cluster simulator (docs/simulator.md#two-per-request-paths).

`Cluster.begin` (what `Cluster.run` calls; the oracles and the training environment too) hands
the per-request work to this engine when the run's configuration is one it compiles
(`unsupported` says why not, and the run then takes the Python path): arrival, routing
(least-loaded, round-robin, prefix-aware and HELM in compiled code, `engine_routes.py` and
`engine_helm.py`; any other router from Python, one call per arrival), batching, the node model
of `sim/node.py` (`engine_node.py`: KV cache, EMB residency, the H2D link, the three service
engines) and completion (`engine_loop.py`), over arrays of per-node and per-request fields
(`engine_layout.py`); completions, KV events and arrivals for a Python router are handed to
Python's objects by `engine_handoff.py`.
Python keeps everything at the boundaries: the controller ticks, EMB refreshes and metrics
windows stay events of the cluster's own heap, and before one is handled the engine writes its
counters back into the `Node` objects (`sync_out`), so policies, refreshes, the router's index
and the summary see exactly what the Python path would show them.

The arithmetic is the Python path's, operation for operation (the same float64 sums in the same
order), so a run's summary is the same bit for bit on either path (tests/test_engine.py).
"""
from __future__ import annotations

from heapq import heappop

import numpy as np

from helmgr.memory.link import EMB_MISS
from helmgr.sim.engine_books import apply_events, books_in, books_out, next_draws
from helmgr.sim.engine_handoff import Handoffs
from helmgr.sim.engine_layout import *  # noqa: F403
from helmgr.sim.engine_layout import at, length, put, typed_list
from helmgr.sim.engine_loop import rebase, step
from helmgr.sim.engine_modes import _plain, _typed, ghost_mode, router_mode
from helmgr.sim.engine_node import build_bits, history_index
from helmgr.sim.engine_queue import DUR, OWN, class_queues
from helmgr.sim.events import REFRESH, WINDOW


class CompiledRun(Handoffs):
    """One run of a `Cluster` on the compiled path (`Cluster.begin` makes it; the
    cluster's feed, advance, finish, watch and run_until_served call the verbs of the same names)."""

    def __init__(self, cluster):
        self.c = c = cluster
        cfg, nodes = c.cfg, c.nodes
        n = cfg.nodes
        self.mode = router_mode(c.router, c.index)
        self.F = np.zeros((n, NF))
        self.I = np.zeros((n, NI), np.int64)
        G = self.G = np.zeros(NG, np.int64)
        G[MODE], G[MAXB], G[BUDGET], G[ENG], G[NNODES] = (self.mode, cfg.max_batch, cfg.token_budget,
                                                         ENGINE_CODES[cfg.engine], n)
        if self.mode == ROUND_ROBIN:
            G[TURN] = c.router.next
        elif self.mode in (LEAST_LOADED, PREFIX_AWARE):
            G[TURN] = c.router._turn
        lines, bands, self.CQ = class_queues(cfg.classes if cfg.tenancy in ("strict", "helm") else None,
                                             cfg.tenancy == "helm", n, cfg.metrics_warmup_s(c.workload.duration_s))
        G[NLINES], G[NBANDS], G[FAIR] = lines, bands, cfg.tenancy == "helm"
        self.Q = typed_list([np.zeros(64 if lines == 0 else 16, np.int64) for _ in range(n * max(lines, 1))])
        shed = c.shedding if self.mode == HELM else None         # (another mode refuses from Python)
        tenants = len(cfg.classes.tenants) if cfg.classes is not None else 1
        self.LIM = np.array(shed.limits if shed is not None else [np.inf] * tenants)    # per tenant
        self.SHL = typed_list([np.zeros(64, np.int64)])
        groups = nodes[0].kv_group
        self.GROUP = None if groups is None else np.array(groups, np.int64)      # per tenant, its KV group
        self.INF = np.zeros((n, INFLIGHT, cfg.max_batch + 1), np.int64)
        self.INFF = np.zeros((n, INFLIGHT), np.int64)
        cap = 1024
        self.RI = typed_list([np.zeros((cap, NRI), np.int64)])
        self.RF = typed_list([np.zeros((cap, NRF))])
        self.FREE = typed_list([np.arange(cap - 1, -1, -1, dtype=np.int64)])
        G[NFREE] = cap
        self.CLI = typed_list([np.zeros((4096, NCLI), np.int64)])
        self.CLF = typed_list([np.zeros((4096, NCLF))])
        self.HT = np.zeros(n * (INFLIGHT + 1))             # node events: see engine_layout._push
        self.HK = np.zeros((n * (INFLIGHT + 1), 3), np.int64)
        self.DL = typed_list([np.zeros((256, 2), np.int64)])
        cost = nodes[0].cost
        self.C = np.zeros(NC)
        self.C[[HBM_BW, PCIE_BW, PCIE_LAT, HOST_LOOKUP, FLOPS, LAUNCH_S, BFLOPS, BHALF, BREQ]] = (
            cost.hbm_bw, cost.pcie_bw, cost.pcie_latency_s, cost.host_lookup_s, cost.flops, cost.launch_overhead_s,
            cost.batch_flops, cost.batch_half_rows, cost.batch_request_s)
        self.CI = np.array([cost.row_bytes, cost.layers, cost.linear_flops, cost.attention_flops,
                            nodes[0].emb.sample_shift, ghost_mode(nodes)], np.int64)
        self.STATES = typed_list([node.emb.state for node in nodes])
        words = (nodes[0].emb.n_items + 63) // 64
        self.RB, self.UB = np.zeros((n, words), np.uint64), np.zeros((n, words), np.uint64)
        self.ACC = typed_list([np.zeros(1 << 16, np.int32) for _ in range(n)])   # ids < 2**31: half the bytes
        self.KVM = typed_list([node.kv.meta for node in nodes] + [node.kv.gmeta for node in nodes])
        self.KVT = typed_list([node.kv.tab for node in nodes] + [node.kv.gtab for node in nodes])
        self.KVL = typed_list([node.kv.log for node in nodes])
        self.IDSI = typed_list([np.zeros(0, np.int64), np.zeros(0, np.int64)])   # stores 0 and 1 (rebase)
        self.IDSC = typed_list([np.zeros(0, np.int64), np.zeros(0, np.int64)])
        self.HIST = history_index(np.ascontiguousarray(c.workload.history.compiled_pool, np.int64), int(self.CI[ESHIFT]))
        self.AT = np.zeros(0)
        self.AI = np.zeros((0, NRI), np.int64)
        self.chunk = None
        self.H = books_in(c, self.mode, G, self.I)
        self.workload = c.workload
        self.watch_from, self.watch_done = 1 << 62, 0
        self._step = None                         # step's compiled overload, once found (`step`)
        self._install()
        for i in range(n):
            self.sync_in(i)

    def _install(self) -> None:
        """Point the cluster's hooks at this run (bound methods: a copy of the cluster takes its
        copy of the run along)."""
        if self.mode == HELM:             # reports from Python (after resizes) feed the compiled holders
            self.c.index.apply_events = self._apply_events
        self.c.queue_len = self.queue_len

    def _apply_events(self, n: int, events) -> None:
        apply_events(self.H, self.G, n, events)

    def queue_len(self, i: int) -> int:
        return int(self.I[i, QT] - self.I[i, QH])

    # -- copies (Cluster.fork, and pickles for Ray) ---------------------------------------------
    _SHARED = ("STATES", "KVM", "KVT", "KVL")      # the nodes' own arrays: taken from the nodes

    def __getstate__(self) -> dict:
        """The run as plain values: typed lists as Python lists, the nodes' arrays as the nodes
        hold them (after `sync_out`, so a copy made with the nodes shares them as the original
        does), completions drained, the history pool left to the workload."""
        for i in range(len(self.c.nodes)):
            self.sync_out(i)
        self.drain()
        state = {k: _plain(v) for k, v in vars(self).items() if k not in self._SHARED and k not in ("HIST", "_step")}
        state["_step"] = None
        nodes = self.c.nodes
        state["_shared"] = ([nd.emb.state for nd in nodes], [nd.kv.meta for nd in nodes] + [nd.kv.gmeta for nd in nodes],
                            [nd.kv.tab for nd in nodes] + [nd.kv.gtab for nd in nodes], [nd.kv.log for nd in nodes])
        state["chunk"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        shared = state.pop("_shared")
        vars(self).update({k: _typed(v) for k, v in state.items()})
        self.STATES, self.KVM, self.KVT, self.KVL = (typed_list(x) for x in shared)
        self.HIST = history_index(np.ascontiguousarray(self.workload.history.compiled_pool, np.int64), int(self.CI[ESHIFT]))

    def step(self, until: float, routed: int, args: tuple) -> int:
        """engine_loop.step on this run's arrays. Called once per event of the cluster's (a
        controller tick every few ms): through numba's dispatcher, which works out the types of
        some forty arguments in Python on every call (~0.3 ms, a third of a full-HELM run), only
        the first time; then straight into the compiled overload it chose."""
        full = (float(until), int(routed), *args, self.AT, self.AI)
        if self._step is None:
            code = step(*full)
            self._step = step.overloads[tuple(step.typeof_pyval(a) for a in full)].entry_point
            return code
        return self._step(*full)

    def _args(self):
        return (self.F, self.I, self.G, self.Q, self.INF, self.INFF, self.RI, self.RF, self.FREE, self.CLI, self.CLF,
                self.HT, self.HK, self.C, self.CI, self.STATES, self.RB, self.UB, self.ACC, self.KVM, self.KVT,
                self.KVL, self.IDSI, self.IDSC, self.HIST, self.DL, self.H, self.CQ, self.LIM, self.SHL)

    # -- the loop: Cluster.feed / advance / finish / run_until_served on this path -------------
    def feed(self, chunk, tenant: np.ndarray | None = None) -> None:
        """Every request of `chunk` in, each after the events due at or before its time (of
        `tenant`: each request's, under a class table)."""
        self.load(chunk, tenant)
        self.drive()
        self.chunk = None

    def advance(self, t: float) -> None:
        """Every event due at or before t (node events before the cluster's at the same time)."""
        self._events(t, lambda: False)
        if t != np.inf:
            self.c.now = max(self.c.now, t)

    def _events(self, t: float, done) -> None:
        """With no arrivals: node events and the cluster's, in time order, up to t or until
        `done()` (asked before each event of the cluster's)."""
        heap = self.c.heap
        self._no_arrivals()
        args = self._args()
        while True:
            self.step(min(heap[0][0] if heap else np.inf, t), -1, args)
            self.report_kv()
            if done() or not (heap and heap[0][0] <= t):
                break
            self.boundary(heappop(heap))
        self.G[FINISH] = 0

    def finish(self) -> None:
        """No more arrivals: every event run, the objects and the router's books brought up to date."""
        c = self.c
        self._events(np.inf, lambda: False)
        for i in range(c.cfg.nodes):
            self.sync_out(i)
        self.drain()
        books_out(c, self.mode, self.H, self.G, self.I)
        if self.G[NLINES]:                    # the class queues' service counters, for the summary
            for i, s in enumerate(c.slots):
                s.queue.own = dict(zip(s.queue.bands, self.CQ[OWN][i].tolist()))
                s.queue.during = dict(zip(s.queue.bands, self.CQ[DUR][i].tolist()))
        c.next_rid = int(self.G[RID])
        c.rec.requests = c.next_rid

    def watch(self) -> None:
        self.watch_from, self.watch_done = int(self.G[RID]), 0

    def _served(self) -> bool:
        k = int(self.G[NCOMP])
        fresh = int(np.count_nonzero(at(self.CLI, 0)[:k, C_RID] >= self.watch_from))
        return self.watch_done + fresh >= int(self.G[RID]) - self.watch_from

    def run_until_served(self) -> None:
        """Events until every watched request has completed (node events up to the next event of
        the cluster's may run past it: later ones cannot delay a watched request), then drained."""
        self._events(np.inf, self._served)
        for i in range(self.c.cfg.nodes):
            self.sync_out(i)
        self.drain()

    def _no_arrivals(self) -> None:
        self.G[FINISH] = 1
        self.AT, self.AI = np.zeros(0), np.zeros((0, NRI), np.int64)
        self.G[POS] = self.G[NARR] = 0

    def load(self, chunk, tenant: np.ndarray | None = None) -> None:
        """The chunk's requests become the arrivals `step` walks."""
        n = len(chunk)
        rebase(self.I, self.G, self.Q, self.CQ[0], self.RI, self.IDSI, self.IDSC,
               np.ascontiguousarray(chunk.item_ids, np.int64), np.ascontiguousarray(chunk.cand_ids, np.int64))
        AI = np.zeros((n, NRI), np.int64)
        io, co = chunk.item_offsets, chunk.cand_offsets
        AI[:, R_USER], AI[:, R_PREFIX] = chunk.user, chunk.prefix_len
        AI[:, R_NITEMS], AI[:, R_NCANDS] = np.diff(io), np.diff(co)
        AI[:, R_IOFF], AI[:, R_COFF] = io[:-1], co[:-1]          # in store 0 (R_STORE 0)
        AI[:, R_BURST], AI[:, R_SEG] = chunk.burst, chunk.segment
        AI[:, R_H0], AI[:, R_HOFF], AI[:, R_HMOD], AI[:, R_HSHIFT] = self.c.workload.history.locate(chunk.user)
        if tenant is not None:
            AI[:, R_TENANT] = tenant
            if self.GROUP is not None:
                AI[:, R_GROUP] = self.GROUP[tenant]
        self.AT, self.AI, self.chunk = np.ascontiguousarray(chunk.t, np.float64), AI, chunk
        self.G[POS], self.G[NARR] = 0, n

    def drive(self) -> None:
        """Step until the chunk's arrivals are in."""
        c, heap, args = self.c, self.c.heap, self._args()
        routed = NO_ROUTE
        while True:
            until = heap[0][0] if heap else np.inf
            code = self.step(until, routed, args)
            routed = NO_ROUTE
            if code == CHUNK_DONE:
                return
            self.report_kv()
            if code == NEED_ROUTE:
                routed = self.route_external()
                continue
            if code == NEED_DRAWS:
                next_draws(c.router, self.H, self.G)
                continue
            if not heap:
                return
            ev = heappop(heap)
            self.boundary(ev)

    def boundary(self, ev) -> None:
        """Handle one event of the cluster's heap with the Node objects up to date."""
        c, kind = self.c, ev[3]
        if kind == REFRESH or kind == WINDOW:
            for i in range(c.cfg.nodes):
                self.sync_out(i)
            if kind == WINDOW:
                self.drain()
                arrivals = c.windows.arrivals
                for i, a in enumerate(self.I[:, ARR].tolist()):
                    arrivals[i] += a
                self.I[:, ARR] = 0
            else:
                for i, node in enumerate(c.nodes):
                    k = int(self.I[i, ACCN])
                    if k:                    # (a view: the refresh below consumes it)
                        node.emb.record(at(self.ACC, i)[:k])
                    self.I[i, ACCN] = 0
        c._handle(ev)
        if kind == REFRESH:
            for i in range(c.cfg.nodes):
                self.sync_in(i)

    def set_ratio(self, i: int, ratio: float, inner) -> None:
        """Cluster.set_ratio (`inner`) with node i's objects up to date around it (a ratio that
        moves no page changes nothing: no sync, whose bitmap rebuild would cost a pass over the rows)."""
        pool = self.c.slots[i].node.pool
        if pool.pages_for(ratio) == pool.emb_pages:
            return
        self.sync_out(i)
        inner(i, ratio)
        self.sync_in(i)

    # -- keeping the objects in sync ----------------------------------------------------------
    def sync_out(self, i: int) -> None:
        """The engine's state of node i into its objects (before Python code reads them)."""
        node, F, I = self.c.slots[i].node, self.F[i], self.I[i]
        s = node.stats
        (s.requests, s.cold_requests, s.prefix_tokens, s.kv_hit_tokens, s.ids, s.misses, s.unfilled_misses,
         s.token_ids, s.token_misses) = I[[REQS, COLD, PREFIX, KVHIT, IDS, MISSES, UNF, TOKIDS, TOKMISS]].tolist()
        s.busy_s, s.emb_wait_s, s.recompute_s = F[[BUSY_S, WAIT_S, RECOMP_S]].tolist()
        s.kv_shadow_tokens = int(I[KVSH])
        link = node.link
        link.busy_until, link.busy_s = float(F[LBU]), float(F[LBS])
        link.bytes_by_cause[EMB_MISS] = int(I[LBYTES])
        if I[ELOOK]:
            node.emb.add_counts(int(I[ELOOK]), int(I[EHIT]), int(I[EUNF]))
            I[ELOOK] = I[EHIT] = I[EUNF] = 0
        n = length(self.KVL)
        node.kv.attach(at(self.KVT, i), at(self.KVL, i), at(self.KVT, n + i))   # (its log was replayed by report_kv)

    def sync_in(self, i: int) -> None:
        """Node i's objects into the engine (after Python code changed them)."""
        node, F, I = self.c.slots[i].node, self.F[i], self.I[i]
        F[LBU], F[LBS], F[BLK] = node.link.busy_until, node.link.busy_s, node.blocked_until
        I[LBYTES] = node.link.bytes_by_cause[EMB_MISS]
        kv, n = node.kv, length(self.KVL)
        put(self.KVT, i, kv.tab)
        put(self.KVL, i, kv.log)
        put(self.KVM, n + i, kv.gmeta)
        put(self.KVT, n + i, kv.gtab)
        if at(self.STATES, i) is not node.emb.state:
            put(self.STATES, i, node.emb.state)
        build_bits(node.emb.state, self.RB[i], self.UB[i])
