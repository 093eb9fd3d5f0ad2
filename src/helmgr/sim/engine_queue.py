"""A node's queue under a class table, compiled for the engine (sim/engine.py): `ClassQueue`
(sim/node_queue.py) step for step — bands strictly, a backlogged band under its minimum share
first, tenants by deficit round robin within a band, FCFS within a tenant (`fair`, --tenancy
helm), or one FCFS line per band (--tenancy strict). The same float operations in the same order,
so a run's summary is the same on either path.

Node n's queue is G[NLINES] lines (a line: a tenant when fair, a band when strict), each a ring
of request slots: `Q[n * L + line]`, its head and tail in `LQ[n * L + line]`; I[n, QH] and
I[n, QT] count the node's takes and puts (their difference is its length). The rest is `CQ`:

- SERV[n, b], SAT[n]: band b's recent service at node n, decayed to time SAT[n];
- DEF[n, t]: tenant t's deficit; ACT[n * B + b] with AQ[n * B + b] = (head, count): band b's
  backlogged tenants in round-robin order (a ring of capacity T); CTURN[n, b]: the head tenant
  has had this round's quantum;
- NEXT[n] = (band, line) chosen by the last look at the head (-1: none; a put or a take clears it);
- BAND[t], QUANT[t]: each tenant's band (its index among the table's bands) and quantum; MINSH[b];
- OWN[n, b], DUR[n, b]: the work node n served to band b, and to any band while b was backlogged,
  from the time FROM[0] on (`ClassQueue.own`, `during` and `count_from`).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit

from helmgr.memory import kv_table as kvmod
from helmgr.sim.engine_layout import FAIR, NBANDS, NLINES, QH, QT, R_NCANDS, R_NITEMS, R_PREFIX, R_TENANT, R_USER, R_WORK
from helmgr.sim.engine_layout import _ring_put, _ring_take
from helmgr.sim.node_queue import QUANTUM_TOKENS, SHARE_TAU_S

LQ, SERV, SAT, DEF, ACT, AQ, CTURN, NEXT, BAND, QUANT, MINSH, OWN, DUR, FROM = range(14)


def class_queues(table, fair: bool, nodes: int, count_from: float = 0.0) -> tuple[int, int, tuple]:
    """(lines a node, bands, CQ) for `table` (None: (0, 0, placeholders) for FCFS rings), counting
    each band's service from `count_from` on."""
    if table is None:
        z, zi = np.zeros((1, 1)), np.zeros((1, 2), np.int64)
        return 0, 0, (zi, z, np.zeros(1), z, zi, zi, zi, np.full((1, 2), -1, np.int64), np.zeros(1, np.int64),
                      np.zeros(1), np.zeros(1), z, z, np.zeros(1))
    band_of = [table.classes[c].band for c in table.tenant_class]
    bands = sorted(set(band_of))
    t, b = len(band_of), len(bands)
    lines = t if fair else b
    minsh = [max(cl.min_share for cl in table.classes if cl.band == x) for x in bands]
    cq = (np.zeros((nodes * lines, 2), np.int64), np.zeros((nodes, b)), np.zeros(nodes), np.zeros((nodes, t)),
          np.zeros((nodes * b, t), np.int64), np.zeros((nodes * b, 2), np.int64), np.zeros((nodes, b), np.int64),
          np.full((nodes, 2), -1, np.int64), np.array([bands.index(x) for x in band_of], np.int64),
          QUANTUM_TOKENS * table.tenant_weight, np.array(minsh),
          np.zeros((nodes, b)), np.zeros((nodes, b)), np.array([count_from]))
    return lines, b, cq


@njit(cache=True, nogil=True)
def uncached_work(n, s, RI, KVM, KVT):
    """What request s charges its tenant at node n: the tokens of its batch the node must compute
    (its prefix not in the node's KV cache, its new actions, its candidates)."""
    prefix = RI[s, R_PREFIX]
    cached = kvmod.kv_peek(KVM[n], KVT[n], RI[s, R_USER])
    return prefix + RI[s, R_NITEMS] + RI[s, R_NCANDS] - min(prefix, cached)


@njit(cache=True, nogil=True)
def cq_put(n, s, work, G, I, Q, RI, CQ):
    """ClassQueue.append: queue slot s at node n, charged `work` when served."""
    lq, deficit, act, aq, nxt, band_of = CQ[LQ], CQ[DEF], CQ[ACT], CQ[AQ], CQ[NEXT], CQ[BAND]
    t = RI[s, R_TENANT]
    b = band_of[t]
    line = t if G[FAIR] else b
    r = n * G[NLINES] + line
    if lq[r, 1] == lq[r, 0] and G[FAIR]:        # the tenant's backlog begins: last in its band's round
        k = n * G[NBANDS] + b
        cap = act.shape[1]
        act[k, (aq[k, 0] + aq[k, 1]) % cap] = line
        aq[k, 1] += 1
        deficit[n, line] = 0.0
    RI[s, R_WORK] = work
    _ring_put(Q, r, lq, 0, 1, s)
    I[n, QT] += 1
    nxt[n, 0] = -1


@njit(cache=True, nogil=True)
def _decay(n, now, serv, sat):
    if now > sat[n]:
        f = math.exp(-(now - sat[n]) / SHARE_TAU_S)
        for b in range(serv.shape[1]):
            serv[n, b] *= f
        sat[n] = now


@njit(cache=True, nogil=True)
def _backlogged(n, b, G, lq, aq):
    if G[FAIR]:
        return aq[n * G[NBANDS] + b, 1] > 0
    r = n * G[NLINES] + b
    return lq[r, 1] > lq[r, 0]


@njit(cache=True, nogil=True)
def _band(n, now, G, CQ):
    """ClassQueue._band: the first backlogged band under its minimum share (fair only), else the
    first backlogged band."""
    lq, aq, serv, sat, minsh = CQ[LQ], CQ[AQ], CQ[SERV], CQ[SAT], CQ[MINSH]
    _decay(n, now, serv, sat)
    total = 0.0
    for b in range(G[NBANDS]):
        total += serv[n, b]
    first = -1
    for b in range(G[NBANDS]):
        if not _backlogged(n, b, G, lq, aq):
            continue
        if first < 0:
            first = b
        elif G[FAIR] and total > 0 and serv[n, b] < minsh[b] * total:
            return b
    return first


@njit(cache=True, nogil=True)
def _tenant(n, b, G, Q, RI, CQ):
    """ClassQueue._tenant: deficit round robin over band b's backlogged tenants."""
    lq, deficit, act, aq, turn, quant = CQ[LQ], CQ[DEF], CQ[ACT], CQ[AQ], CQ[CTURN], CQ[QUANT]
    k = n * G[NBANDS] + b
    cap = act.shape[1]
    while True:
        t = act[k, aq[k, 0]]
        if not turn[n, b]:
            deficit[n, t] += quant[t]
            turn[n, b] = 1
        r = n * G[NLINES] + t
        q = Q[r]
        if deficit[n, t] >= RI[q[lq[r, 0] % q.shape[0]], R_WORK]:
            return t
        act[k, (aq[k, 0] + aq[k, 1]) % cap] = t          # rotate: the head goes last
        aq[k, 0] = (aq[k, 0] + 1) % cap
        turn[n, b] = 0


@njit(cache=True, nogil=True)
def _choose(n, now, G, Q, RI, CQ):
    nxt = CQ[NEXT]
    if nxt[n, 0] < 0:
        b = _band(n, now, G, CQ)
        nxt[n, 0], nxt[n, 1] = b, _tenant(n, b, G, Q, RI, CQ) if G[FAIR] else b
    return nxt[n, 0], nxt[n, 1]


@njit(cache=True, nogil=True)
def cq_head(n, now, G, Q, RI, CQ):
    """ClassQueue[0]: the slot node n would serve next (the queue is not empty)."""
    b, line = _choose(n, now, G, Q, RI, CQ)
    r = n * G[NLINES] + line
    q = Q[r]
    return q[CQ[LQ][r, 0] % q.shape[0]]


@njit(cache=True, nogil=True)
def cq_take(n, now, G, I, Q, RI, CQ):
    """ClassQueue.popleft: the slot node n serves next, taken off its line and charged."""
    b, line = _choose(n, now, G, Q, RI, CQ)
    lq, serv, deficit, aq, turn, own, dur = CQ[LQ], CQ[SERV], CQ[DEF], CQ[AQ], CQ[CTURN], CQ[OWN], CQ[DUR]
    r = n * G[NLINES] + line
    q = Q[r]
    work = RI[q[lq[r, 0] % q.shape[0]], R_WORK]
    if now >= CQ[FROM][0]:
        for x in range(G[NBANDS]):               # (before the take may end the band's backlog)
            if _backlogged(n, x, G, lq, aq):
                dur[n, x] += work
        own[n, b] += work
    s = _ring_take(Q, r, lq, 0)
    I[n, QH] += 1
    CQ[NEXT][n, 0] = -1
    _decay(n, now, serv, CQ[SAT])
    serv[n, b] += work
    if G[FAIR]:
        deficit[n, line] -= work
        if lq[r, 1] == lq[r, 0]:                 # a tenant that empties leaves with no credit
            k = n * G[NBANDS] + b
            aq[k, 0] = (aq[k, 0] + 1) % CQ[ACT].shape[1]
            aq[k, 1] -= 1
            deficit[n, line] = 0.0
            turn[n, b] = 0
    return s
