"""The compiled path's data (sim/engine.py): what each column of its arrays holds, the arrays that
grow (kept as element 0 of a numba typed List, so compiled code can replace them), and its event
heap (a plain array: a node has at most INFLIGHT departures and one launch pending).

Per node: `F` (floats) and `I` (integers), one row each; its KV cache's arrays in `KVM`, `KVT`
and `KVL` (meta, table, log; node n's ghost queue at KVM[N + n], KVT[N + n] on N nodes); cluster-wide counters in `G`; per request
(a slot from a free list, reused after completion) `RI` and `RF`; per completion, until Python
drains them, `CLI` and `CLF`. The cost model folded into `C` (floats) and `CI` (the integers the
Python path multiplies exactly).
"""
from __future__ import annotations

import numpy as np
from numba import njit
from numba.typed import List

# routing modes
LEAST_LOADED, ROUND_ROBIN, EXTERNAL, HELM, PREFIX_AWARE = 0, 1, 2, 3, 4
BATCHED, PIPELINED = 1, 2
ENGINE_CODES = {"batched": BATCHED, "pipelined": PIPELINED}

# what `step` returns
CHUNK_DONE, BOUNDARY, NEED_ROUTE, NEED_DRAWS = 0, 1, 2, 3
# what a routing answers besides a node: nothing yet, or refuse the request
NO_ROUTE, SHED = -1, -2


# per-node float columns (F)
LBU, LBS, BLK, CFREE, BUSY_S, WAIT_S, RECOMP_S, NF = range(8)
# per-node int columns (I)
(REQS, COLD, PREFIX, KVHIT, IDS, MISSES, UNF, TOKIDS, TOKMISS, LBYTES, BUSY, QH, QT, INFH, INFN, ELOOK, EHIT,
 EUNF, ACCN, ARR, LOAD, PH, PT, VER, KVEV, KVSH, NI) = range(27)      # KVSH: NodeStats.kv_shadow_tokens
# globals (G)
(POS, NARR, HEAPN, SEQ, TURN, NCOMP, RCUR, MODE, MAXB, BUDGET, ENG, NNODES, RID, NDL, NFREE, FINISH,
 SENT, LEFT, FHN, HCNT, HTOMB, EFREE, KVTERM, BLOCK, LASTNODE, PMEMORY, NLINES, NBANDS, FAIR, NSHED, NG) = range(31)
# NLINES: a node's queue lines under a class table (engine_queue.py; 0: one FCFS ring), NBANDS its
# bands, FAIR whether bands share by minimum share and tenants by deficit round robin (--tenancy
# helm), NSHED the rids shed since the last drain
# cost constants: floats (C) and integers (CI)
HBM_BW, PCIE_BW, PCIE_LAT, HOST_LOOKUP, FLOPS, LAUNCH_S, BFLOPS, BHALF, BREQ, NC = range(10)
ROW_BYTES, LAYERS, LINF, ATTF, ESHIFT, GHOSTS, NCI = range(7)   # ESHIFT: EMB caches track 1 id in 2**ESHIFT
# GHOSTS: whose KV ghost queues a recomputed prefix credits (Node._account): none (GHOSTS_OFF), the
# node's own (GHOSTS_OWN), every node's (GHOSTS_ALL: the peers of policies.track_shadows)
GHOSTS_OFF, GHOSTS_OWN, GHOSTS_ALL = 0, 1, 2
# request table columns: ints (RI) and floats (RF)
(R_RID, R_USER, R_PREFIX, R_NITEMS, R_NCANDS, R_IOFF, R_COFF, R_BURST, R_H0, R_HOFF, R_HMOD, R_HSHIFT, R_CF, R_IDS,
 R_MISSES, R_UNF, R_HITS, R_TOKHITS, R_TOKENS, R_SEG, R_STORE, R_TENANT, R_GROUP, R_WORK, NRI) = range(25)
# R_STORE: which id store holds the request's items and candidates (IDSI/IDSC[R_STORE]): 0 the
# chunk's own arrays, 1 the ids of requests queued across a chunk boundary (engine_loop.rebase);
# R_TENANT its tenant (0 without a class table), R_GROUP its prefix's KV group, R_WORK its uncached
# work when queued under a class table (engine_queue.py)
R_T, R_START, R_END, R_FETCH, R_RECOMP, R_READY, R_LAUNCH, NRF = range(8)
# completion log columns
(C_RID, C_NODE, C_BURST, C_PREFIX, C_KV, C_IDS, C_MISSES, C_UNF, C_TENANT, NCLI) = range(10)
(C_T, C_START, C_END, C_FETCH, C_RECOMP, C_LAUNCH, NCLF) = range(7)
INFLIGHT = 4                               # batches a node can have in service at once (pipelined: 2)

# H: (mine, consts, index bits, index node rows, floats, work, pending rings, free-time heap (times,
# (node, version)), holders map (KEY, HEAD, TAIL), holder entries (NODE, TOK, NEXT), draws), then the
# prefix-aware router's map of where each user was sent (memory.kv's table: user -> node + tokens
# << 20, least recently sent first) and its thresholds (absolute, relative, cache)
H_MINE, H_C, H_BITS, H_NODE, H_F, H_WORK, H_PEND, H_FT, H_FI, H_MAP, H_ENT, H_DRAWS, H_PMETA, H_PTAB, H_PF = range(15)
HF_WSENT, HF_RHO_T, HF_RHO, HF_RATE, HF_LAST, HF_SPAN, NHF = range(7)
M_KEY, M_HEAD, M_TAIL = range(3)
E_NODE, E_TOK, E_NEXT = range(3)


# -- typed lists, from Python: built and read through these cached kernels. numba.typed.List's own
# methods are compiled again in every process, once per element type: ~3.3 s of a run's start
# (docs/results/2026-12-05-study-overheads.md) ----------------------------------------------------
@njit(cache=True)
def _list_of(a):
    out = List()
    out.append(a)
    return out


@njit(cache=True)
def _list_push(lst, a):
    lst.append(a)


@njit(cache=True)
def at(lst, i):
    """lst[i]."""
    return lst[i]


@njit(cache=True)
def put(lst, i, a):
    """lst[i] = a."""
    lst[i] = a


@njit(cache=True)
def length(lst):
    return len(lst)


def typed_list(arrays) -> List:
    """A typed List of `arrays` (at least one, all of one type)."""
    it = iter(arrays)
    out = _list_of(next(it))
    for a in it:
        _list_push(out, a)
    return out


def plain_list(lst: List) -> list:
    """A typed List's items, as a Python list."""
    return [at(lst, i) for i in range(length(lst))]


# -- growable arrays (kept as element 0 of a typed List so that compiled code can replace them) -----
@njit(cache=True, nogil=True)
def _grow_rows(a, need):
    n = a.shape[0]
    if need <= n:
        return a
    m = max(need, 2 * n)
    b = np.empty((m,) + a.shape[1:], a.dtype)
    b[:n] = a
    return b


@njit(cache=True, nogil=True)
def _grow1(a, need):
    n = a.shape[0]
    if need <= n:
        return a
    b = np.empty(max(need, 2 * n), a.dtype)
    b[:n] = a
    return b


# -- rings: per node FIFO queues that double when full -----------------------------------------------
@njit(cache=True, nogil=True)
def _ring_put(rings, n, I, head, tail, value):
    """Append `value` to node n's ring `rings[n]` (its head and tail counters: I[n, head], I[n, tail]);
    a full ring is unrolled into one twice its size."""
    q = rings[n]
    if I[n, tail] - I[n, head] >= q.shape[0]:
        cap = q.shape[0]
        big = np.empty(2 * cap, q.dtype)
        for k in range(cap):
            big[k] = q[(I[n, head] + k) % cap]
        rings[n] = q = big
        I[n, tail] -= I[n, head]
        I[n, head] = 0
    q[I[n, tail] % q.shape[0]] = value
    I[n, tail] += 1


@njit(cache=True, nogil=True)
def _ring_take(rings, n, I, head):
    """The oldest value of node n's ring, taken off it (the caller checks it is not empty)."""
    q = rings[n]
    v = q[I[n, head] % q.shape[0]]
    I[n, head] += 1
    return v


# -- binary heaps keyed (time, key[0], key[1]): the event heap ((kind, seq), node as payload) and the
# HELM router's free-time heap ((node, version)) ---------------------------------------------------
@njit(cache=True, nogil=True)
def _less(ht, hk, i, j):
    if ht[i] != ht[j]:
        return ht[i] < ht[j]
    if hk[i, 0] != hk[j, 0]:
        return hk[i, 0] < hk[j, 0]
    return hk[i, 1] < hk[j, 1]


@njit(cache=True, nogil=True)
def _swap(ht, hk, i, j):
    ht[i], ht[j] = ht[j], ht[i]
    for c in range(hk.shape[1]):
        hk[i, c], hk[j, c] = hk[j, c], hk[i, c]


@njit(cache=True, nogil=True)
def _sift_up(ht, hk, i):
    while i > 0:
        p = (i - 1) >> 1
        if not _less(ht, hk, i, p):
            return
        _swap(ht, hk, i, p)
        i = p


@njit(cache=True, nogil=True)
def _sift_down(ht, hk, i, n):
    """Restore the heap below i, in ht[:n]."""
    while True:
        l, r, m = 2 * i + 1, 2 * i + 2, i
        if l < n and _less(ht, hk, l, m):
            m = l
        if r < n and _less(ht, hk, r, m):
            m = r
        if m == i:
            return
        _swap(ht, hk, i, m)
        i = m


@njit(cache=True, nogil=True)
def _drop_top(ht, hk, n):
    """Remove the top of the heap ht[:n] (the last entry takes its place); the new size."""
    n -= 1
    if n > 0:
        ht[0] = ht[n]
        hk[0] = hk[n]
        _sift_down(ht, hk, 0, n)
    return n


@njit(cache=True, nogil=True)
def _push(ht, hk, G, t, kind, node):
    """The cluster's push: a node event at t (ties by kind, then by push order). The heap never
    grows: it holds a node's departures (at most INFLIGHT batches) and its next launch."""
    n = G[HEAPN]
    if n >= ht.shape[0]:
        raise RuntimeError("more node events than the engine's heap holds")
    G[SEQ] += 1
    ht[n] = t
    hk[n, 0], hk[n, 1], hk[n, 2] = kind, G[SEQ], node
    G[HEAPN] = n + 1
    _sift_up(ht, hk, n)


@njit(cache=True, nogil=True)
def _pop(ht, hk, G):
    """Remove the top; returns (time, kind, node)."""
    t, kind, node = ht[0], hk[0, 0], hk[0, 2]
    G[HEAPN] = _drop_top(ht, hk, G[HEAPN])
    return t, kind, node
