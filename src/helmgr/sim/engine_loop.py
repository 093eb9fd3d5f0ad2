"""The engine's loop (sim/engine.py), compiled: `step` runs arrivals and node events in the
cluster's order — an arrival after every event due at or before it, departures before launches —
with `Cluster.start`, `take_next` and `depart` as they are in sim/cluster.py; `rebase` moves the
ids of queued requests into a store of their own when the next chunk's arrays come in."""
from __future__ import annotations

import numpy as np
from numba import njit

from helmgr.memory import kv_table as kvmod
from helmgr.sim.engine_helm import _helm_completed, _helm_kv_events, _helm_route
from helmgr.sim.engine_layout import *  # noqa: F403
from helmgr.sim.engine_layout import _grow1, _grow_rows, _pop, _push, _ring_put, _ring_take
from helmgr.sim.engine_node import _serve
from helmgr.sim.engine_queue import cq_head, cq_put, cq_take, uncached_work
from helmgr.sim.engine_routes import _prefix_dispatched, _prefix_route, _route
from helmgr.sim.events import DEPART, LAUNCH


@njit(cache=True, nogil=True)
def _batch_tokens(RI, s):
    return RI[s, R_PREFIX] + RI[s, R_NITEMS] + RI[s, R_NCANDS]


@njit(cache=True, nogil=True)
def _start(n, first, now, F, I, G, Q, INF, INFF, RI, RF, HT, HK, C, CI, STATES, RB, UB, ACC, KVM, KVT, KVL, IDSI, IDSC,
           HIST, CQ):
    """Cluster.start: node n takes `first` and, up to the batch size and the token budget, the
    head of its queue (FCFS, or its class queue's choice: engine_queue.py). Returns where the
    start's KV events begin in the node's log and how many there are (for `_started`)."""
    k = (I[n, INFH] + I[n, INFN]) % INFLIGHT      # the batch is built in the next free in-flight slot
    if I[n, INFN] >= INFLIGHT:
        raise RuntimeError("more batches in service on one node than the engine holds")
    batch = INF[n, k]
    batch[0] = first
    nb = 1
    maxb, budget = G[MAXB], G[BUDGET]
    q = Q[n]
    cap = q.shape[0]
    if nb < maxb and I[n, QT] > I[n, QH] and G[NLINES]:
        tokens = _batch_tokens(RI, first)
        while nb < maxb and I[n, QT] > I[n, QH]:
            bt = _batch_tokens(RI, cq_head(n, now, G, Q, RI, CQ))
            if tokens + bt > budget:
                break
            tokens += bt
            batch[nb] = cq_take(n, now, G, I, Q, RI, CQ)
            nb += 1
    elif nb < maxb and I[n, QT] > I[n, QH]:
        tokens = _batch_tokens(RI, first)
        while nb < maxb and I[n, QT] > I[n, QH]:
            head = q[I[n, QH] % cap]
            bt = _batch_tokens(RI, head)
            if tokens + bt > budget:
                break
            tokens += bt
            batch[nb] = head
            nb += 1
            I[n, QH] += 1
    batch[INF.shape[2] - 1] = nb
    before = KVM[n][kvmod.LOG_N]
    end, free_at = _serve(n, batch, nb, now, F, I, G, RI, RF, C, CI, STATES, RB, UB, ACC, KVM, KVT, KVL, IDSI, IDSC, HIST)
    logged = KVM[n][kvmod.LOG_N] - before
    I[n, BUSY] = 1
    F[n, CFREE] = end
    INFF[n, k] = 1 if free_at >= end else 0
    I[n, INFN] += 1
    _push(HT, HK, G, end, DEPART, n)
    if free_at < end:
        _push(HT, HK, G, free_at, LAUNCH, n)
    return before, logged


@njit(cache=True, nogil=True)
def _started(n, before, logged, G, I, KVM, KVL, DL, H):
    """A start's KV events (`logged` of them, from `before` in node n's log): to the HELM router's
    index now, or listed for the Python router's index (in start order). Apart from `_start` so
    that the call chain of every start does not carry the router's arrays."""
    if G[MODE] == HELM:
        _helm_kv_events(H, G, I, n, KVL[n], before, before + logged)
        KVM[n][kvmod.LOG_N] = before
    else:
        d = G[NDL]
        DL[0] = _grow_rows(DL[0], d + 1)
        DL[0][d, 0], DL[0][d, 1] = n, logged
        G[NDL] = d + 1


@njit(cache=True, nogil=True)
def _depart(n, now, I, G, INF, INFF, RI, RF, FREE, CLI, CLF):
    """Cluster.depart up to its take_next: the batch's requests logged as completed, their slots
    freed. Returns whether the node takes its next batch now (the batch held it until its end)
    and the batch's size (the HELM router's completions are the caller's)."""
    k = I[n, INFH]
    I[n, INFH] = (k + 1) % INFLIGHT
    I[n, INFN] -= 1
    batch = INF[n, k]
    nb = batch[INF.shape[2] - 1]
    c = G[NCOMP]
    cli, clf, free = CLI[0], CLF[0], FREE[0]
    if c + nb > cli.shape[0]:
        cli = CLI[0] = _grow_rows(cli, c + nb)
        clf = CLF[0] = _grow_rows(clf, c + nb)
    for b in range(nb):
        s = batch[b]
        cli[c, C_RID], cli[c, C_NODE], cli[c, C_BURST] = RI[s, R_RID], n, RI[s, R_BURST]
        cli[c, C_PREFIX], cli[c, C_KV], cli[c, C_UNF] = RI[s, R_PREFIX], RI[s, R_CF], RI[s, R_UNF]
        cli[c, C_IDS], cli[c, C_MISSES], cli[c, C_TENANT] = RI[s, R_IDS], RI[s, R_IDS] - RI[s, R_HITS], RI[s, R_TENANT]
        clf[c, C_T], clf[c, C_START], clf[c, C_END] = RF[s, R_T], RF[s, R_START], now
        clf[c, C_FETCH], clf[c, C_RECOMP], clf[c, C_LAUNCH] = RF[s, R_FETCH], RF[s, R_RECOMP], RF[s, R_LAUNCH]
        c += 1
        free[G[NFREE]] = s
        G[NFREE] += 1
    G[NCOMP] = c
    if G[MODE] != HELM and G[MODE] != EXTERNAL:
        I[n, LOAD] -= nb
    return INFF[n, k] != 0, nb


@njit(cache=True, nogil=True)
def _new_slot(RI, RF, FREE, G):
    if G[NFREE] == 0:
        old = RI[0].shape[0]
        RI[0] = _grow_rows(RI[0], 2 * old)
        RF[0] = _grow_rows(RF[0], 2 * old)
        FREE[0] = _grow1(FREE[0], 2 * old)
        free = FREE[0]
        for k in range(old):
            free[k] = 2 * old - 1 - k
        G[NFREE] = old
    G[NFREE] -= 1
    return FREE[0][G[NFREE]]


@njit(cache=True, nogil=True)
def _shed(s, G, RI, FREE, SHL):
    """A refused arrival: its rid logged for the recorder, its slot free again."""
    k = G[NSHED]
    SHL[0] = _grow1(SHL[0], k + 1)
    SHL[0][k] = RI[s, R_RID]
    G[NSHED] = k + 1
    FREE[0][G[NFREE]] = s
    G[NFREE] += 1


@njit(cache=True, nogil=True)
def step(until, routed, F, I, G, Q, INF, INFF, RIL, RFL, FREE, CLI, CLF, HT, HK, C, CI, STATES, RB, UB, ACC, KVM,
         KVT, KVL, IDSI, IDSC, HIST, DL, H, CQ, LIM, SHL, AT, AI):
    """Run arrivals before `until` (the next Python event) and node events due at or before each
    arrival, or, when the arrivals of the chunk run out first, stop (CHUNK_DONE). With FINISH set
    there are no more arrivals: run node events up to `until`. In EXTERNAL mode return NEED_ROUTE
    before each arrival; the call after routes it to `routed` (SHED: refuses it). The HELM router
    refuses a request predicted to finish more than LIM[its tenant] after it arrives (Shedding in
    sim/tenancy.py); a refused request's rid goes to SHL. Returns the reason it stopped."""
    while True:
        pos = G[POS]
        has_arr = pos < G[NARR] and AT[pos] < until
        if not has_arr and pos >= G[NARR] and G[FINISH] == 0:
            return CHUNK_DONE
        ta = AT[pos] if has_arr else until
        if routed == NO_ROUTE:
            while G[HEAPN] > 0 and HT[0] <= ta:
                t, kind, n = _pop(HT, HK, G)
                RI, RF = RIL[0], RFL[0]
                if kind == DEPART:
                    take, nb = _depart(n, t, I, G, INF, INFF, RI, RF, FREE, CLI, CLF)
                    if G[MODE] == HELM:
                        _helm_completed(H, G, I, n, t, nb)
                    if not take:
                        continue
                I[n, BUSY] = 0        # Cluster.take_next (a launch, or a departure that held the node)
                if I[n, QT] > I[n, QH]:
                    first = cq_take(n, t, G, I, Q, RI, CQ) if G[NLINES] else _ring_take(Q, n, I, QH)
                    before, logged = _start(n, first, t, F, I, G, Q, INF, INFF, RI, RF, HT, HK, C, CI,
                                            STATES, RB, UB, ACC, KVM, KVT, KVL, IDSI, IDSC, HIST, CQ)
                    if logged > 0:
                        _started(n, before, logged, G, I, KVM, KVL, DL, H)
            if not has_arr:
                return BOUNDARY
            if G[MODE] == EXTERNAL:
                return NEED_ROUTE
            if G[MODE] == HELM and G[LEFT] == 0:
                return NEED_DRAWS
        s = _new_slot(RIL, RFL, FREE, G)
        RI, RF = RIL[0], RFL[0]
        for c in range(NRI):
            RI[s, c] = AI[pos, c]
        if routed != NO_ROUTE:
            n = routed
            routed = NO_ROUTE
        elif G[MODE] == HELM:
            n = _helm_route(ta, s, I, G, RI, IDSI, IDSC, H, LIM[RI[s, R_TENANT]])
        elif G[MODE] == PREFIX_AWARE:
            n = _prefix_route(I, G, RI, s, H)
            I[n, LOAD] += 1
            _prefix_dispatched(G, H, n, RI[s, R_USER], RI[s, R_PREFIX] + RI[s, R_NITEMS])
        else:
            n = _route(I, G)
            I[n, LOAD] += 1
        RI[s, R_RID] = G[RID]
        G[RID] += 1
        RF[s, R_T] = ta
        G[POS] = pos + 1
        if n == SHED:
            _shed(s, G, RI, FREE, SHL)
            continue
        I[n, ARR] += 1
        if I[n, BUSY] and G[NLINES]:
            cq_put(n, s, uncached_work(n, s, RI, KVM, KVT), G, I, Q, RI, CQ)
        elif I[n, BUSY]:
            _ring_put(Q, n, I, QH, QT, s)
        else:
            before, logged = _start(n, s, ta, F, I, G, Q, INF, INFF, RI, RF, HT, HK, C, CI, STATES, RB, UB, ACC,
                                    KVM, KVT, KVL, IDSI, IDSC, HIST, CQ)
            if logged > 0:
                _started(n, before, logged, G, I, KVM, KVL, DL, H)


@njit(cache=True, nogil=True)
def rebase(I, G, Q, LQ, RIL, IDSI, IDSC, items, cands):
    """A new chunk's id arrays become store 0, as they are (no copy); the ids of requests still
    queued (not yet looked up), from either store, are copied into a new store 1. (`Q`'s rings:
    one a node, head and tail I[n, QH], I[n, QT], or a class queue's lines, LQ's.)"""
    RI = RIL[0]
    ni = nc = 0
    heads = I[:, QH:QT + 1] if G[NLINES] == 0 else LQ     # (each ring's head and tail: QT is QH + 1)
    for r in range(len(Q)):
        q = Q[r]
        for k in range(heads[r, 0], heads[r, 1]):
            s = q[k % q.shape[0]]
            ni += RI[s, R_NITEMS]
            nc += RI[s, R_NCANDS]
    si = np.empty(ni, np.int64)
    sc = np.empty(nc, np.int64)
    pi = pc = 0
    for r in range(len(Q)):
        q = Q[r]
        for k in range(heads[r, 0], heads[r, 1]):
            s = q[k % q.shape[0]]
            oi, oc = IDSI[RI[s, R_STORE]], IDSC[RI[s, R_STORE]]
            a, b = RI[s, R_IOFF], RI[s, R_NITEMS]
            si[pi:pi + b] = oi[a:a + b]
            RI[s, R_IOFF] = pi
            pi += b
            a, b = RI[s, R_COFF], RI[s, R_NCANDS]
            sc[pc:pc + b] = oc[a:a + b]
            RI[s, R_COFF] = pc
            pc += b
            RI[s, R_STORE] = 1
    IDSI[0], IDSC[0] = items, cands
    IDSI[1], IDSC[1] = si, sc
