"""The KV cache's slots: the arrays' layout, their hash table and their LRU lists
(memory/kv_table.py builds the cache on them; memory/kv.py is its Python face).

- `meta[KV_META + GROUP_META * (G - 1)]`: the scalars, named by the indices below, then
  GROUP_META fields per group g >= 1 (`_at(g, field)`): its list's ends, its bytes and its
  floor (parts per million of the capacity) — with meta[QUOTAS] set, its quota instead (group 0's
  is the rest of the capacity).
- `tab[5, slots]`: an open-addressing hash table (linear probing, `slots` a power of two) whose
  slots are also the nodes of the doubly linked LRU lists, one per group: rows KEY (the user;
  EMPTY, or TOMB for a deleted one), TOK (cached tokens), PREV and NEXT (slots; -1: none), GROUP
  (its list). meta[HEAD] is group 0's least recently used slot, meta[TAIL] its most recently
  used. A cache of one group is one plain LRU list.
"""
from __future__ import annotations

import numpy as np
from numba import njit

# meta: least/most recently used slot, entries, bytes used, capacity, bytes per token, tokens per
# page, tail-first flag, tokens evicted so far, tombstones, log rows used, what to log
HEAD, TAIL, COUNT, USED, CAP_BYTES, BPT, TPP, TAIL_FIRST, EVICTED, TOMBS, LOG_N, LOGGING, QUOTAS = range(13)
KV_META = 13
G_HEAD, G_TAIL, G_USED, G_FLOOR = range(4)  # a group's fields in meta (`_at`)
GROUP_META = 4
KEY, TOK, PREV, NEXT, GROUP = 0, 1, 2, 3, 4  # rows of tab
EMPTY, TOMB = -1, -2                        # tab[KEY] of a free slot
EVICT, SPILL, EVENT = 1, 2, 3               # log kinds
LOG_EVENTS, LOG_SPILLS = 1, 2               # bits of meta[LOGGING]
MIN_SLOTS = 16
_MIX = -7046029254386353131                 # 0x9E3779B97F4A7C15 (Fibonacci hashing), as int64


@njit(cache=True, nogil=True, inline="always")
def _groups(meta):
    return (meta.shape[0] - KV_META) // GROUP_META + 1


@njit(cache=True, nogil=True, inline="always")
def _at(g, field):
    """meta's index of group g's (>= 1) `field`."""
    return KV_META + GROUP_META * (g - 1) + field


@njit(cache=True, nogil=True, inline="always")
def _ends(g):
    """meta's indices of group g's least and most recently used slots."""
    if g == 0:
        return HEAD, TAIL
    return _at(g, G_HEAD), _at(g, G_TAIL)


@njit(cache=True, nogil=True)
def _reset_lists(meta):
    for g in range(_groups(meta)):
        h, t = _ends(g)
        meta[h] = meta[t] = -1


@njit(cache=True, nogil=True, inline="always")
def _charge(meta, tab, s, nbytes):
    """Slot s's group (and the cache) holds `nbytes` more."""
    meta[USED] += nbytes
    g = tab[GROUP, s]
    if g:
        meta[_at(g, G_USED)] += nbytes


@njit(cache=True, nogil=True)
def _group_used(meta, g):
    """Bytes cached in group g."""
    if g:
        return meta[_at(g, G_USED)]
    used = meta[USED]
    for h in range(1, _groups(meta)):
        used -= meta[_at(h, G_USED)]
    return used


@njit(cache=True, nogil=True)
def _share(meta, g):
    """Group g's floor (or quota) in bytes of the current capacity; group 0's quota is the rest."""
    cap = meta[CAP_BYTES]
    if g:
        return cap * meta[_at(g, G_FLOOR)] // 1_000_000
    rest = cap
    for h in range(1, _groups(meta)):
        rest -= cap * meta[_at(h, G_FLOOR)] // 1_000_000
    return rest


@njit(cache=True, nogil=True)
def kv_set_floor(meta, g, ppm):
    """Group g (>= 1) keeps `ppm` parts per million of the capacity before a lower group yields
    (`_evict`)."""
    meta[_at(g, G_FLOOR)] = ppm


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
    head, tail = _ends(tab[GROUP, s])
    p, n = tab[PREV, s], tab[NEXT, s]
    if p >= 0:
        tab[NEXT, p] = n
    else:
        meta[head] = n
    if n >= 0:
        tab[PREV, n] = p
    else:
        meta[tail] = p


@njit(cache=True, nogil=True, inline="always")
def _link_tail(meta, tab, s):
    head, tail = _ends(tab[GROUP, s])
    t = meta[tail]
    tab[PREV, s], tab[NEXT, s] = t, -1
    if t >= 0:
        tab[NEXT, t] = s
    else:
        meta[head] = s
    meta[tail] = s


@njit(cache=True, nogil=True)
def _claim(meta, tab, user):
    """A slot for a user not in the table (the first tombstone on its probe path, else the empty
    slot that ends it), keyed to `user`, in group 0."""
    mask = tab.shape[1] - 1
    s = _home(tab, user)
    while tab[KEY, s] >= 0:
        s = (s + 1) & mask
    if tab[KEY, s] == TOMB:
        meta[TOMBS] -= 1
    tab[KEY, s] = user
    tab[GROUP, s] = 0
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


@njit(cache=True, nogil=True)
def kv_order(meta, tab):
    """The linked slots, group by group, least recently used first in each (stops after COUNT +
    1, so a cycle shows)."""
    out = np.empty(meta[COUNT] + 1, np.int64)
    n = 0
    for g in range(_groups(meta)):
        s = meta[_ends(g)[0]]
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
