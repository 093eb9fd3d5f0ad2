"""The baseline routers the engine (sim/engine.py) compiles: least-loaded and round-robin
(routing/base.py, routers.py) and prefix-aware (routers.py `PrefixAware`, its map of where each
user was sent kept in memory.kv's table), each `Router`'s verbs step for step."""
from __future__ import annotations

from numba import njit

from helmgr.memory import kv_table as kvmod
from helmgr.sim.engine_layout import *  # noqa: F403


@njit(cache=True, nogil=True)
def _route(I, G):
    n = G[NNODES]
    if G[MODE] == ROUND_ROBIN:
        j = G[TURN]
        G[TURN] = j + 1 if j + 1 < n else 0
        return j
    start = G[TURN]
    G[TURN] = start + 1 if start + 1 < n else 0
    m = I[0, LOAD]
    for i in range(1, n):
        if I[i, LOAD] < m:
            m = I[i, LOAD]
    for i in range(start, n):
        if I[i, LOAD] == m:
            return i
    for i in range(start):
        if I[i, LOAD] == m:
            return i
    return 0


PA_SHIFT = 20                              # where: TOK = tokens << 20 | node (nodes < 2**20)


@njit(cache=True, nogil=True)
def _prefix_route(I, G, RI, s, H):
    least = _route(I, G)
    meta, tab = H[H_PMETA], H[H_PTAB][0]
    slot = kvmod.kv_find(meta, tab, RI[s, R_USER])
    if slot < 0:
        return least
    v = tab[kvmod.TOK, slot]
    node, cached = v & ((1 << PA_SHIFT) - 1), v >> PA_SHIFT
    lo, hi = I[least, LOAD], I[0, LOAD]
    for i in range(1, G[NNODES]):
        if I[i, LOAD] > hi:
            hi = I[i, LOAD]
    pf = H[H_PF]
    if hi - lo > pf[0] and hi > pf[1] * lo:
        return least
    prefix = RI[s, R_PREFIX]
    if prefix and min(cached, prefix) >= pf[2] * prefix:
        return node
    return least


@njit(cache=True, nogil=True)
def _prefix_dispatched(G, H, node, user, tokens):
    """PrefixAware.dispatched's map update: where[user] = (node, tokens), most recent; the oldest
    forgotten past the router's memory."""
    meta = H[H_PMETA]
    tab = H[H_PTAB][0]
    slot = kvmod.kv_find(meta, tab, user)
    if slot >= 0:
        kvmod._unlink(meta, tab, slot)
    else:
        if 2 * (meta[kvmod.COUNT] + meta[kvmod.TOMBS] + 1) > tab.shape[1]:
            slots = tab.shape[1]
            while 4 * (meta[kvmod.COUNT] + 1) > slots:
                slots *= 2
            H[H_PTAB][0] = tab = kvmod._rehash(meta, tab, slots)
        slot = kvmod._claim(meta, tab, user)
    tab[kvmod.TOK, slot] = (tokens << PA_SHIFT) | node
    kvmod._link_tail(meta, tab, slot)
    if meta[kvmod.COUNT] > G[PMEMORY]:
        old = meta[kvmod.HEAD]
        kvmod._unlink(meta, tab, old)
        kvmod._delete(meta, tab, old)
