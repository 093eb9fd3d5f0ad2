"""The node model of `sim/node.py`, compiled for the engine (sim/engine.py): a request's KV and EMB
lookups, its misses on the link, its counters, and a batch's service on the three engines —
operation for operation, so the float64 sums are the Python path's, in its order."""
from __future__ import annotations

import numpy as np
from numba import njit

from helmgr.memory import kv_table as kvmod
from helmgr.memory.emb_kernels import RESIDENT, UNFILLED, sampled_counts
from helmgr.sim.engine_layout import *  # noqa: F403  (the column names)
from helmgr.sim.engine_layout import _grow1


# -- the node model (sim/node.py, operation for operation) ------------------------------------------
@njit(cache=True, nogil=True)
def _prefix_flops(CI, tokens, cached):
    pairs = tokens * cached + tokens * (tokens + 1) // 2
    return CI[LAYERS] * (CI[LINF] * tokens + CI[ATTF] * pairs)


@njit(cache=True, nogil=True)
def _request_flops(CI, tokens, cached, candidates):
    ctx = cached + tokens
    cand = CI[LAYERS] * (CI[LINF] * candidates + CI[ATTF] * (candidates * (ctx + 1)))
    return _prefix_flops(CI, tokens, cached) + cand


_LOW = np.uint64(0x0101010101010101)       # bit 0 of each of a word's 8 bytes
_GATHER = np.uint64(0x0102040810204080)    # times the low bits: byte k's bit lands at bit 56 + k


@njit(cache=True, nogil=True)
def build_bits(state, res, unf):
    """Node's EMB row states as two bitmaps (resident, unfilled): 1/8 of the bytes, so a
    request's hundreds of random checks hit cache far more often than in `state`. States are
    0, 1, 2 (ABSENT, RESIDENT, UNFILLED): a row's resident bit is its state's bit 0, its unfilled
    bit its bit 1, gathered 8 rows per multiply from `state` read as words."""
    n = state.shape[0]
    full = n >> 6
    words = state[:full << 6].view(np.uint64)
    one, sh, top = np.uint64(1), np.uint64(1), np.uint64(56)
    for w in range(full):
        r = u = np.uint64(0)
        for j in range(8):
            x = words[8 * w + j]
            r |= (((x & _LOW) * _GATHER) >> top) << np.uint64(8 * j)
            u |= ((((x >> sh) & _LOW) * _GATHER) >> top) << np.uint64(8 * j)
        res[w], unf[w] = r, u
    if full < res.shape[0]:
        res[full] = unf[full] = 0
        for x in range(full << 6, n):
            st = state[x]
            if st == RESIDENT:
                res[x >> 6] |= one << np.uint64(x & 63)
            elif st == UNFILLED:
                unf[x >> 6] |= one << np.uint64(x & 63)


@njit(cache=True, nogil=True)
def _check_bits(RB, UB, STATES, n, ids, lo, hi):
    """emb._check over ids[lo:hi] on node n's bitmaps (rows n of RB, UB): (hits, unfilled);
    unfilled rows become resident (in the bitmaps and in STATES[n], which the Python side reads).
    The bitmaps are indexed in place, not through row views: a view, like a typed list's item,
    takes and drops a reference on its array each time (engine-profile record)."""
    h = u = np.uint64(0)
    one = np.uint64(1)
    for k in range(lo, hi):                 # branch-free: a row's two bits are never both set
        x = ids[k]
        w, b = x >> 6, np.uint64(x & 63)
        h += (RB[n, w] >> b) & one
        u += (UB[n, w] >> b) & one
    hits, unfilled = int(h), int(u)
    if unfilled:
        state = STATES[n]
        for k in range(lo, hi):
            x = ids[k]
            b = one << np.uint64(x & 63)
            if UB[n, x >> 6] & b:
                UB[n, x >> 6] &= ~b
                RB[n, x >> 6] |= b
                state[x] = RESIDENT
    return hits, unfilled


def history_index(pool: np.ndarray, sh: int) -> tuple:
    """The history pool as `_lookup` reads it: (pool, counts, rows). A cache that tracks one id in
    2**sh (sh > 0) reads a run of positions [a, b) as rows[counts[a]:counts[b]], the run's
    tracked ids (low sh bits 0) as rows (id >> sh), in order: work in tracked ids, not in ids.
    (With sh = 0, or a clone shift that moves the low bits, `_lookup` walks the pool itself.)"""
    if not sh:
        return pool, np.zeros(1, np.int32), np.zeros(0, np.int64)
    tracked = (pool & ((1 << sh) - 1)) == 0
    counts = np.zeros(len(pool) + 1, np.int32)
    np.cumsum(tracked, out=counts[1:])
    return pool, counts, pool[tracked] >> sh


@njit(cache=True, nogil=True)
def _lookup(n, s, I, RI, CI, STATES, RB, UB, ACC, KVM, KVT, IDSI, IDSC, HIST):
    """Node._lookup for request slot s on node n: its KV prefix, then its candidates' rows, then
    its computed tokens' rows (recorded for the next refresh, in that order). A sampled cache
    (ESHIFT > 0) checks and records its tracked ids only and scales their counts up
    (emb_kernels.sampled_counts, which leaves an unsampled cache's counts as they are). `HIST`:
    the history pool and its index of tracked ids (`history_index`)."""
    prefix = RI[s, R_PREFIX]
    got = kvmod.kv_lookup(KVM[n], KVT[n], RI[s, R_USER])
    cached = got if got < prefix else prefix
    nc, ni = RI[s, R_NCANDS], RI[s, R_NITEMS]
    tokens = prefix + ni - cached
    a0 = I[n, ACCN]
    acc = ACC[n]
    if a0 + nc + tokens > acc.shape[0]:
        acc = ACC[n] = _grow1(acc, a0 + nc + tokens)
    sh = CI[ESHIFT]                    # the cache tracks the ids with low sh bits 0, as rows id >> sh
    low = (1 << sh) - 1
    w = a0
    cands = IDSC[RI[s, R_STORE]]
    c0 = RI[s, R_COFF]
    for k in range(nc):
        x = cands[c0 + k]
        acc[w] = x >> sh               # each id's row written at w, w moved on for a tracked id:
        w += (x & low) == 0            # no branch to mispredict
    a1 = w
    if cached == prefix:
        items = IDSI[RI[s, R_STORE]]
        i0 = RI[s, R_IOFF]
        for k in range(ni):
            x = items[i0 + k]
            acc[w] = x >> sh
            w += (x & low) == 0
    else:                              # history positions [cached, prefix + new), read cyclically
        pool, counts, rows = HIST
        h0, hmod, shift = RI[s, R_H0], RI[s, R_HMOD], RI[s, R_HSHIFT]
        j = (RI[s, R_HOFF] + cached) % hmod
        if sh and not shift & low:     # the pool's tracked positions (`history_index`): only they are read
            up = shift >> sh
            left = tokens
            while left > 0:
                run = min(left, hmod - j)
                for q in range(counts[h0 + j], counts[h0 + j + run]):
                    acc[w] = rows[q] + up
                    w += 1
                left -= run
                j = 0
        else:
            for k in range(tokens):
                x = pool[h0 + j] + shift
                acc[w] = x >> sh
                w += (x & low) == 0
                j += 1
                if j == hmod:
                    j = 0
    h, uf = _check_bits(RB, UB, STATES, n, acc, a0, a1)
    hits, unfilled = sampled_counts(nc, a1 - a0, h, uf, sh)
    h, uf = _check_bits(RB, UB, STATES, n, acc, a1, w)
    token_hits, u = sampled_counts(tokens, w - a1, h, uf, sh)
    I[n, ACCN] = w
    ids = nc + tokens
    I[n, ELOOK] += ids
    I[n, EHIT] += hits + token_hits
    I[n, EUNF] += unfilled + u
    RI[s, R_CF], RI[s, R_TOKENS], RI[s, R_IDS] = cached, tokens, ids
    RI[s, R_HITS], RI[s, R_TOKHITS], RI[s, R_UNF] = hits + token_hits, token_hits, unfilled + u


@njit(cache=True, nogil=True)
def _fetch(n, misses, t, F, I, C, CI):
    """Node._fetch (no KV onload): `misses` rows gathered on the host from t, then copied in on the link."""
    ready = t + misses * C[HOST_LOOKUP]
    if misses:
        nbytes = misses * CI[ROW_BYTES]
        bu = F[n, LBU]
        start = ready if ready > bu else bu
        duration = C[PCIE_LAT] + nbytes / C[PCIE_BW]
        F[n, LBU] = start + duration
        F[n, LBS] += duration
        I[n, LBYTES] += nbytes
        ready = F[n, LBU]
    return ready


@njit(cache=True, nogil=True)
def _account(n, s, busy_s, fetch_s, flops_per_s, F, I, RI, CI, KVM, KVT, KVL):
    """Node._account: counters, the prefix cached, and its recompute credited to the KV ghost
    queues that held it (CI[GHOSTS])."""
    prefix, cf = RI[s, R_PREFIX], RI[s, R_CF]
    recompute = 0.0
    if cf < prefix:
        recompute = _prefix_flops(CI, prefix - cf, cf) / flops_per_s
        F[n, RECOMP_S] += recompute
        if cf == 0:
            I[n, COLD] += 1
    user = RI[s, R_USER]
    nodes = len(KVL)
    if cf < prefix and CI[GHOSTS] != GHOSTS_OFF:   # before the insert below takes the user out of them
        lo, hi = (n, n + 1) if CI[GHOSTS] == GHOSTS_OWN else (0, nodes)
        for p in range(lo, hi):
            shadow = min(kvmod.kv_peek(KVM[nodes + p], KVT[nodes + p], user), prefix) - cf
            if shadow > 0:
                I[p, KVSH] += shadow
    meta, tab, log, gm, gt = KVM[n], KVT[n], KVL[n], KVM[nodes + n], KVT[nodes + n]
    if not kvmod.kv_room(meta, tab, log, gm, gt):
        tab, log, gt = kvmod.kv_reserve(meta, tab, log, gm, gt)
        KVT[n], KVL[n], KVT[nodes + n] = tab, log, gt
    kvmod.kv_insert(meta, tab, log, user, prefix + RI[s, R_NITEMS], gm, gt, RI[s, R_GROUP])
    F[n, WAIT_S] += fetch_s
    ids, tokens = RI[s, R_IDS], RI[s, R_TOKENS]
    I[n, REQS] += 1
    I[n, PREFIX] += prefix
    I[n, KVHIT] += cf
    I[n, IDS] += ids
    I[n, MISSES] += ids - RI[s, R_HITS]
    I[n, TOKIDS] += tokens
    I[n, TOKMISS] += tokens - RI[s, R_TOKHITS]
    I[n, UNF] += RI[s, R_UNF]
    F[n, BUSY_S] += busy_s
    return recompute


@njit(cache=True, nogil=True)
def _serve(n, batch, nb, now, F, I, G, RI, RF, C, CI, STATES, RB, UB, ACC, KVM, KVT, KVL, IDSI, IDSC, HIST):
    """BatchServer.serve for `batch[:nb]` (request slots) taken at `now`: sets each request's
    service; returns (end of the batch, when the node may take its next batch)."""
    blocked = F[n, BLK]
    start = now if now >= blocked else blocked
    flops = 0.0
    rows = misses = 0
    for b in range(nb):
        s = batch[b]
        _lookup(n, s, I, RI, CI, STATES, RB, UB, ACC, KVM, KVT, IDSI, IDSC, HIST)
        misses += RI[s, R_IDS] - RI[s, R_HITS]
        flops += _request_flops(CI, RI[s, R_TOKENS], RI[s, R_CF], RI[s, R_NCANDS])
        rows += RI[s, R_IDS]
    ready = _fetch(n, misses, start, F, I, C, CI)       # the batch's misses: one gather, one copy
    cfree = F[n, CFREE]
    launch = ready if ready > cfree else cfree
    rate = C[BFLOPS] * rows / (rows + C[BHALF])
    compute = rows * CI[ROW_BYTES] / C[HBM_BW] + (flops / rate + C[LAUNCH_S] + (nb - 1) * C[BREQ])
    end = launch + compute
    share = compute / nb
    for b in range(nb):
        s = batch[b]
        RF[s, R_READY] = ready
        rec = _account(n, s, share, ready - start, rate, F, I, RI, CI, KVM, KVT, KVL)
        RF[s, R_START], RF[s, R_END], RF[s, R_FETCH], RF[s, R_RECOMP] = start, end, ready - start, rec
        RF[s, R_LAUNCH] = launch
    return end, (launch if G[ENG] == PIPELINED else end)
