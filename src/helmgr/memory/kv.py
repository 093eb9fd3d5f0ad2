"""The KV cache: users' prefix K/V, LRU over users, sized in bytes.

An entry is a user and the number of leading history positions whose K/V is cached. With
`tail_first`, eviction trims whole pages off the tail of the least recently used user, so a
partly evicted user keeps a usable shorter prefix. With a host tier, evicted K/V is kept in host
memory (its own LRU) and can be onloaded over PCIe instead of recomputed.

The LRU lives in three int64 arrays worked on by compiled functions (`memory/kv_table.py`, which
the simulator's compiled path calls directly), the ghost queue in two more; `KVCache` is the
Python face of the same arrays.
"""
from __future__ import annotations

from collections import OrderedDict

import numpy as np

from helmgr.memory.kv_slots import (CAP_BYTES, COUNT, EVENT, EVICT, EVICTED, GROUP, KEY, LOG_EVENTS, LOG_N, LOG_SPILLS,
                                    LOGGING, PREV, QUOTAS, SPILL, TAIL_FIRST, TOK, TOMB, TOMBS, USED, _ends, _findable,
                                    _group_used, _groups, _share, kv_order, kv_set_floor)
from helmgr.memory.kv_table import (ghost_arrays, kv_arrays, kv_insert, kv_lookup, kv_peek, kv_reserve, kv_resize,
                                    kv_room)
from helmgr.memory.pool import SizeInfo


class HostKVTier:
    """Evicted prefixes kept in host DRAM: user -> tokens, a plain LRU over users with a byte
    budget."""

    def __init__(self, bytes_per_token: int, capacity_bytes: int):
        self.bytes_per_token = bytes_per_token
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self.entries: OrderedDict[int, int] = OrderedDict()

    def size_info(self) -> SizeInfo:
        return SizeInfo(self.capacity_bytes, self.used_bytes, len(self.entries))

    def check_integrity(self) -> None:
        total = sum(self.entries.values()) * self.bytes_per_token
        assert total == self.used_bytes, (total, self.used_bytes)
        assert self.used_bytes <= self.capacity_bytes, (self.used_bytes, self.capacity_bytes)
        assert all(t > 0 for t in self.entries.values())


    def put(self, user: int, tokens: int) -> None:
        old = self.entries.pop(user, 0)
        self.used_bytes -= old * self.bytes_per_token
        tokens = max(tokens, old)
        if tokens * self.bytes_per_token > self.capacity_bytes:
            return
        self.entries[user] = tokens
        self.used_bytes += tokens * self.bytes_per_token
        while self.used_bytes > self.capacity_bytes:
            _, t = self.entries.popitem(last=False)
            self.used_bytes -= t * self.bytes_per_token

    def lookup(self, user: int) -> int:
        return self.entries.get(user, 0)


class KVCache:
    """The cache over `meta`, `tab` and `log` (see the module's docstring) and its ghost queue over
    `gmeta` and `gtab`, with the host tier and the `events` log kept in Python and updated from
    `log` after each call.

    Compiled code may work on the same arrays between calls; it then hands them back with
    `attach`, which replays what it logged."""

    def __init__(self, bytes_per_token: int, page_bytes: int, capacity_bytes: int = 0,
                 tail_first: bool = False, host_capacity_bytes: int = 0):
        if bytes_per_token <= 0 or page_bytes < bytes_per_token:
            raise ValueError(f"KV cache needs 0 < bytes_per_token <= page_bytes, got {bytes_per_token}, {page_bytes}")
        self.bytes_per_token = bytes_per_token
        self.tokens_per_page = page_bytes // bytes_per_token
        self.meta, self.tab, self.log = kv_arrays(bytes_per_token, self.tokens_per_page, capacity_bytes, tail_first)
        self._views()
        self.host = HostKVTier(bytes_per_token, host_capacity_bytes) if host_capacity_bytes > 0 else None
        self.gmeta, self.gtab = ghost_arrays(bytes_per_token)   # recently evicted users (off: capacity -1)
        self._events: list[tuple[int, int]] | None = None
        self._set_logging(LOG_SPILLS, self.host is not None)
        self._inserts_left = self._room()

    def set_groups(self, floors: list[float], quotas: bool = False) -> None:
        """Make the (empty) cache class-aware: one LRU list per group, `len(floors)` groups,
        group g >= 1 keeping `floors[g]` of the capacity before a lower group yields (memory/
        kv_table.py `_evict`: the last group is evicted first; `floors[0]` is not used). With
        `quotas`, each group is held to its own part instead (static partitions: an insert evicts
        only from its own group); group 0's is what the others leave."""
        if self.meta[COUNT]:
            raise ValueError("set_groups needs an empty KV cache")
        if any(not 0 <= f < 1 for f in floors) or sum(floors[1:]) >= 1:
            raise ValueError(f"KV group floors must be in [0, 1) and sum below 1, got {floors}")
        meta = self.meta
        self.meta, self.tab, self.log = kv_arrays(self.bytes_per_token, self.tokens_per_page, int(meta[CAP_BYTES]),
                                                  bool(meta[TAIL_FIRST]), groups=len(floors))
        self.meta[LOGGING], self.meta[QUOTAS] = meta[LOGGING], quotas
        for g, f in enumerate(floors[1:], 1):
            kv_set_floor(self.meta, g, round(f * 1_000_000))
        self._views()
        self._inserts_left = self._room()

    @property
    def groups(self) -> int:
        return _groups(self.meta)

    def group_bytes(self, g: int) -> int:
        """Bytes cached in group g."""
        return int(_group_used(self.meta, g))

    def _views(self) -> None:
        self._meta_view = memoryview(self.meta)          # reads and writes a scalar 2x faster than numpy
        self._log_rows = self.log.T                       # the log's rows (kind, user, a, b)

    def __getstate__(self) -> dict:                      # views neither pickle nor copy as views
        return {k: v for k, v in self.__dict__.items() if k not in ("_meta_view", "_log_rows")}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._views()

    # -- the scalars, from meta -------------------------------------------------------------
    @property
    def capacity_bytes(self) -> int:
        return int(self.meta[CAP_BYTES])

    @property
    def used_bytes(self) -> int:
        return int(self.meta[USED])

    @property
    def evicted_tokens(self) -> int:
        return int(self.meta[EVICTED])

    @property
    def tail_first(self) -> bool:
        return bool(self.meta[TAIL_FIRST])

    @property
    def entries(self) -> OrderedDict[int, int]:
        """user -> cached tokens, least recently used first (a copy)."""
        order = kv_order(self.meta, self.tab)
        return OrderedDict(zip(self.tab[KEY, order].tolist(), self.tab[TOK, order].tolist()))

    @property
    def events(self) -> list[tuple[int, int]] | None:
        """(user, tokens now cached) per change, when on (a list); None: off."""
        return self._events

    @events.setter
    def events(self, events: list[tuple[int, int]] | None) -> None:
        self._events = events
        self._set_logging(LOG_EVENTS, events is not None)

    def _set_logging(self, bit: int, on: bool) -> None:
        self.meta[LOGGING] = self.meta[LOGGING] | bit if on else self.meta[LOGGING] & ~bit
        self._logging = bool(self.meta[LOGGING])

    def size_info(self) -> SizeInfo:
        return SizeInfo(self.capacity_bytes, self.used_bytes, int(self.meta[COUNT]))

    # -- the cache --------------------------------------------------------------------------
    def track_ghosts(self, capacity_bytes: int) -> None:
        """Remember the last `capacity_bytes` of evicted prefixes (keys and lengths only), so a
        policy can count the hits a cache that much larger would have had (Cliffhanger's shadow
        queues). Starts empty."""
        self.gmeta, self.gtab = ghost_arrays(self.bytes_per_token, max(0, capacity_bytes))
        self._inserts_left = 0

    @property
    def ghosts(self) -> bool:
        """Whether the ghost queue is tracked (`track_ghosts`)."""
        return bool(self.gmeta[CAP_BYTES] >= 0)

    @property
    def ghost(self) -> OrderedDict[int, int] | None:
        """The ghost queue, user -> tokens it had, least recently evicted first (a copy); None
        when not tracked."""
        if not self.ghosts:
            return None
        order = kv_order(self.gmeta, self.gtab)
        return OrderedDict(zip(self.gtab[KEY, order].tolist(), self.gtab[TOK, order].tolist()))

    @property
    def _ghost_used(self) -> int:
        return int(self.gmeta[USED])

    def ghost_tokens(self, user: int) -> int:
        """The tokens `user` had when it was evicted, if it is in the ghost queue (else 0)."""
        return kv_peek(self.gmeta, self.gtab, user)

    def lookup(self, user: int) -> int:
        """Cached prefix tokens of `user` (0 on a miss); a hit becomes most recently used."""
        return kv_lookup(self.meta, self.tab, user)

    def peek(self, user: int) -> int:
        """Cached prefix tokens of `user`, without touching the LRU order."""
        return kv_peek(self.meta, self.tab, user)

    def insert(self, user: int, tokens: int, group: int = 0) -> int:
        """Cache `tokens` prefix positions of `user` as most recently used (in `group`), evicting
        others to fit. Returns the tokens actually cached (fewer if the prefix alone does not fit)."""
        if self._inserts_left <= 0:
            self.attach(*kv_reserve(self.meta, self.tab, self.log, self.gmeta, self.gtab))
        self._inserts_left -= 1
        cached = kv_insert(self.meta, self.tab, self.log, user, tokens, self.gmeta, self.gtab, group)
        if self._logging:
            n = self._meta_view[LOG_N]
            if n == 1 and cached and self._events is not None:   # the one row is this insert's event
                self._meta_view[LOG_N] = 0
                self._events.append((user, cached))
            elif n:
                self._drain()
        return cached

    def resize(self, capacity_bytes: int) -> None:
        if not kv_room(self.meta, self.tab, self.log, self.gmeta, self.gtab):
            self.attach(*kv_reserve(self.meta, self.tab, self.log, self.gmeta, self.gtab))
        kv_resize(self.meta, self.tab, self.log, capacity_bytes, self.gmeta, self.gtab)
        if self._logging and self._meta_view[LOG_N]:
            self._drain()

    def host_lookup(self, user: int) -> int:
        return self.host.lookup(user) if self.host is not None else 0

    # -- the arrays -------------------------------------------------------------------------
    def attach(self, tab: np.ndarray, log: np.ndarray, gtab: np.ndarray) -> None:
        """Take back `tab`, `log` and `gtab` (as `kv_reserve` may have replaced them) after
        compiled code worked on the metas and them, and replay what it logged."""
        self.tab, self.log, self.gtab = tab, log, gtab
        self._views()
        self._logging = bool(self.meta[LOGGING])
        if self.meta[LOG_N]:
            self._drain()
        self._inserts_left = self._room()

    def _room(self) -> int:
        """Inserts that `kv_room` holds for from now on (each adds at most one key, and the log
        is drained after each); with a ghost queue, one (each may put every user there)."""
        meta = self.meta
        if self.ghosts:
            return int(kv_room(meta, self.tab, self.log, self.gmeta, self.gtab))
        table = self.tab.shape[1] // 2 - int(meta[COUNT] + meta[TOMBS])
        return min(table, self.log.shape[1] - int(meta[COUNT]) - 3)

    def _drain(self) -> None:
        """Replay the log onto the host tier and `events`; empty it."""
        n = self._meta_view[LOG_N]
        if n > self.log.shape[1]:
            raise RuntimeError(f"the KV log overflowed: {n} rows logged, {self.log.shape[1]} kept")
        self._meta_view[LOG_N] = 0
        events, host = self._events, self.host
        for kind, user, a, b in self._log_rows[:n].tolist():
            if kind == EVENT:
                events.append((user, a))
            elif kind == EVICT:
                if events is not None:
                    events.append((user, b))
                if host is not None:
                    host.put(user, a)
            elif kind == SPILL:
                host.put(user, a)

    def check_integrity(self) -> None:
        meta, tab = self.meta, self.tab
        order = kv_order(meta, tab)
        keyed = np.flatnonzero(tab[KEY] >= 0)
        assert len(order) == len(keyed) == meta[COUNT], (len(order), len(keyed), meta[COUNT])
        assert np.array_equal(np.sort(order), keyed), "the LRU list and the keyed slots differ"
        groups = tab[GROUP, order]
        assert np.all(np.diff(groups) >= 0) and (len(order) == 0 or groups[-1] < self.groups)
        for g in range(self.groups):
            part = order[groups == g]
            if len(part):
                assert meta[_ends(g)[1]] == part[-1] and tab[PREV, part[0]] == -1
                assert np.array_equal(tab[PREV, part[1:]], part[:-1]), "PREV and NEXT disagree"
            assert int(tab[TOK, part].sum()) * self.bytes_per_token == self.group_bytes(g)
            if meta[QUOTAS]:
                assert self.group_bytes(g) <= _share(meta, g), (g, self.group_bytes(g), _share(meta, g))
        assert np.count_nonzero(tab[KEY] == TOMB) == meta[TOMBS]
        assert 2 * (meta[COUNT] + meta[TOMBS]) <= tab.shape[1] and _findable(meta, tab)
        tokens = tab[TOK, order]
        total = int(tokens.sum()) * self.bytes_per_token
        assert total == self.used_bytes, (total, self.used_bytes)
        assert self.used_bytes <= self.capacity_bytes, (self.used_bytes, self.capacity_bytes)
        assert np.all(tokens > 0)
        if self.host is not None:
            self.host.check_integrity()
        if self.ghosts:
            gm, gt = self.gmeta, self.gtab
            order = kv_order(gm, gt)
            assert len(order) == np.count_nonzero(gt[KEY] >= 0) == gm[COUNT] and _findable(gm, gt)
            assert int(gt[TOK, order].sum()) * self.bytes_per_token == gm[USED] <= max(0, gm[CAP_BYTES])
