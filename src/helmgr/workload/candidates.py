"""Candidate sets: the items a request scores (their rows are looked up, never KV-cached).

Drawing 512 Zipf samples per request would dominate generation, so candidates are cut from
pools of pre-drawn ids: each request copies a window of the pool at a random offset (a row of a
sliding-window view, so a chunk's candidates are one gather of contiguous rows).
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from helmgr.workload.popularity import ItemSpace, zipf_ranks


def windows(pool: np.ndarray, width: int) -> np.ndarray:
    """Every window of `width` consecutive pool entries, as rows of a view (no copy)."""
    return sliding_window_view(pool, width) if width > 0 else np.zeros((len(pool), 0), pool.dtype)


class _Windowed:
    """Pickles its pools, not their window views: a view pickles as every window copied (2 M
    windows of 512 ids: 8.6 GB, what sending a cluster to a Ray worker cost), and is rebuilt from
    its pool on the other side. `_views` maps each view attribute to (pool attribute, width)."""

    _views: dict[str, tuple[str, str]] = {}

    def __getstate__(self) -> dict:
        return {k: v for k, v in vars(self).items() if k not in self._views}

    def __setstate__(self, state: dict) -> None:
        vars(self).update(state)
        for view, (pool, width) in self._views.items():
            setattr(self, view, windows(state[pool], getattr(self, width)))


class SyntheticCandidates(_Windowed):
    """`count` candidates per request: a share `head_share` from the global head, the rest from
    the user's cluster tail (retrieval mixes popular and personalized items)."""

    _views = {"head": ("head_pool", "n_head"), "tail": ("tail_pool", "n_tail")}

    def __init__(self, rng: np.random.Generator, space: ItemSpace, count: int, head_share: float,
                 head_exponent: float, tail_exponent: float, pool_size: int = 1 << 21):
        self.space, self.count = space, count
        self.n_head = int(round(head_share * count))
        self.n_tail = count - self.n_head
        self.head_pool = space.head_ids(zipf_ranks(rng, space.n_items, head_exponent, pool_size))
        self.tail_pool = (-zipf_ranks(rng, space.segment, tail_exponent, pool_size)) % space.segment
        self.head, self.tail = windows(self.head_pool, self.n_head), windows(self.tail_pool, self.n_tail)

    def draw(self, rng: np.random.Generator, clusters: np.ndarray) -> np.ndarray:
        """An (n, count) int64 array of candidates for requests of users in `clusters`."""
        n = len(clusters)
        out = np.empty((n, self.count), np.int64)
        out[:, :self.n_head] = self.head[rng.integers(0, len(self.head), n)]
        out[:, self.n_head:] = self.tail[rng.integers(0, len(self.tail), n)]
        out[:, self.n_head:] += (clusters * self.space.segment)[:, None]
        return out


class PoolCandidates(_Windowed):
    """`count` candidates per request drawn from an empirical item distribution (trace replay).
    A request of cluster c gets its candidates offset by c x `segment` (a widened catalogue's
    clone ranges; clusters are all 0 otherwise)."""

    _views = {"pool": ("ids", "count")}

    def __init__(self, rng: np.random.Generator, item_counts: np.ndarray, count: int, pool_size: int = 1 << 21,
                 segment: int = 0):
        p = item_counts / item_counts.sum()
        self.count, self.segment = count, segment
        self.ids = rng.choice(len(p), size=pool_size, p=p)
        self.pool = windows(self.ids, count)

    def draw(self, rng: np.random.Generator, clusters: np.ndarray) -> np.ndarray:
        out = self.pool[rng.integers(0, len(self.pool), len(clusters))]     # a gather: a copy
        if self.segment:
            out += (clusters * self.segment)[:, None]
        return out
