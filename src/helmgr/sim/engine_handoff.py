"""The compiled run's hand-offs to Python's objects between steps (`CompiledRun` is one):
completions drained into the recorder, the nodes' metrics windows and a Python router's books
(`drain`), an arrival routed by a Python router (`route_external`), and the KV events of the
batches started to the router's index (`report_kv`)."""
from __future__ import annotations

import numpy as np

from helmgr.memory import kv_table as kvmod
from helmgr.routing.pools import Pools
from helmgr.routing.residency import KVBatch
from helmgr.sim.engine_layout import (
    C_BURST, C_END, C_FETCH, C_IDS, C_KV, C_LAUNCH, C_MISSES, C_NODE, C_PREFIX, C_RECOMP, C_RID, C_START, C_T, C_UNF,
    C_TENANT, EXTERNAL, NCOMP, NDL, NSHED, POS, R_TENANT, RCUR, SHED, at)


class Handoffs:
    """What `CompiledRun` hands to the cluster's Python objects: every method reads the run's
    arrays (`G`, `CLI`, `CLF`, `DL`, `KVL`, `KVM`) and the cluster (`c`)."""

    def drain(self) -> None:
        """Completed requests into the recorder and the metrics windows."""
        c, G = self.c, self.G
        k = int(G[NCOMP])
        if self.mode == EXTERNAL:
            self._completed_to_router()
        G[NCOMP] = G[RCUR] = 0
        if G[NSHED]:
            c.rec.shed.extend(at(self.SHL, 0)[:G[NSHED]])
            G[NSHED] = 0
        if not k:
            return
        cli, clf = at(self.CLI, 0)[:k], at(self.CLF, 0)[:k]
        self.watch_done += int(np.count_nonzero(cli[:, C_RID] >= self.watch_from))
        rec = c.rec
        t, end = clf[:, C_T], clf[:, C_END]
        rec.arrival.extend(t)
        rec.rid.extend(cli[:, C_RID])
        rec.end.extend(end)
        node = cli[:, C_NODE]
        rec.node.extend(node)
        rec.burst.extend(cli[:, C_BURST].astype(bool))
        rec.rerouted.extend(np.zeros(k, np.int64))
        rec.prefix.extend(cli[:, C_PREFIX])
        rec.start.extend(clf[:, C_START])
        rec.fetch.extend(clf[:, C_FETCH])
        rec.launch.extend(clf[:, C_LAUNCH])
        rec.ids.extend(cli[:, C_IDS])
        rec.misses.extend(cli[:, C_MISSES])
        rec.kv_tokens.extend(cli[:, C_KV])
        rec.unfilled.extend(cli[:, C_UNF])
        order = np.argsort(node, kind="stable")              # each node's completions, in order
        bounds = np.searchsorted(node[order], np.arange(c.cfg.nodes + 1))
        lat = end - t
        if c.tail_scale is not None:                # the windows' latencies against each class's target
            lat = lat * np.asarray(c.tail_scale)[cli[:, C_TENANT]]
        lat, fetch, recomp = lat[order], clf[order, C_FETCH], clf[order, C_RECOMP]
        w = c.windows
        for n in np.flatnonzero(np.diff(bounds)).tolist():
            a, b = bounds[n], bounds[n + 1]
            w.latency[n].extend(lat[a:b])
            w.fetch[n].extend(fetch[a:b])
            w.recompute[n].extend(recomp[a:b])

    # -- routing from Python --------------------------------------------------------------------
    def _completed_to_router(self) -> None:
        G = self.G
        a, b = int(G[RCUR]), int(G[NCOMP])
        if b > a:
            done = self.c.router.completed
            for n, t in zip(at(self.CLI, 0)[a:b, C_NODE].tolist(), at(self.CLF, 0)[a:b, C_END].tolist()):
                done(n, t)
            G[RCUR] = b

    def route_external(self) -> int:
        """Route the arrival `step` stopped at, with the router's view brought up to date (SHED:
        refused, as Cluster.arrive refuses it)."""
        self._completed_to_router()
        c, ch, i = self.c, self.chunk, int(self.G[POS])
        io, co = ch.item_offsets, ch.cand_offsets
        user, prefix, t = int(ch.user[i]), int(ch.prefix_len[i]), float(ch.t[i])
        items, cands = ch.item_ids[io[i]:io[i + 1]], ch.cand_ids[co[i]:co[i + 1]]
        c.now = t
        tenant = int(self.AI[i, R_TENANT])
        if type(c.router) is Pools:
            n = c.router.route_tenant(tenant, t, user, prefix, items, cands, int(ch.segment[i]))
        else:
            n = c.router.route_request(t, user, prefix, items, cands, int(ch.segment[i]))
        if c.shedding is not None and c.shedding.late(c.router, n, tenant, t):
            return SHED
        c.router.dispatched(n, user, prefix + len(items))
        return n

    def report_kv(self) -> None:
        """The KV events of the batches started since the last call, to the router's index, one
        report per start in start order (what Cluster.start's report does)."""
        d = int(self.G[NDL])
        if not d:
            return
        c = self.c
        taken = [0] * c.cfg.nodes
        for n, k in at(self.DL, 0)[:d].tolist():
            log, a = at(self.KVL, n), taken[n]
            rows = log[:, a:a + k]                  # (kind, user, a, b): an insert's event, an eviction's
            now = np.where(rows[0] == kvmod.EVENT, rows[2], rows[3])
            events = list(zip(rows[1].tolist(), now.tolist()))
            rep = c.reporters[n]
            c.index.apply_kv(KVBatch(n, rep.kv_version + 1, events))
            rep.kv_version += k
            taken[n] = a + k
        for n, a in enumerate(taken):
            if a:
                at(self.KVM, n)[kvmod.LOG_N] = 0
        self.G[NDL] = 0
