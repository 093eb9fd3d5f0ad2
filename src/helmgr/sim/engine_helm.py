"""The HELM router (routing/helm.py) compiled for the engine (sim/engine.py): its books (the work
sent to each node, the heap of when nodes free up, the load estimate), its index's holders (who
holds which user's prefix, in the order the index learnt it), and its decision (the compiled
`routing.kernel.decide` it already uses). Each verb is `Helm`'s, step for step. The helpers that run
several times a request take the members of the books (H) they use, not the tuple: numba takes a
reference on every array an argument holds each time a call binds it."""
from __future__ import annotations

import numpy as np
from numba import njit

from helmgr.memory import kv_table as kvmod
from helmgr.routing.helm import FREE_HEAP
from helmgr.routing.kernel import FREE as M_FREE, RATE as K_RATE, RHO as K_RHO, SOONEST as K_SOONEST, UP as M_UP
from helmgr.routing.kernel import decide as route_decide
from helmgr.sim.engine_layout import *  # noqa: F403
from helmgr.sim.engine_layout import _drop_top, _ring_put, _ring_take, _sift_down, _sift_up
from helmgr.sim.engine_routes import _route


_HMIX = -7046029254386353131


@njit(cache=True, nogil=True)
def _moved(mine, c, ft, fi, G, I, node):
    """Helm._moved and _clean: node's FREE changed; the heap's top becomes the up node that
    frees first (consts[SOONEST]). The heap (ft, fi) never grows: it is rebuilt past FREE_HEAP
    entries a node (plus 64), as Helm._moved does, so it holds at most one more."""
    n_nodes = mine.shape[0]
    I[node, VER] += 1
    n = G[FHN]
    ft[n], fi[n, 0], fi[n, 1] = mine[node, M_FREE], node, I[node, VER]
    _sift_up(ft, fi, n)
    n += 1
    if n > FREE_HEAP * n_nodes + 64:          # stale entries pile up: rebuild from the books
        n = n_nodes
        for k in range(n):
            ft[k], fi[k, 0], fi[k, 1] = mine[k, M_FREE], k, I[k, VER]
        for k in range(n // 2 - 1, -1, -1):
            _sift_down(ft, fi, k, n)
    while n > 0 and (fi[0, 1] != I[fi[0, 0], VER] or mine[fi[0, 0], M_UP] <= 0):
        n = _drop_top(ft, fi, n)
    G[FHN] = n
    c[K_SOONEST] = fi[0, 0] if n > 0 else -1


@njit(cache=True, nogil=True)
def _hslot(keys, user):
    """The holders map's slot of `user`, or the first free slot on its probe path (as -2 - slot)."""
    mask = keys.shape[0] - 1
    h = user * _HMIX
    i = (h ^ (h >> 32)) & mask
    free = -1
    while True:
        k = keys[i]
        if k == user:
            return i
        if k == -1:
            return -2 - (free if free >= 0 else i)
        if k == -2 and free < 0:
            free = i
        i = (i + 1) & mask


@njit(cache=True, nogil=True)
def _hgrow(HM, G):
    old = HM[0]
    slots = old.shape[1]
    if 2 * (G[HCNT] + 1) > slots:
        slots *= 2
    new = np.full((3, slots), -1, np.int64)
    for i in range(old.shape[1]):
        if old[M_KEY, i] >= 0:
            j = -2 - _hslot(new[M_KEY], old[M_KEY, i])
            new[M_KEY, j], new[M_HEAD, j], new[M_TAIL, j] = old[M_KEY, i], old[M_HEAD, i], old[M_TAIL, i]
    HM[0] = new
    G[HTOMB] = 0


@njit(cache=True, nogil=True)
def _expect(HM, HE, G, node, user, tokens):
    """ResidencyIndex.expect: holders[user][node] = tokens (a new node goes last), in the holders
    map HM[0] and its entries HE[0]."""
    m = HM[0]
    i = _hslot(m[M_KEY], user)
    ent = HE[0]
    if i >= 0:
        e = m[M_HEAD, i]
        while e >= 0:
            if ent[E_NODE, e] == node:
                ent[E_TOK, e] = tokens
                return
            e = ent[E_NEXT, e]
    else:
        if 2 * (G[HCNT] + G[HTOMB] + 1) > m.shape[1]:
            _hgrow(HM, G)
            m = HM[0]
        i = -2 - _hslot(m[M_KEY], user)
        if m[M_KEY, i] == -2:
            G[HTOMB] -= 1
        m[M_KEY, i], m[M_HEAD, i], m[M_TAIL, i] = user, -1, -1
        G[HCNT] += 1
    if G[EFREE] < 0:                          # no free entry: double the pool
        old = ent.shape[1]
        grown = np.full((3, 2 * old), -1, np.int64)
        grown[:, :old] = ent
        for k in range(old, 2 * old - 1):
            grown[E_NEXT, k] = k + 1
        grown[E_NEXT, 2 * old - 1] = -1
        HE[0] = ent = grown
        G[EFREE] = old
    e = G[EFREE]
    G[EFREE] = ent[E_NEXT, e]
    ent[E_NODE, e], ent[E_TOK, e], ent[E_NEXT, e] = node, tokens, -1
    if m[M_TAIL, i] >= 0:
        ent[E_NEXT, m[M_TAIL, i]] = e
    else:
        m[M_HEAD, i] = e
    m[M_TAIL, i] = e


@njit(cache=True, nogil=True)
def _forget(HM, HE, G, node, user):
    """ResidencyIndex.apply_kv of an eviction: node no longer holds user (a user held nowhere
    leaves the map)."""
    m = HM[0]
    i = _hslot(m[M_KEY], user)
    if i < 0:
        return
    ent = HE[0]
    prev, e = -1, m[M_HEAD, i]
    while e >= 0 and ent[E_NODE, e] != node:
        prev, e = e, ent[E_NEXT, e]
    if e < 0:
        return
    nxt = ent[E_NEXT, e]
    if prev >= 0:
        ent[E_NEXT, prev] = nxt
    else:
        m[M_HEAD, i] = nxt
    if m[M_TAIL, i] == e:
        m[M_TAIL, i] = prev
    ent[E_NEXT, e] = G[EFREE]
    G[EFREE] = e
    if m[M_HEAD, i] < 0:
        m[M_KEY, i] = -2
        G[HCNT] -= 1
        G[HTOMB] += 1


@njit(cache=True, nogil=True)
def apply_events(H, G, node, users, tokens):
    """ResidencyIndex.apply_events into the compiled holders, in order: `node` holds tokens[k] of
    users[k] (0: no longer holds it). One call per report: a call from Python costs the
    dispatcher's typing of H, far more than the events."""
    HM, HE = H[H_MAP], H[H_ENT]
    for k in range(users.shape[0]):
        if tokens[k]:
            _expect(HM, HE, G, node, users[k], tokens[k])
        else:
            _forget(HM, HE, G, node, users[k])


@njit(cache=True, nogil=True)
def _holders(HM, HE, user):
    """Helm.route_request's two longest cached prefixes of user: (hn0, ht0, hn1, ht1), a stable
    sort by tokens, descending, over the nodes in the order they were added."""
    m = HM[0]
    i = _hslot(m[M_KEY], user)
    hn0 = ht0 = hn1 = ht1 = -1
    if i < 0:
        return hn0, ht0, hn1, ht1
    ent = HE[0]
    e = m[M_HEAD, i]
    while e >= 0:
        t = ent[E_TOK, e]
        if hn0 < 0 or t > ht0:
            hn1, ht1 = hn0, ht0
            hn0, ht0 = ent[E_NODE, e], t
        elif hn1 < 0 or t > ht1:
            hn1, ht1 = ent[E_NODE, e], t
        e = ent[E_NEXT, e]
    return hn0, ht0, hn1, ht1


@njit(cache=True, nogil=True)
def _helm_route(now, s, I, G, RI, IDSI, IDSC, H, limit):
    """Helm.route_request then dispatched, for request slot s arriving at `now`; SHED instead of
    the dispatch when the chosen node is predicted to finish it more than `limit` seconds after
    it arrives (Shedding.late in sim/tenancy.py; inf: never)."""
    mine, c, f = H[H_MINE], H[H_C], H[H_F]
    hn0 = ht0 = hn1 = ht1 = -1
    user, prefix = RI[s, R_USER], RI[s, R_PREFIX]
    if G[KVTERM]:
        hn0, ht0, hn1, ht1 = _holders(H[H_MAP], H[H_ENT], user)
    if now - f[HF_RHO_T] >= f[HF_SPAN]:
        span = now - f[HF_RHO_T]
        up = 0.0
        for k in range(mine.shape[0]):
            up += mine[k, M_UP]
        up = int(up)
        if span > 0 and up:
            rho, rate = f[HF_WSENT] / (span * up), G[SENT] / (span * up)
            first = f[HF_RHO_T] == 0.0
            f[HF_RHO] = rho if first else 0.5 * f[HF_RHO] + 0.5 * rho
            f[HF_RATE] = rate if first else 0.5 * f[HF_RATE] + 0.5 * rate
        f[HF_WSENT], G[SENT], f[HF_RHO_T] = 0.0, 0, now
        c[K_RHO], c[K_RATE] = f[HF_RHO], f[HF_RATE]
    G[LEFT] -= 1
    i0, ni = RI[s, R_IOFF], RI[s, R_NITEMS]          # an arriving request's ids are in store 0
    c0, nc = RI[s, R_COFF], RI[s, R_NCANDS]
    node, svc = route_decide(now, prefix, IDSI[0][i0:i0 + ni], IDSC[0][c0:c0 + nc], hn0, ht0, hn1, ht1, user,
                             RI[s, R_SEG], H[H_DRAWS][0], H[H_BITS], H[H_NODE], mine, c)
    if node < 0:
        node, svc = _route(I, G), 0.0
    G[LASTNODE], f[HF_LAST] = node, svc
    if limit < np.inf:
        free = mine[node, M_FREE]
        if (free if free >= now else now) + svc - now > limit:
            return SHED
    # dispatched
    I[node, LOAD] += 1
    f[HF_WSENT] += svc
    G[SENT] += 1
    free = mine[node, M_FREE]
    mine[node, M_FREE] = (free if free > now else now) + svc
    w = H[H_WORK]
    w[node] += svc
    _ring_put(H[H_PEND], node, I, PH, PT, svc)
    _moved(mine, c, H[H_FT], H[H_FI], G, I, node)
    if G[KVTERM]:
        _expect(H[H_MAP], H[H_ENT], G, node, user, prefix + ni)
    return node


@njit(cache=True, nogil=True)
def _helm_completed(H, G, I, node, now, count):
    """`count` of node's requests completed at `now`, one after another."""
    w, pend, mine, c, ft, fi = H[H_WORK], H[H_PEND], H[H_MINE], H[H_C], H[H_FT], H[H_FI]
    for _ in range(count):
        I[node, LOAD] -= 1
        if I[node, PT] > I[node, PH]:
            w[node] -= _ring_take(pend, node, I, PH)
        if I[node, PT] == I[node, PH]:
            w[node] = 0.0
        mine[node, M_FREE] = now + w[node]
        _moved(mine, c, ft, fi, G, I, node)


@njit(cache=True, nogil=True)
def _helm_kv_events(H, G, I, n, log, a, b):
    """ResidencyIndex.apply_kv of node n's KV events log[:, a:b] (what Cluster.start reports)."""
    HM, HE = H[H_MAP], H[H_ENT]
    for k in range(a, b):
        tokens = log[2, k] if log[0, k] == kvmod.EVENT else log[3, k]
        if tokens:
            _expect(HM, HE, G, n, log[1, k], tokens)
        else:
            _forget(HM, HE, G, n, log[1, k])
    I[n, KVEV] += b - a
