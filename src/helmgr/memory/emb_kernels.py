"""The EMB cache's compiled passes (memory/emb.py is the cache): the residency check, the
refresh's pass over the accesses (with a prefetch intrinsic), the rank selection and the window's
re-selection. Row states: ABSENT, RESIDENT, UNFILLED."""
from __future__ import annotations

import math

import llvmlite.ir as llvm_ir
import numpy as np
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from helmgr.memory.eviction import value_at_rank as eviction_value_at_rank


ABSENT, RESIDENT, UNFILLED = 0, 1, 2
_NO_ROWS = np.zeros(0, np.int64)
_AHEAD = 64                      # accesses a random pass prefetches ahead


@njit(cache=True, nogil=True, inline="always")
def _descend(hist, b, need):
    """From bin b down, the bin where `need` more values are reached: (that bin, what is still
    needed in it)."""
    while hist[b] < need:
        need -= hist[b]
        b -= 1
    return b, need


@njit(cache=True, nogil=True)
def _radix_ranks(bits, ra, rb):
    """The values at ranks ra and rb (0 = highest; rb < 0: ra's only) of float32 scores seen as
    uint32, by two 16-bit radix passes that serve both ranks: [pattern, rows above it, rows tied
    with it] for ra, then for rb (-1s for rb < 0). Every pattern is -1 if a score has its sign bit
    set (the patterns' order is the floats' order only for x >= +0). The counts come from the
    histograms, so no third pass: a rank's value and how many rows are above it are the
    selection's whole answer (`_cut`)."""
    out = np.full(6, -1, np.int64)
    hist = np.zeros(65536, np.int32)
    for b in bits:
        hist[b >> 16] += 1
    if hist[32768:].sum():
        return out
    ha, na = _descend(hist, 32767, ra + 1)
    hb, nb = _descend(hist, 32767, rb + 1) if rb >= 0 else (-1, 0)
    low_a = np.zeros(65536, np.int32)
    low_b = low_a if hb == ha or hb < 0 else np.zeros(65536, np.int32)
    for b in bits:
        h = b >> 16
        if h == ha:
            low_a[b & 0xFFFF] += 1
        elif h == hb:
            low_b[b & 0xFFFF] += 1
    la, na = _descend(low_a, 65535, na)
    out[0], out[1], out[2] = (ha << 16) | la, ra + 1 - na, low_a[la]
    if rb >= 0:
        lb, nb = _descend(low_b, 65535, nb)
        out[3], out[4], out[5] = (hb << 16) | lb, rb + 1 - nb, low_b[lb]
    return out


@njit(cache=True, nogil=True, inline="always")
def _as_float(pattern):
    return np.array([pattern], np.uint32).view(np.float32)[0]


def value_at_rank(scores: np.ndarray, r: int):
    """`eviction.value_at_rank` for the float32 scores of this cache, compiled: two linear passes
    instead of a partition (the same value: the rank's value is unique)."""
    if scores.dtype == np.float32 and 0 <= r < len(scores):
        pattern = _radix_ranks(scores.view(np.uint32), r, -1)[0]
        if pattern >= 0:
            return np.array([pattern], np.uint32).view(np.float32)[0]
    return eviction_value_at_rank(scores, r)


def values_at_ranks(scores: np.ndarray, ra: int, rb: int):
    """`value_at_rank` at two ranks, with the passes over `scores` shared."""
    if scores.dtype == np.float32 and 0 <= ra < len(scores) and 0 <= rb < len(scores):
        out = _radix_ranks(scores.view(np.uint32), ra, rb)
        if out[0] >= 0:
            return np.array([out[0], out[3]], np.uint32).view(np.float32)
    return eviction_value_at_rank(scores, ra), eviction_value_at_rank(scores, rb)


@njit(cache=True, nogil=True)
def _check(state, ids):
    """`ids`' resident and unfilled rows (a repeated id counts each time); the unfilled ones then
    become resident (the miss fetched them). Returns (hits, unfilled)."""
    _, hits, unfilled = _check_sampled(state, ids, 0)
    return hits, unfilled


@njit(cache=True, nogil=True)
def _check_sampled(state, ids, shift):
    """`_check` on a cache that tracks one row in 2**shift (0: every row), the sampled ids (those
    with low bits 0; row = id >> shift): returns (sampled ids, of them resident, of them unfilled),
    and admits the unfilled ones. Other ids are not looked at."""
    low = (np.int64(1) << shift) - 1
    n = hits = unfilled = 0
    for s in ids:
        if s & low == 0:
            n += 1
            st = state[s >> shift]
            if st == RESIDENT:
                hits += 1
            elif st == UNFILLED:
                unfilled += 1
    if unfilled:
        for s in ids:
            if s & low == 0 and state[s >> shift] == UNFILLED:
                state[s >> shift] = RESIDENT
    return n, hits, unfilled


@njit(cache=True, nogil=True, inline="always")
def sampled_counts(ids, sampled, hits, unfilled, shift):
    """A lookup of `ids` ids, (hits, unfilled) scaled up from its sampled ones': each sampled miss
    stands for 2**shift misses. Unbiased, not capped: a small lookup can miss more ids than it
    has (hits < 0); sums over many are what the estimate is for."""
    return ids - ((sampled - hits) << shift), unfilled << shift


# -- the refresh's kernels ------------------------------------------------------------------
@intrinsic
def _prefetch(typingctx, array, index):
    """Start loading `array[index]` into the cache (LLVM's prefetch: for a write, keep it close).
    Between refreshes the scores are out of cache; a pass over random rows that asks for a row
    some accesses ahead keeps many loads in flight instead of waiting on each (~3x here)."""
    def codegen(context, builder, signature, args):
        aryty = signature.args[0]
        ary = context.make_array(aryty)(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, aryty, ary, [args[1]], wraparound=False)
        i8p, i32 = llvm_ir.IntType(8).as_pointer(), llvm_ir.IntType(32)
        fnty = llvm_ir.FunctionType(llvm_ir.VoidType(), [i8p, i32, i32, i32])
        fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0i8")
        builder.call(fn, [builder.bitcast(ptr, i8p), i32(1), i32(3), i32(1)])   # write, keep, data
        return context.get_dummy_value()
    return types.void(array, index), codegen


@njit(cache=True, nogil=True)
def _add(acc, scores, state, shadow, weight, lo, hi):
    """LFU's refresh in one pass over the accesses `acc`: each adds `weight` to its row's score
    (float32, one access at a time). Scores only grow, so a row crosses an edge of the window
    [lo, hi] at most once: rising above `hi` it is wanted; rising past `lo` it joins the window.
    The `shadow` rows carry a flipped sign during the pass, which counts their accesses. Returns
    (rows that rose above the window, rows that joined it, the shadow's accesses), or a shadow
    count of -1, with nothing changed, if an id is outside the table. Branch-free: which side of
    the window an access lands on is a coin toss the CPU cannot predict."""
    n = len(scores)
    for a in acc:
        if a < 0 or a >= n:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), -1
    for r in shadow:
        scores[r] = -scores[r]
    rose = np.empty(len(acc), np.int64)
    joined = np.empty(len(acc), np.int64)
    m = j = hits = 0
    for i in range(len(acc)):
        _prefetch(scores, acc[min(i + _AHEAD, len(acc) - 1)])
        a = acc[i]
        o = scores[a]
        t = abs(o)
        v = t + weight
        scores[a] = math.copysign(v, o)
        hits += np.signbit(o)
        rose[m] = a                                # kept only if the access crossed (m moves on)
        m += (t <= hi) & (v > hi)
        joined[j] = a
        j += (t < lo) & (v >= lo) & (v <= hi)
    for r in shadow:
        scores[r] = abs(scores[r])
    for r in rose[:m]:
        if state[r] == ABSENT:
            state[r] = UNFILLED
    return rose[:m], joined[:j], hits


@njit(cache=True, nogil=True)
def _cut(vals, rows, k):
    """The key of the k-th best of `rows` (scores `vals`) by (score desc, row id asc): (score,
    the highest row id kept among rows of that score); nothing is kept for k = 0."""
    if k <= 0:
        return np.float32(np.inf), np.int64(-1)
    return _cut_at(vals, rows, k, _radix_ranks(vals.view(np.uint32), k - 1, -1)[:3])


@njit(cache=True, nogil=True, inline="always")
def _cut_at(vals, rows, k, sel):
    """`_cut` from the selection `sel` of rank k - 1 (`_radix_ranks`: pattern, above, tied)."""
    if k <= 0:
        return np.float32(np.inf), np.int64(-1)
    p = _as_float(sel[0])
    need = k - sel[1]
    if need == sel[2]:
        return p, np.int64(1) << 62
    ties = rows[vals == p]
    ties.sort()
    return p, ties[need - 1]


@njit(cache=True, nogil=True)
def _settle(scores, state, window, joined, hi, k, m):
    """Re-select inside the window: `window` and `joined` less the rows that rose above `hi`; its
    best k rows are wanted, the rest are not. Returns (the window, rows newly wanted, wanted rows
    dropped that were resident, the score of the k-th, the shadow): with 0 < m <= the window's
    rows, the shadow is its rows not wanted that score at least its m-th best (EmbCache._rows_below
    of the window, read here from the scores already gathered); else None."""
    rows = np.empty(len(window) + len(joined), np.int64)
    vals = np.empty(len(rows), np.float32)
    j = 0
    for part in (window, joined):
        for i in range(len(part)):
            _prefetch(scores, part[min(i + _AHEAD, len(part) - 1)])
            r = part[i]
            rows[j], vals[j] = r, scores[r]
            j += np.int64(scores[r] <= hi)
    rows, vals = rows[:j], vals[:j]
    shade = 0 < m <= j
    sel = _radix_ranks(vals.view(np.uint32), k - 1, m - 1 if shade else -1)
    p, last = _cut_at(vals, rows, k, sel[:3])
    floor = _cut_at(vals, rows, m, sel[3:])[0] if shade else np.float32(np.inf)
    added = np.empty(j, np.int64)
    shadow = np.empty(j if shade else 0, np.int64)
    a = dropped = n_shadow = 0
    for i in range(j):
        _prefetch(state, rows[min(i + _AHEAD, j - 1)])
        r = rows[i]
        want = (vals[i] > p) | ((vals[i] == p) & (r <= last))
        st = state[r]
        if want != (st != ABSENT):                 # (rare: branch only on a change)
            if want:
                state[r] = UNFILLED
                added[a] = r
                a += 1
            else:
                dropped += st == RESIDENT
                state[r] = ABSENT
        if shade and not want and vals[i] >= floor:
            shadow[n_shadow] = r
            n_shadow += 1
    return rows, added[:a], dropped, p, (shadow[:n_shadow] if shade else None)


@njit(cache=True, nogil=True)
def _split(scores, state, lo, hi):
    """Build the window [lo, hi]: rows above it are wanted, rows below it are not. Returns (rows
    above, the window's rows, wanted rows dropped that were resident)."""
    window = np.empty(len(scores), np.int64)       # (only the pages written are ever touched)
    above = m = dropped = 0
    for r in range(len(scores)):
        v = scores[r]
        if v > hi:
            above += 1
            if state[r] == ABSENT:
                state[r] = UNFILLED
        elif v >= lo:
            window[m] = r
            m += 1
        elif state[r] != ABSENT:
            if state[r] == RESIDENT:
                dropped += 1
            state[r] = ABSENT
    return above, window[:m].copy(), dropped


@njit(cache=True, nogil=True)
def _absent_from(scores, state, rows, floor):
    """`rows` that are absent with a score >= `floor`."""
    out = np.empty(len(rows), np.int64)
    m = 0
    for r in rows:
        if state[r] == ABSENT and scores[r] >= floor:
            out[m] = r
            m += 1
    return out[:m]
