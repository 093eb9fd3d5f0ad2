"""Users' histories: the item id at every position of every user's action sequence.

A history is fixed: position p of user u is the same item whenever it is asked for, so the new
tokens of one request are exactly the prefix positions looked up when a later request misses
the KV cache. `ids(user, start, stop)` serves one request (a view when it can be); `batch`
serves a whole chunk in one vectorized pass.
"""
from __future__ import annotations

import numpy as np

from helmgr.workload.chunk import ragged_positions
from helmgr.workload.popularity import ItemSpace, zipf_ranks
from helmgr.workload.users import SyntheticUsers, hash_uniform, hash_uniform_one


class SyntheticHistory:
    """Histories drawn once into shared pools: user u reads the pools from its own hashed offset,
    so a user's sequence costs nothing to store and is a Zipf sample like everyone's. Each
    position is a global-head item (share `head_share`) or an item of the user's cluster tail."""

    def __init__(self, rng: np.random.Generator, space: ItemSpace, users: SyntheticUsers, head_share: float,
                 head_exponent: float, tail_exponent: float, pool_size: int = 1 << 21):
        self.space, self.users = space, users
        self.pool_size = pool_size
        self.span = pool_size - 4 * users.len_cap    # offsets leave room for histories to grow
        if self.span <= 0:
            raise ValueError(f"history pool of {pool_size} is too small for length cap {users.len_cap}")
        head = space.head_ids(zipf_ranks(rng, space.n_items, head_exponent, pool_size))
        tail_local = (-zipf_ranks(rng, space.segment, tail_exponent, pool_size)) % space.segment
        self.is_head = rng.random(pool_size) < head_share
        # head id where the position is a head item, else the cluster-local id (cluster added later)
        self.mixed = np.where(self.is_head, head, tail_local)
        self._salt = users.seed * 7 + 5
        self._cache: dict[int, tuple[int, int]] = {}

    def _user(self, user: int) -> tuple[int, int]:
        """(pool offset, cluster segment base) of one user, memoized."""
        got = self._cache.get(user)
        if got is None:
            offset = int(hash_uniform_one(user, self._salt) * self.span)
            cluster = int(hash_uniform_one(user, self.users.seed * 7 + 1) * self.users.n_clusters)
            got = (offset, cluster * self.space.segment)
            if len(self._cache) > 1 << 20:
                self._cache.clear()
            self._cache[user] = got
        return got

    def __call__(self, user: int, start: int, stop: int) -> np.ndarray:
        offset, base = self._user(user)
        a, b = offset + start, offset + stop
        if b > self.pool_size:
            return self._lookup(np.arange(a, b), base)
        return self.mixed[a:b] + np.where(self.is_head[a:b], 0, base)

    def _lookup(self, idx: np.ndarray, base: np.ndarray | int) -> np.ndarray:
        idx = idx % self.pool_size
        return self.mixed[idx] + np.where(self.is_head[idx], 0, base)

    def batch(self, users: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
        rows, pos = ragged_positions(starts, counts)
        offsets = (hash_uniform(users, self._salt) * self.span).astype(np.int64)
        bases = self.users.cluster(users) * self.space.segment
        return self._lookup(offsets[rows] + pos, bases[rows])


class TraceHistory:
    """Histories read from a log: each user's interactions in time order. Users beyond the log
    (clones, injected burst users) replay a log user's sequence, chosen by `base_of`."""

    def __init__(self, seq_items: np.ndarray, seq_offsets: np.ndarray):
        self.items = seq_items.astype(np.int64)
        self.offsets = seq_offsets.astype(np.int64)
        self.n_base = len(seq_offsets) - 1
        self.lengths = np.diff(self.offsets)

    def base_of(self, users: np.ndarray) -> np.ndarray:
        return np.asarray(users, np.int64) % self.n_base

    def _lookup(self, base: np.ndarray | int, pos: np.ndarray) -> np.ndarray:
        length = self.lengths[base]
        return self.items[self.offsets[base] + pos % length]

    def __call__(self, user: int, start: int, stop: int) -> np.ndarray:
        base = user % self.n_base
        if stop <= self.lengths[base]:
            o = self.offsets[base]
            return self.items[o + start:o + stop]
        return self._lookup(base, np.arange(start, stop))

    def batch(self, users: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
        rows, pos = ragged_positions(starts, counts)
        return self._lookup(self.base_of(users)[rows], pos)
