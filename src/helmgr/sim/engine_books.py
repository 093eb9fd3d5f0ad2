"""The routers' books between their Python objects and the engine's arrays (sim/engine.py): read
in when a compiled run starts (`books_in`), written back when it ends (`books_out`), so the
router and its index are left as the Python path leaves them."""
from __future__ import annotations

from collections import OrderedDict, deque

import numpy as np

from helmgr.memory import kv_table as kvmod
from helmgr.routing import kernel as route_kernel
from helmgr.routing.helm import FREE_HEAP
from helmgr.sim.engine_helm import _expect
from helmgr.sim.engine_helm import apply_events as _apply_events
from helmgr.sim.engine_layout import *  # noqa: F403
from helmgr.sim.engine_layout import _grow1, at, put, typed_list
from helmgr.sim.engine_routes import PA_SHIFT, _prefix_dispatched


def books_in(c, mode: int, G: np.ndarray, I: np.ndarray) -> tuple:
    """H: the HELM router's books and its index's holders, or the prefix-aware router's map, as
    arrays (dummies of the same types for the others); the routers' counters into G and I."""
    n = c.cfg.nodes
    pend = typed_list([np.zeros(16) for _ in range(n)])
    ft, fi = np.zeros(FREE_HEAP * n + 65), np.zeros((FREE_HEAP * n + 65, 2), np.int64)   # engine_helm._moved
    entries = np.full((3, 1024), -1, np.int64)
    entries[E_NEXT, :-1] = np.arange(1, 1024)
    hmap, ent = typed_list([np.full((3, 1024), -1, np.int64)]), typed_list([entries])
    f = np.zeros(NHF)
    r = c.router
    pmeta, ptab, _ = kvmod.kv_arrays(1, 1, slots=1024)
    pf = np.zeros(3)
    if mode == PREFIX_AWARE:
        pf[:] = r.abs_threshold, r.rel_threshold, r.cache_threshold
        G[PMEMORY] = r.MEMORY
        I[:, LOAD] = r.load
    prefix = (pmeta, typed_list([ptab]), pf)
    if mode != HELM:
        H = (np.zeros((n, 2)), np.zeros(route_kernel.N_CONSTS), np.zeros((n, 1), np.uint8), np.zeros((n, 4)), f,
             np.zeros(n), pend, ft, fi, hmap, ent, typed_list([np.zeros(1)])) + prefix
        if mode == PREFIX_AWARE:
            for user, (node, tokens) in r.where.items():
                _prefix_dispatched(G, H, node, user, tokens)
        return H
    f[[HF_WSENT, HF_RHO_T, HF_RHO, HF_RATE, HF_LAST, HF_SPAN]] = (r._work_sent, r._rho_t, r.rho, r.rate, r._last[1],
                                                                 r.RHO_SPAN_S)
    G[SENT], G[LEFT], G[KVTERM], G[BLOCK], G[LASTNODE] = r._sent, r._left, r.kv_term, r.BLOCK, r._last[0]
    I[:, LOAD], I[:, VER] = r.load, r._version
    for i, q in enumerate(r.pending):
        ring = _grow1(at(pend, i), len(q) + 1)
        ring[:len(q)] = list(q)
        put(pend, i, ring)
        I[i, PH], I[i, PT] = 0, len(q)
    heap = r._freeing
    for k, (t, node, version) in enumerate(heap):
        ft[k], fi[k] = t, (node, version)
    G[FHN] = len(heap)
    H = (r.mine, r.consts, c.index.bits, c.index.node, f, np.array(r.work, float), pend, ft, fi, hmap, ent,
         typed_list([np.asarray(r._draws, float) if len(r._draws) else np.zeros(1)])) + prefix
    for user, where in c.index.holders.items():
        for node, tokens in where.items():
            _expect(hmap, ent, G, node, user, tokens)
    return H


def next_draws(router, H: tuple, G: np.ndarray) -> None:
    """Helm.route_request's next block of random draws (from the router's own generator)."""
    put(H[H_DRAWS], 0, router.rng.random(router.BLOCK * (router.d + route_kernel.DRAWS)))
    router.consts[route_kernel.POS] = 0
    G[LEFT] = router.BLOCK


def apply_events(H: tuple, G: np.ndarray, n: int, events) -> None:
    """ResidencyIndex.apply_events into the compiled holders (reports sent from Python)."""
    events = list(events)
    if events:
        users, tokens = np.array(events, np.int64).reshape(-1, 2).T
        _apply_events(H, G, n, np.ascontiguousarray(users), np.ascontiguousarray(tokens))


def books_out(c, mode: int, H: tuple, G: np.ndarray, I: np.ndarray) -> None:
    """The router's (and its index's) Python state from the arrays, as the Python path leaves it."""
    r = c.router
    if mode in (LEAST_LOADED, PREFIX_AWARE):
        r.load, r._turn = I[:, LOAD].tolist(), int(G[TURN])
    elif mode == ROUND_ROBIN:
        r.load, r.next = I[:, LOAD].tolist(), int(G[TURN])
    if mode == PREFIX_AWARE:
        meta, tab = H[H_PMETA], at(H[H_PTAB], 0)
        order = kvmod.kv_order(meta, tab)
        v = tab[kvmod.TOK, order]
        r.where = OrderedDict(zip(tab[kvmod.KEY, order].tolist(),
                                  zip((v & ((1 << PA_SHIFT) - 1)).tolist(), (v >> PA_SHIFT).tolist())))
    if mode != HELM:
        return
    f = H[H_F]
    r.load, r._version, r.work = I[:, LOAD].tolist(), I[:, VER].tolist(), H[H_WORK].tolist()
    rings = [at(H[H_PEND], i) for i in range(c.cfg.nodes)]
    r.pending = [deque(q[np.arange(I[i, PH], I[i, PT]) % len(q)].tolist()) for i, q in enumerate(rings)]
    k = int(G[FHN])
    times, keys = H[H_FT], H[H_FI]
    r._freeing = list(zip(times[:k].tolist(), keys[:k, 0].tolist(), keys[:k, 1].tolist()))
    r._work_sent, r._rho_t, r.rho, r.rate = (float(f[x]) for x in (HF_WSENT, HF_RHO_T, HF_RHO, HF_RATE))
    r._sent, r._left, r._draws = int(G[SENT]), int(G[LEFT]), at(H[H_DRAWS], 0)
    r._last = (int(G[LASTNODE]), float(f[HF_LAST]))
    index = c.index
    index.__dict__.pop("apply_events", None)
    holders = {}
    m, ent = at(H[H_MAP], 0), at(H[H_ENT], 0)
    for i in np.flatnonzero(m[M_KEY] >= 0).tolist():
        where, e = {}, int(m[M_HEAD, i])
        while e >= 0:
            where[int(ent[E_NODE, e])] = int(ent[E_TOK, e])
            e = int(ent[E_NEXT, e])
        holders[int(m[M_KEY, i])] = where
    index.holders = r._holders = holders
    for n, k in enumerate(I[:, KVEV].tolist()):
        index.kv_version[n] += k
        c.reporters[n].kv_version += k
