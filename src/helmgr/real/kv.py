"""The paged KV cache (the simulator's KV cache on real tensors): users' prefix K/V in the pool's
KV pages.

Layout: a prefix is packed token-major, one record of `bytes_per_token` per token holding
layer 0's K then V, layer 1's K then V, and so on. A page holds `tokens_per_page` whole records,
so the first n pages of a user hold its first tokens: trimming pages off the tail leaves a
usable shorter prefix. Users are kept in LRU order; free pages are handed out lowest index first
(farthest from the EMB boundary, so EMB growth takes as few users' pages as it can).

Class-aware eviction (`set_groups`, a serving replica with a class table; docs/tenancy.md): each
user's prefix belongs to a group (its class's band, `set_group` before the request), and room is
made from the highest-numbered group first, each only while it holds more than its floor (a
share of the KV pages at that moment), least recently used first within a group; only if that is
not enough do the floors give way, in the same order -- the simulated cache's rule
(memory/kv_table.py `_evict`). Finding a group's least recent user scans the LRU order: a
replica's cache holds hundreds of users, not the simulator's millions.

The ghost queue (`track_ghosts`, adapter v2's KV side, as the simulated cache's): the users most
recently evicted, with the tokens they had, up to a byte budget; caching a user takes it out.
"""
from __future__ import annotations

import heapq
from collections import OrderedDict
from dataclasses import dataclass
from typing import NamedTuple, Sequence

import torch

from helmgr.memory.pool import SizeInfo
from helmgr.core.profiles import ModelProfile
from helmgr.real.pool import DevicePool


class PrefixKV(NamedTuple):
    """Per-layer K (tokens, heads, d_qk) and V (tokens, heads, d_v) of one user's prefix."""

    k: tuple[torch.Tensor, ...]
    v: tuple[torch.Tensor, ...]

    @property
    def tokens(self) -> int:
        return self.k[0].shape[0]


@dataclass(frozen=True, slots=True)
class KVLayout:
    """Shapes and dtype of the K/V the model produces; knows how to turn them into bytes."""

    layers: int
    heads: int
    d_qk: int
    d_v: int
    dtype: torch.dtype = torch.float32

    @classmethod
    def from_profile(cls, profile: ModelProfile, dtype: torch.dtype = torch.float32) -> "KVLayout":
        return cls(profile.layers, profile.heads, profile.d_qk, profile.d_v, dtype)

    @property
    def bytes_per_token(self) -> int:
        """layers x heads x (d_qk + d_v) x element size (the profile's kv_bytes_per_token)."""
        return self.layers * self.heads * (self.d_qk + self.d_v) * self.dtype.itemsize

    def empty(self, device: str | torch.device = "cpu") -> PrefixKV:
        def zero(d: int) -> tuple[torch.Tensor, ...]:
            return tuple(torch.empty(0, self.heads, d, dtype=self.dtype, device=device) for _ in range(self.layers))
        return PrefixKV(zero(self.d_qk), zero(self.d_v))

    def pack(self, k: Sequence[torch.Tensor], v: Sequence[torch.Tensor]) -> torch.Tensor:
        """(tokens, bytes_per_token) uint8, one record per token."""
        if len(k) != self.layers or len(v) != self.layers:
            raise ValueError(f"expected K and V for {self.layers} layers, got {len(k)} and {len(v)}")
        tokens = k[0].shape[0]
        parts = []
        for kl, vl in zip(k, v):
            for t, d, name in ((kl, self.d_qk, "K"), (vl, self.d_v, "V")):
                if tuple(t.shape) != (tokens, self.heads, d) or t.dtype != self.dtype:
                    raise ValueError(f"{name} must be {self.dtype} of shape ({tokens}, {self.heads}, {d}), "
                                     f"got {t.dtype} of shape {tuple(t.shape)}")
                parts.append(t.reshape(tokens, -1))
        return torch.cat(parts, dim=1).view(torch.uint8)

    def unpack(self, data: torch.Tensor) -> PrefixKV:
        """Inverse of `pack`: views into `data` (tokens, bytes_per_token) uint8."""
        tokens = data.shape[0]
        per_layer = data.view(self.dtype).view(tokens, self.layers, self.heads * (self.d_qk + self.d_v))
        k, v = per_layer.split([self.heads * self.d_qk, self.heads * self.d_v], dim=2)
        return PrefixKV(tuple(k[:, i].reshape(tokens, self.heads, self.d_qk) for i in range(self.layers)),
                        tuple(v[:, i].reshape(tokens, self.heads, self.d_v) for i in range(self.layers)))


class Entry(NamedTuple):
    tokens: int
    pages: tuple[int, ...]     # KV page indices, in token order


class PagedKVCache:
    """User -> prefix K/V in whole pages of `pool`'s KV region, least recently used first."""

    def __init__(self, pool: DevicePool, layout: KVLayout, tail_first: bool = False):
        self.tokens_per_page = pool.page_bytes // layout.bytes_per_token
        if self.tokens_per_page == 0:
            raise ValueError(f"a page of {pool.page_bytes} bytes cannot hold one token "
                             f"of {layout.bytes_per_token} bytes")
        self.pool, self.layout, self.tail_first = pool, layout, tail_first
        self.entries: OrderedDict[int, Entry] = OrderedDict()
        self._free = list(range(pool.kv_pages))         # a heap: lowest index first
        self._owner: dict[int, int] = {}               # page -> user
        self.evicted_tokens = 0
        self.ghost: OrderedDict[int, int] | None = None   # user -> tokens it had, least recently evicted first
        self._ghost_cap = self._ghost_used = 0
        self.events: list[tuple[int, int]] | None = None   # (user, tokens now cached; 0 = gone), when on
        self.floors: list[float] | None = None         # per group, the share of the pages it keeps (set_groups)
        self._group: dict[int, int] = {}               # user -> its group (absent: 0)
        self._group_pages: list[int] = [0]             # pages each group holds

    def set_groups(self, floors: Sequence[float]) -> None:
        """Evict by group (module doc): `floors[g]`, the share of the KV pages group g keeps from
        the groups below it (lower numbers); the floors sum below 1. Set on an empty cache."""
        if self.entries or not floors or sum(floors) >= 1 or min(floors) < 0:
            raise ValueError(f"set_groups needs an empty cache and floors >= 0 summing below 1, got {list(floors)}")
        self.floors, self._group_pages = [float(f) for f in floors], [0] * len(floors)

    def set_group(self, user: int, group: int) -> None:
        """`user`'s prefix belongs to `group` from now on (its pages move with it if cached)."""
        if self.floors is None or not 0 <= group < len(self.floors):
            raise ValueError(f"group {group} of a cache with {0 if self.floors is None else len(self.floors)} groups")
        entry, old = self.entries.get(user), self._group.get(user, 0)
        if entry is not None:
            self._group_pages[old] -= len(entry.pages)
            self._group_pages[group] += len(entry.pages)
        self._group[user] = group

    def group_pages(self, group: int) -> int:
        return self._group_pages[group]

    @property
    def _record_bytes(self) -> int:
        return self.tokens_per_page * self.layout.bytes_per_token

    def track_ghosts(self, capacity_bytes: int) -> None:
        """Keep the users evicted last, up to `capacity_bytes` of the tokens they had (a cache
        that much larger would have kept them); 0 or less: none."""
        self._ghost_cap, self._ghost_used = max(0, int(capacity_bytes)), 0
        self.ghost = OrderedDict() if self._ghost_cap else None

    def ghost_tokens(self, user: int) -> int:
        """The tokens `user` had when it was evicted, if it is in the ghost queue (else 0)."""
        return self.ghost.get(user, 0) if self.ghost is not None else 0

    def _ghost_put(self, user: int, tokens: int) -> None:
        """`user` in as the most recent entry, then the least recent out while the queue holds
        more than its capacity (the new one too, if it alone is larger: the simulated queue's rule)."""
        self._ghost_take(user)
        self.ghost[user] = tokens
        self._ghost_used += tokens * self.layout.bytes_per_token
        while self._ghost_used > self._ghost_cap and self.ghost:
            self._ghost_used -= self.ghost.popitem(last=False)[1] * self.layout.bytes_per_token

    def _ghost_take(self, user: int) -> None:
        if self.ghost is not None and user in self.ghost:
            self._ghost_used -= self.ghost.pop(user) * self.layout.bytes_per_token

    def peek(self, user: int) -> int:
        """Cached tokens of `user` (0 if none), without touching the LRU order."""
        entry = self.entries.get(user)
        return entry.tokens if entry else 0

    def get(self, user: int) -> PrefixKV | None:
        """The cached prefix of `user` (a copy out of the pool), now most recently used."""
        entry = self.entries.get(user)
        if entry is None:
            return None
        self.entries.move_to_end(user)
        rows = self.pool.kv_physical(torch.tensor(entry.pages, device=self.pool.device))
        data = self.pool.pages_view()[rows, : self._record_bytes]
        return self.layout.unpack(data.view(-1, self.layout.bytes_per_token)[: entry.tokens])

    def put(self, user: int, k: Sequence[torch.Tensor], v: Sequence[torch.Tensor]) -> int:
        """Cache `user`'s prefix as most recently used, evicting others to fit. Returns the tokens
        cached: all of them, a leading part (tail_first, prefix bigger than the cache), or 0."""
        data = self.layout.pack(k, v).to(self.pool.device)
        had = user in self.entries
        self._ghost_take(user)
        self._trim(user, 0, evicted=False)
        tokens, fit = data.shape[0], self.pool.kv_pages * self.tokens_per_page
        tokens = 0 if tokens > fit and not self.tail_first else min(tokens, fit)
        if tokens == 0:
            if had and self.events is not None:
                self.events.append((user, 0))
            return 0
        need = -(-tokens // self.tokens_per_page)
        self._evict(need - len(self._free))
        pages = tuple(heapq.heappop(self._free) for _ in range(need))
        self._write(pages, data[:tokens])
        self.entries[user] = Entry(tokens, pages)
        self._group_pages[self._group.get(user, 0)] += need
        self._owner.update((p, user) for p in pages)
        if self.events is not None:
            self.events.append((user, tokens))
        return tokens

    def drop(self, user: int) -> None:
        """Forget `user`'s cached prefix (its pages freed); the residency report hears of it."""
        had = user in self.entries
        self._trim(user, 0, evicted=False)
        if had and self.events is not None:
            self.events.append((user, 0))

    def _write(self, pages: tuple[int, ...], data: torch.Tensor) -> None:
        pad = len(pages) * self.tokens_per_page - data.shape[0]
        if pad:
            data = torch.cat([data, data.new_zeros(pad, data.shape[1])])
        rows = self.pool.kv_physical(torch.tensor(pages, device=self.pool.device))
        self.pool.pages_view()[rows, : self._record_bytes] = data.view(len(pages), self._record_bytes)

    def _evict(self, need_pages: int) -> None:
        """Free at least `need_pages` pages: whole LRU users, or their tail pages (tail_first);
        with groups, by group first (module doc)."""
        if self.floors is None:
            while need_pages > 0 and self.entries:
                need_pages -= self._evict_one(next(iter(self.entries)), need_pages)
            return
        for keep_floors in (True, False):
            for g in reversed(range(len(self.floors))):
                floor = self.floors[g] * self.pool.kv_pages if keep_floors else 0.0
                while need_pages > 0 and self._group_pages[g] > floor:
                    user = next((u for u in self.entries if self._group.get(u, 0) == g), None)
                    if user is None:
                        break
                    need_pages -= self._evict_one(user, need_pages)

    def _evict_one(self, user: int, need_pages: int) -> int:
        """Evict `user` (or its tail pages, tail_first); the pages freed."""
        pages = len(self.entries[user].pages)
        drop = min(pages, need_pages) if self.tail_first else pages
        self._trim(user, pages - drop)
        return drop

    def _trim(self, user: int, keep_pages: int, evicted: bool = True) -> None:
        """Keep the first `keep_pages` pages of `user` (0: drop the user); keeps its LRU place."""
        entry = self.entries.get(user)
        if entry is None:
            return
        for p in entry.pages[keep_pages:]:
            del self._owner[p]
            heapq.heappush(self._free, p)
        self._group_pages[self._group.get(user, 0)] -= len(entry.pages) - keep_pages
        tokens = min(entry.tokens, keep_pages * self.tokens_per_page)
        if evicted:
            self.evicted_tokens += entry.tokens - tokens
            if self.ghost is not None:
                self._ghost_put(user, entry.tokens)
            if self.events is not None:
                self.events.append((user, tokens))
        if tokens:
            self.entries[user] = Entry(tokens, entry.pages[:keep_pages])
        else:
            del self.entries[user]
            if evicted:                       # gone: its group is set again before its next request
                self._group.pop(user, None)

    def on_resize(self, covered: range) -> None:
        """Follow a pool resize. Pages the EMB took: their owners are evicted (tail_first: cut
        back to the pages before the first lost one). Pages the KV gained: free."""
        n = self.pool.kv_pages
        if covered and covered.start >= n:
            for p in covered:
                user = self._owner.get(p)
                if user is not None:
                    pages = self.entries[user].pages
                    self._trim(user, pages.index(p) if self.tail_first else 0)
            self._free = [p for p in self._free if p < n]
            heapq.heapify(self._free)
        else:
            for p in covered:
                heapq.heappush(self._free, p)

    def size_info(self) -> SizeInfo:
        used = sum(e.tokens for e in self.entries.values()) * self.layout.bytes_per_token
        return SizeInfo(self.pool.kv_pages * self.pool.page_bytes, used, len(self.entries))

    def check_integrity(self) -> None:
        """No page owned twice or outside the KV region; free + owned = the KV pages."""
        owned = [p for e in self.entries.values() for p in e.pages]
        assert len(owned) == len(set(owned)), "a page is owned twice"
        assert len(self._free) == len(set(self._free)), "a page is free twice"
        assert set(owned).isdisjoint(self._free), "a page is both free and owned"
        assert set(owned) | set(self._free) == set(range(self.pool.kv_pages)), "free + owned != KV pages"
        held = [0] * len(self._group_pages)
        for user, e in self.entries.items():
            held[self._group.get(user, 0)] += len(e.pages)
        assert held == self._group_pages, f"pages per group {self._group_pages}, counted {held}"
        assert self._owner == {p: u for u, e in self.entries.items() for p in e.pages}
        for user, e in self.entries.items():
            assert len(e.pages) == -(-e.tokens // self.tokens_per_page) and e.tokens > 0, (user, e)
