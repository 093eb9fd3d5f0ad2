"""The KV cache's LRU as arrays and the compiled functions that work on them (memory/kv.py
is their Python face).

The LRU lives in three int64 arrays that compiled code (the simulator's engine) works on directly
through the `kv_*` functions; `KVCache` is the Python face of the same arrays.

- `meta[KV_META]`: the scalars, named by the indices below.
- `tab[4, slots]`: an open-addressing hash table (linear probing, `slots` a power of two) whose
  slots are also the nodes of the LRU's doubly linked list: rows KEY (the user; EMPTY, or TOMB
  for a deleted one), TOK (cached tokens), PREV and NEXT (slots; -1: none). meta[HEAD] is the
  least recently used slot, meta[TAIL] the most recently used.
- `log[4, L]`: what happened that the Python side replays onto the parts that are not arrays
  (the host tier, `events`), in order, as rows (kind, user, a, b): EVICT (user, tokens it had,
  tokens left) — the user's tokens go to the host tier, `(user, left)` to `events`; SPILL (user,
  tokens, 0) — to the host tier; EVENT (user, tokens now cached, 0). meta[LOGGING] is a mask of
  LOG_EVENTS and LOG_SPILLS saying which of those to record (0: nothing).
- The ghost queue, `(gmeta, gtab)`: a second table of the same layout, the users most recently
  evicted with the tokens they had, least recently evicted first, at most gmeta[CAP_BYTES] bytes of
  them (Cliffhanger's shadow queue); gmeta[CAP_BYTES] < 0: no ghost queue (`ghost_arrays`). An
  eviction puts its user in it, an insert takes its user out, as the functions below go.

Before an insert of a user that may be new, or a resize, `kv_room` must hold (else `kv_reserve`);
one insert or resize logs at most COUNT + 4 rows and puts at most COUNT users in the ghost queue.
"""
from __future__ import annotations

import numpy as np
from numba import njit

# meta: least/most recently used slot, entries, bytes used, capacity, bytes per token, tokens per
# page, tail-first flag, tokens evicted so far, tombstones, log rows used, what to log
HEAD, TAIL, COUNT, USED, CAP_BYTES, BPT, TPP, TAIL_FIRST, EVICTED, TOMBS, LOG_N, LOGGING = range(12)
KV_META = 12
KEY, TOK, PREV, NEXT = 0, 1, 2, 3           # rows of tab
EMPTY, TOMB = -1, -2                        # tab[KEY] of a free slot
EVICT, SPILL, EVENT = 1, 2, 3               # log kinds
LOG_EVENTS, LOG_SPILLS = 1, 2               # bits of meta[LOGGING]
MIN_SLOTS = 16
_MIX = -7046029254386353131                 # 0x9E3779B97F4A7C15 (Fibonacci hashing), as int64


def kv_arrays(bytes_per_token: int, tokens_per_page: int, capacity_bytes: int = 0, tail_first: bool = False,
              slots: int = MIN_SLOTS):
    """A new, empty cache's (meta, tab, log)."""
    if slots < MIN_SLOTS or slots & (slots - 1):
        raise ValueError(f"slots must be a power of two >= {MIN_SLOTS}, got {slots}")
    meta = np.zeros(KV_META, np.int64)
    meta[HEAD] = meta[TAIL] = -1
    meta[CAP_BYTES], meta[BPT], meta[TPP] = capacity_bytes, bytes_per_token, tokens_per_page
    meta[TAIL_FIRST] = tail_first
    tab = np.full((4, slots), -1, np.int64)
    tab[TOK] = 0
    return meta, tab, np.zeros((4, slots // 2 + 4), np.int64)


def ghost_arrays(bytes_per_token: int, capacity_bytes: int = -1):
    """A ghost queue's (gmeta, gtab), empty, of `capacity_bytes` (< 0: none)."""
    meta, tab, _ = kv_arrays(bytes_per_token, 1, capacity_bytes)
    return meta, tab


@njit(cache=True, nogil=True, inline="always")
def _home(tab, user):
    h = user * _MIX
    return (h ^ (h >> 32)) & (tab.shape[1] - 1)


@njit(cache=True, nogil=True)
def kv_find(meta, tab, user):
    """The slot holding `user`, or -1."""
    mask = tab.shape[1] - 1
    s = _home(tab, user)
    while True:
        k = tab[KEY, s]
        if k == user:
            return s
        if k == EMPTY:
            return -1
        s = (s + 1) & mask


@njit(cache=True, nogil=True, inline="always")
def _unlink(meta, tab, s):
    p, n = tab[PREV, s], tab[NEXT, s]
    if p >= 0:
        tab[NEXT, p] = n
    else:
        meta[HEAD] = n
    if n >= 0:
        tab[PREV, n] = p
    else:
        meta[TAIL] = p


@njit(cache=True, nogil=True, inline="always")
def _link_tail(meta, tab, s):
    t = meta[TAIL]
    tab[PREV, s], tab[NEXT, s] = t, -1
    if t >= 0:
        tab[NEXT, t] = s
    else:
        meta[HEAD] = s
    meta[TAIL] = s


@njit(cache=True, nogil=True)
def _claim(meta, tab, user):
    """A slot for a user not in the table (the first tombstone on its probe path, else the empty
    slot that ends it), keyed to `user`."""
    mask = tab.shape[1] - 1
    s = _home(tab, user)
    while tab[KEY, s] >= 0:
        s = (s + 1) & mask
    if tab[KEY, s] == TOMB:
        meta[TOMBS] -= 1
    tab[KEY, s] = user
    meta[COUNT] += 1
    return s


@njit(cache=True, nogil=True)
def _delete(meta, tab, s):
    """Free an unlinked slot: a tombstone, unless the next slot is empty (then it and the
    tombstones just before it are empty again: no probe path runs through them)."""
    mask = tab.shape[1] - 1
    meta[COUNT] -= 1
    tab[TOK, s] = 0
    if tab[KEY, (s + 1) & mask] != EMPTY:
        tab[KEY, s] = TOMB
        meta[TOMBS] += 1
        return
    tab[KEY, s] = EMPTY
    s = (s - 1) & mask
    while tab[KEY, s] == TOMB:
        tab[KEY, s] = EMPTY
        meta[TOMBS] -= 1
        s = (s - 1) & mask


@njit(cache=True, nogil=True, inline="always")
def _log(meta, log, kind, user, a, b):
    n = meta[LOG_N]
    if n < log.shape[1]:
        log[0, n], log[1, n], log[2, n], log[3, n] = kind, user, a, b
    meta[LOG_N] = n + 1                     # past the end: the drain refuses it


@njit(cache=True, nogil=True)
def kv_lookup(meta, tab, user):
    """Cached prefix tokens of `user` (0 on a miss); a hit becomes most recently used."""
    s = kv_find(meta, tab, user)
    if s < 0:
        return 0
    if s != meta[TAIL]:
        _unlink(meta, tab, s)
        _link_tail(meta, tab, s)
    return tab[TOK, s]


@njit(cache=True, nogil=True)
def kv_peek(meta, tab, user):
    """Cached prefix tokens of `user`, without touching the LRU order."""
    s = kv_find(meta, tab, user)
    return tab[TOK, s] if s >= 0 else 0


@njit(cache=True, nogil=True)
def _ghost_take(gm, gt, s):
    """Slot s out of the ghost queue."""
    gm[USED] -= gt[TOK, s] * gm[BPT]
    _unlink(gm, gt, s)
    _delete(gm, gt, s)


@njit(cache=True, nogil=True)
def ghost_drop(gm, gt, user):
    """`user` out of the ghost queue (if it is there)."""
    if gm[CAP_BYTES] >= 0:
        s = kv_find(gm, gt, user)
        if s >= 0:
            _ghost_take(gm, gt, s)


@njit(cache=True, nogil=True)
def ghost_put(gm, gt, user, tokens):
    """`user` with `tokens` into the ghost queue as its most recent entry (replacing any it had),
    then its least recent entries out while it holds more than its capacity (the new one too, if
    it alone is larger). Needs room for one more key (`kv_room`)."""
    s = kv_find(gm, gt, user)
    if s >= 0:
        _ghost_take(gm, gt, s)
    s = _claim(gm, gt, user)
    gt[TOK, s] = tokens
    _link_tail(gm, gt, s)
    gm[USED] += tokens * gm[BPT]
    while gm[USED] > gm[CAP_BYTES] and gm[HEAD] >= 0:
        _ghost_take(gm, gt, gm[HEAD])


@njit(cache=True, nogil=True)
def _evict(meta, tab, log, need_bytes, gm, gt):
    """Free at least `need_bytes`, least recently used first (whole pages off its tail with
    tail-first); each user evicted from goes into the ghost queue with the tokens it had."""
    bpt, tpp = meta[BPT], meta[TPP]
    while need_bytes > 0 and meta[HEAD] >= 0:
        s = meta[HEAD]
        user, tokens = tab[KEY, s], tab[TOK, s]
        drop = tokens
        if meta[TAIL_FIRST]:
            drop = min(tokens, (need_bytes + tpp * bpt - 1) // (tpp * bpt) * tpp)
        if drop == tokens:
            _unlink(meta, tab, s)
            _delete(meta, tab, s)
        else:
            tab[TOK, s] = tokens - drop
        if meta[LOGGING]:
            _log(meta, log, EVICT, user, tokens, tokens - drop)
        if gm[CAP_BYTES] >= 0:
            ghost_put(gm, gt, user, tokens)
        meta[USED] -= drop * bpt
        need_bytes -= drop * bpt
        meta[EVICTED] += drop


@njit(cache=True, nogil=True)
def _uncache(meta, tab, log, s, user, old):
    """The end of an insert that caches nothing: the user's old slot (if any) freed."""
    if s >= 0:
        _delete(meta, tab, s)
    if meta[LOGGING] & LOG_EVENTS and old:
        _log(meta, log, EVENT, user, 0, 0)
    return 0


@njit(cache=True, nogil=True)
def kv_insert(meta, tab, log, user, tokens, gm, gt):
    """Cache `tokens` prefix positions of `user` as most recently used, evicting others to fit
    (into the ghost queue `gm`, `gt`, which `user` leaves). Returns the tokens actually cached
    (fewer if the prefix alone does not fit). A new user needs `kv_room`."""
    bpt = meta[BPT]
    s = kv_find(meta, tab, user)
    old = 0
    if s >= 0:
        old = tab[TOK, s]
        _unlink(meta, tab, s)
        meta[USED] -= old * bpt
    ghost_drop(gm, gt, user)
    fit = meta[CAP_BYTES] // bpt
    if tokens > fit:
        if not meta[TAIL_FIRST]:
            if meta[LOGGING] & LOG_SPILLS:
                if old > 0:
                    _log(meta, log, SPILL, user, old, 0)
                if tokens > 0:
                    _log(meta, log, SPILL, user, tokens, 0)
            return _uncache(meta, tab, log, s, user, old)
        tokens = fit
    if tokens <= 0:
        return _uncache(meta, tab, log, s, user, old)
    _evict(meta, tab, log, meta[USED] + tokens * bpt - meta[CAP_BYTES], gm, gt)
    if s < 0:
        s = _claim(meta, tab, user)
    tab[TOK, s] = tokens
    _link_tail(meta, tab, s)
    meta[USED] += tokens * bpt
    if meta[LOGGING] & LOG_EVENTS:
        _log(meta, log, EVENT, user, tokens, 0)
    return tokens


@njit(cache=True, nogil=True)
def kv_resize(meta, tab, log, capacity_bytes, gm, gt):
    """A new capacity, the least recently used evicted to fit it (into the ghost queue). Needs
    `kv_room`."""
    meta[CAP_BYTES] = capacity_bytes
    _evict(meta, tab, log, meta[USED] - capacity_bytes, gm, gt)


@njit(cache=True, nogil=True, inline="always")
def _ghost_room(meta, gm, gt):
    """Room in the ghost queue for every user of the cache (the most one insert or resize puts
    there: each put adds at most one key or tombstone), at most half full after them."""
    return gm[CAP_BYTES] < 0 or 2 * (gm[COUNT] + gm[TOMBS] + meta[COUNT] + 1) <= gt.shape[1]


@njit(cache=True, nogil=True)
def kv_room(meta, tab, log, gm, gt):
    """Room in `tab` for one more user (load, tombstones included, at most 1/2 after it), in
    `log` for one more insert or resize, and in the ghost queue for what it evicts."""
    return (2 * (meta[COUNT] + meta[TOMBS] + 1) <= tab.shape[1]
            and log.shape[1] - meta[LOG_N] >= meta[COUNT] + 4 and _ghost_room(meta, gm, gt))


@njit(cache=True, nogil=True)
def kv_reserve(meta, tab, log, gm, gt):
    """(tab, log, gt) such that `kv_room` holds: `tab` and `gt` rehashed (tombstones dropped,
    doubled until at most a quarter full) and `log` grown (its rows kept) where needed; the
    arrays given, if they already have room. The LRU orders are kept."""
    if not kv_room(meta, tab, log, gm, gt):
        slots = tab.shape[1]
        if 2 * (meta[COUNT] + meta[TOMBS] + 1) > slots:
            while 4 * (meta[COUNT] + 1) > slots:
                slots *= 2
            tab = _rehash(meta, tab, slots)
        want = max(slots // 2 + 4, meta[LOG_N] + meta[COUNT] + 4)
        if log.shape[1] < want:
            grown = np.zeros((4, want), np.int64)
            grown[:, :log.shape[1]] = log
            log = grown
        if not _ghost_room(meta, gm, gt):
            g = gt.shape[1]
            while 4 * (gm[COUNT] + meta[COUNT] + 1) > g:
                g *= 2
            gt = _rehash(gm, gt, g)
    return tab, log, gt


@njit(cache=True, nogil=True)
def _rehash(meta, tab, slots):
    new = np.full((4, slots), -1, np.int64)
    new[TOK] = 0
    s = meta[HEAD]
    meta[HEAD] = meta[TAIL] = -1
    meta[COUNT] = meta[TOMBS] = 0
    while s >= 0:
        t = _claim(meta, new, tab[KEY, s])
        new[TOK, t] = tab[TOK, s]
        _link_tail(meta, new, t)
        s = tab[NEXT, s]
    return new


@njit(cache=True, nogil=True)
def kv_order(meta, tab):
    """The linked slots, least recently used first (stops after COUNT + 1, so a cycle shows)."""
    out = np.empty(meta[COUNT] + 1, np.int64)
    n, s = 0, meta[HEAD]
    while s >= 0 and n < out.shape[0]:
        out[n] = s
        n += 1
        s = tab[NEXT, s]
    return out[:n]


@njit(cache=True, nogil=True)
def _findable(meta, tab):
    """Every keyed slot is where a probe for its user ends."""
    for s in range(tab.shape[1]):
        if tab[KEY, s] >= 0 and kv_find(meta, tab, tab[KEY, s]) != s:
            return False
    return True
