"""The KV cache's LRU as arrays and the compiled functions that work on them (memory/kv.py
is their Python face).

The LRU lives in three int64 arrays that compiled code (the simulator's engine) works on directly
through the `kv_*` functions; `KVCache` is the Python face of the same arrays.

- `meta` and `tab`: the scalars, the hash table and the LRU lists, one per group
  (memory/kv_slots.py). A cache of several groups (class-aware eviction, docs/tenancy.md)
  evicts its last group first, each group down to its floor (`_evict`).
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

from helmgr.memory.kv_slots import (BPT, CAP_BYTES, COUNT, EVENT, EVICT, EVICTED, GROUP, GROUP_META, HEAD, KEY,
                                    KV_META, LOG_EVENTS, LOG_N, LOG_SPILLS, LOGGING, MIN_SLOTS, QUOTAS, SPILL, TAIL,
                                    TAIL_FIRST, TOK, TOMBS, TPP, USED, _charge, _claim, _delete, _ends, _group_used,
                                    _groups, _link_tail, _reset_lists, _share, _unlink, kv_find, kv_order)


def kv_arrays(bytes_per_token: int, tokens_per_page: int, capacity_bytes: int = 0, tail_first: bool = False,
              slots: int = MIN_SLOTS, groups: int = 1):
    """A new, empty cache's (meta, tab, log), of `groups` LRU lists."""
    if slots < MIN_SLOTS or slots & (slots - 1):
        raise ValueError(f"slots must be a power of two >= {MIN_SLOTS}, got {slots}")
    if groups < 1:
        raise ValueError(f"a KV cache needs at least one group, got {groups}")
    meta = np.zeros(KV_META + GROUP_META * (groups - 1), np.int64)
    _reset_lists(meta)
    meta[CAP_BYTES], meta[BPT], meta[TPP] = capacity_bytes, bytes_per_token, tokens_per_page
    meta[TAIL_FIRST] = tail_first
    tab = np.full((5, slots), -1, np.int64)
    tab[TOK] = tab[GROUP] = 0
    return meta, tab, np.zeros((4, slots // 2 + 4), np.int64)


def ghost_arrays(bytes_per_token: int, capacity_bytes: int = -1):
    """A ghost queue's (gmeta, gtab), empty, of `capacity_bytes` (< 0: none)."""
    meta, tab, _ = kv_arrays(bytes_per_token, 1, capacity_bytes)
    return meta, tab


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
    """Free at least `need_bytes`. One group: least recently used first. More: the last group
    first, each group while it holds more than its floor, least recently used first within it;
    then, only if that is not enough, the same order without the floors. (With quotas each group
    is kept within its own, so this has nothing left to do but for rounding.)"""
    groups = _groups(meta)
    for floors in range(1, -1, -1):
        for g in range(groups - 1, -1, -1):
            keep = _share(meta, g) if g and floors else -1
            need_bytes = _evict_group(meta, tab, log, g, need_bytes, keep, gm, gt)
            if need_bytes <= 0:
                return


@njit(cache=True, nogil=True)
def _evict_group(meta, tab, log, g, need_bytes, keep, gm, gt):
    """Free up to `need_bytes` from group g while it holds more than `keep` bytes (< 0: to the
    last), least recently used first (whole pages off its tail with tail-first); each user
    evicted from goes into the ghost queue with the tokens it had. Returns what is still needed."""
    bpt, tpp = meta[BPT], meta[TPP]
    head = _ends(g)[0]
    while need_bytes > 0 and meta[head] >= 0 and (keep < 0 or _group_used(meta, g) > keep):
        s = meta[head]
        user, tokens = tab[KEY, s], tab[TOK, s]
        drop = tokens
        if meta[TAIL_FIRST]:
            drop = min(tokens, (need_bytes + tpp * bpt - 1) // (tpp * bpt) * tpp)
        _charge(meta, tab, s, -drop * bpt)
        if drop == tokens:
            _unlink(meta, tab, s)
            _delete(meta, tab, s)
        else:
            tab[TOK, s] = tokens - drop
        if meta[LOGGING]:
            _log(meta, log, EVICT, user, tokens, tokens - drop)
        if gm[CAP_BYTES] >= 0:
            ghost_put(gm, gt, user, tokens)
        need_bytes -= drop * bpt
        meta[EVICTED] += drop
    return need_bytes


@njit(cache=True, nogil=True)
def _uncache(meta, tab, log, s, user, old):
    """The end of an insert that caches nothing: the user's old slot (if any) freed."""
    if s >= 0:
        _delete(meta, tab, s)
    if meta[LOGGING] & LOG_EVENTS and old:
        _log(meta, log, EVENT, user, 0, 0)
    return 0


@njit(cache=True, nogil=True)
def kv_insert(meta, tab, log, user, tokens, gm, gt, group=0):
    """Cache `tokens` prefix positions of `user` as most recently used in `group`, evicting
    others to fit (into the ghost queue `gm`, `gt`, which `user` leaves). Returns the tokens
    actually cached (fewer if the prefix alone does not fit). A new user needs `kv_room`."""
    bpt = meta[BPT]
    s = kv_find(meta, tab, user)
    old = 0
    if s >= 0:
        old = tab[TOK, s]
        _unlink(meta, tab, s)
        _charge(meta, tab, s, -old * bpt)
    ghost_drop(gm, gt, user)
    fit = (_share(meta, group) if meta[QUOTAS] else meta[CAP_BYTES]) // bpt
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
    if meta[QUOTAS]:                        # its own group makes room, down to its quota
        _evict_group(meta, tab, log, group, _group_used(meta, group) + tokens * bpt - _share(meta, group), -1, gm, gt)
    _evict(meta, tab, log, meta[USED] + tokens * bpt - meta[CAP_BYTES], gm, gt)
    if s < 0:
        s = _claim(meta, tab, user)
    tab[TOK, s], tab[GROUP, s] = tokens, group
    _link_tail(meta, tab, s)
    _charge(meta, tab, s, tokens * bpt)
    if meta[LOGGING] & LOG_EVENTS:
        _log(meta, log, EVENT, user, tokens, 0)
    return tokens


@njit(cache=True, nogil=True)
def kv_resize(meta, tab, log, capacity_bytes, gm, gt):
    """A new capacity, the least recently used evicted to fit it (into the ghost queue). Needs
    `kv_room`."""
    meta[CAP_BYTES] = capacity_bytes
    if meta[QUOTAS]:                        # each group down to its new quota
        for g in range(_groups(meta)):
            _evict_group(meta, tab, log, g, _group_used(meta, g) - _share(meta, g), -1, gm, gt)
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
    new = np.full((5, slots), -1, np.int64)
    new[TOK] = new[GROUP] = 0
    order = kv_order(meta, tab)
    _reset_lists(meta)
    meta[COUNT] = meta[TOMBS] = 0
    for s in order:
        t = _claim(meta, new, tab[KEY, s])
        new[TOK, t], new[GROUP, t] = tab[TOK, s], tab[GROUP, s]
        _link_tail(meta, new, t)
    return new
