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
from helmgr.core.hashing import hash_uniform, hash_uniform_one
from helmgr.workload.users import SyntheticUsers


class SyntheticHistory:
    """Each interest cluster has a pool of `per_cluster` history positions drawn once from its
    mixture (a global-head item with probability `head_share`, else an item of the cluster's
    tail). A user reads its cluster's pool from its own hashed offset, so a history costs no
    storage and asking for one is a slice (a view), never a computation."""

    def __init__(self, rng: np.random.Generator, space: ItemSpace, users: SyntheticUsers, head_share: float,
                 head_exponent: float, tail_exponent: float, per_cluster: int = 1 << 16):
        self.space, self.users = space, users
        self.per_cluster = per_cluster
        self.span = per_cluster - 4 * users.len_cap    # offsets leave room for histories to grow
        if self.span <= 0:
            raise ValueError(f"history pool of {per_cluster} is too small for length cap {users.len_cap}")
        size = space.n_clusters * per_cluster
        head = space.head_ids(zipf_ranks(rng, space.n_items, head_exponent, size))
        tail_local = (-zipf_ranks(rng, space.segment, tail_exponent, size)) % space.segment
        cluster = np.repeat(np.arange(space.n_clusters), per_cluster)
        self.pool = np.where(rng.random(size) < head_share, head, cluster * space.segment + tail_local)
        self._salt = users.seed * 7 + 5
        self._cache: dict[int, int] = {}

    def _base(self, user: int) -> int:
        """Where user's history starts in the flat pool, memoized."""
        got = self._cache.get(user)
        if got is None:
            cluster = int(hash_uniform_one(user, self.users.seed * 7 + 1) * self.users.n_clusters)
            got = cluster * self.per_cluster + int(hash_uniform_one(user, self._salt) * self.span)
            if len(self._cache) > 1 << 20:
                self._cache.clear()
            self._cache[user] = got
        return got

    def __call__(self, user: int, start: int, stop: int) -> np.ndarray:
        base = self._base(user)
        offset = base % self.per_cluster
        if offset + stop <= self.per_cluster:
            return self.pool[base + start:base + stop]
        return self.pool[base - offset + (offset + np.arange(start, stop)) % self.per_cluster]

    def locate(self, users: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Where each user's history lies, for compiled code: position p of user k is
        `pool[start[k] + (offset[k] + p) % period[k]] + shift[k]` (`compiled_pool` is the pool)."""
        users = np.asarray(users, np.int64)
        offsets = (hash_uniform(users, self._salt) * self.span).astype(np.int64)
        n = len(users)
        return (self.users.cluster(users) * self.per_cluster, offsets, np.full(n, self.per_cluster, np.int64),
                np.zeros(n, np.int64))

    @property
    def compiled_pool(self) -> np.ndarray:
        return self.pool

    def batch(self, users: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
        rows, pos = ragged_positions(starts, counts)
        offsets = (hash_uniform(users, self._salt) * self.span).astype(np.int64)
        cluster_base = self.users.cluster(users) * self.per_cluster
        return self.pool[cluster_base[rows] + (offsets[rows] + pos) % self.per_cluster]


class TraceHistory:
    """Histories read from a log: each user's interactions in time order. Users beyond the log
    (clones, injected burst users) replay a log user's sequence, chosen by `base_of`.

    A widened catalogue (`clones` > 1) gives every clone its own item range: clone k (`clone_of`)
    reads item i of its log user as i + k x `n_items`."""

    def __init__(self, seq_items: np.ndarray, seq_offsets: np.ndarray, clones: int = 1, n_items: int = 0):
        self.items = seq_items.astype(np.int64)
        self.offsets = seq_offsets.astype(np.int64)
        self.n_base = len(seq_offsets) - 1
        self.lengths = np.diff(self.offsets)
        self.clones, self.n_items = clones, n_items

    def base_of(self, users: np.ndarray) -> np.ndarray:
        return np.asarray(users, np.int64) % self.n_base

    def clone_of(self, users: np.ndarray) -> np.ndarray:
        """Which item range a user reads: its clone index (0 for every user unless widened)."""
        return (np.asarray(users, np.int64) // self.n_base) % self.clones

    def _lookup(self, base: np.ndarray | int, pos: np.ndarray) -> np.ndarray:
        length = self.lengths[base]
        return self.items[self.offsets[base] + pos % length]

    def __call__(self, user: int, start: int, stop: int) -> np.ndarray:
        base = user % self.n_base
        if stop <= self.lengths[base]:
            o = self.offsets[base]
            out = self.items[o + start:o + stop]
        else:
            out = self._lookup(base, np.arange(start, stop))
        if self.clones > 1:
            out = out + (user // self.n_base) % self.clones * self.n_items
        return out

    def locate(self, users: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """`SyntheticHistory.locate`: a log user's sequence, read cyclically, in its clone's range."""
        base = self.base_of(users)
        shift = self.clone_of(users) * self.n_items if self.clones > 1 else np.zeros(len(base), np.int64)
        return self.offsets[base], np.zeros(len(base), np.int64), np.maximum(self.lengths[base], 1), shift

    @property
    def compiled_pool(self) -> np.ndarray:
        return self.items

    def batch(self, users: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
        rows, pos = ragged_positions(starts, counts)
        out = self._lookup(self.base_of(users)[rows], pos)
        if self.clones > 1:
            out += (self.clone_of(users) * self.n_items)[rows]
        return out
