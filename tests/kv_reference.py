"""The KV cache: users' prefix K/V, LRU over users, sized in bytes.

An entry is a user and the number of leading history positions whose K/V is cached. With
`tail_first`, eviction trims whole pages off the tail of the least recently used user, so a
partly evicted user keeps a usable shorter prefix. With a host tier, evicted K/V is kept in host
memory (its own LRU) and can be onloaded over PCIe instead of recomputed.
"""
from __future__ import annotations

from collections import OrderedDict

from helmgr.memory.pool import SizeInfo


class _LRUTokens:
    """user -> cached tokens, least recently used first, with a byte budget."""

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


class HostKVTier(_LRUTokens):
    """Evicted prefixes kept in host DRAM (a plain LRU over users)."""

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


class KVCache(_LRUTokens):
    def __init__(self, bytes_per_token: int, page_bytes: int, capacity_bytes: int = 0,
                 tail_first: bool = False, host_capacity_bytes: int = 0):
        if bytes_per_token <= 0 or page_bytes < bytes_per_token:
            raise ValueError(f"KV cache needs 0 < bytes_per_token <= page_bytes, got {bytes_per_token}, {page_bytes}")
        super().__init__(bytes_per_token, capacity_bytes)
        self.tokens_per_page = page_bytes // bytes_per_token
        self.tail_first = tail_first
        self.host = HostKVTier(bytes_per_token, host_capacity_bytes) if host_capacity_bytes > 0 else None
        self.evicted_tokens = 0
        self.ghost: OrderedDict[int, int] | None = None   # recently evicted users (a shadow queue)
        self.ghost_bytes = 0
        self._ghost_used = 0
        self.events: list[tuple[int, int]] | None = None   # (user, tokens now cached), when on

    def track_ghosts(self, capacity_bytes: int) -> None:
        """Remember the last `capacity_bytes` of evicted prefixes (keys and lengths only), so a
        policy can count the hits a cache that much larger would have had (Cliffhanger's shadow
        queues)."""
        self.ghost, self.ghost_bytes, self._ghost_used = OrderedDict(), capacity_bytes, 0

    def _ghost_put(self, user: int, tokens: int) -> None:
        g = self.ghost
        self._ghost_used -= g.pop(user, 0) * self.bytes_per_token
        g[user] = tokens
        self._ghost_used += tokens * self.bytes_per_token
        while self._ghost_used > self.ghost_bytes and g:
            self._ghost_used -= g.popitem(last=False)[1] * self.bytes_per_token

    def lookup(self, user: int) -> int:
        """Cached prefix tokens of `user` (0 on a miss); a hit becomes most recently used."""
        tokens = self.entries.get(user)
        if tokens is None:
            return 0
        self.entries.move_to_end(user)
        return tokens

    def peek(self, user: int) -> int:
        """Cached prefix tokens of `user`, without touching the LRU order."""
        return self.entries.get(user, 0)

    def insert(self, user: int, tokens: int) -> int:
        """Cache `tokens` prefix positions of `user` as most recently used, evicting others to
        fit. Returns the tokens actually cached (fewer if the prefix alone does not fit)."""
        bpt = self.bytes_per_token
        old = self.entries.pop(user, 0)
        self.used_bytes -= old * bpt
        if self.ghost is not None and user in self.ghost:
            self._ghost_used -= self.ghost.pop(user) * bpt
        fit = self.capacity_bytes // bpt
        if tokens > fit:
            if not self.tail_first:
                self._spill(user, old)
                self._spill(user, tokens)
                if self.events is not None and old:
                    self.events.append((user, 0))
                return 0
            tokens = fit
        if tokens <= 0:
            if self.events is not None and old:
                self.events.append((user, 0))
            return 0
        self._evict(self.used_bytes + tokens * bpt - self.capacity_bytes)
        self.entries[user] = tokens
        self.used_bytes += tokens * bpt
        if self.events is not None:
            self.events.append((user, tokens))
        return tokens

    def resize(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._evict(self.used_bytes - capacity_bytes)

    def _evict(self, need_bytes: int) -> None:
        """Free at least `need_bytes`, least recently used first."""
        bpt = self.bytes_per_token
        while need_bytes > 0 and self.entries:
            user, tokens = next(iter(self.entries.items()))
            drop = tokens
            if self.tail_first:
                pages = -(-need_bytes // (self.tokens_per_page * bpt))
                drop = min(tokens, pages * self.tokens_per_page)
            if drop == tokens:
                del self.entries[user]
            else:
                self.entries[user] = tokens - drop
            if self.events is not None:
                self.events.append((user, tokens - drop))
            self.used_bytes -= drop * bpt
            need_bytes -= drop * bpt
            self.evicted_tokens += drop
            self._spill(user, tokens)
            if self.ghost is not None:
                self._ghost_put(user, tokens)

    def _spill(self, user: int, tokens: int) -> None:
        if self.host is not None and tokens > 0:
            self.host.put(user, tokens)

    def host_lookup(self, user: int) -> int:
        return self.host.lookup(user) if self.host is not None else 0

    def check_integrity(self) -> None:
        super().check_integrity()
        if self.host is not None:
            self.host.check_integrity()
