"""Candidate sets: the items a request scores (their rows are looked up, never KV-cached).

Drawing 512 Zipf samples per request would dominate generation, so candidates are cut from
pools of pre-drawn ids: each request copies a run of consecutive pool entries from a random
offset (`cut_runs`: a row of a sliding-window view of the pool, so a chunk's candidates are
gathered as contiguous rows, a block of requests at a time). Only the pools are kept: a view kept
as an attribute would pickle as every window copied (what shipping a workload to a Ray worker does).

numpy only: the real path's bench imports this module on a device that has no numba.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from helmgr.workload.popularity import ItemSpace, zipf_ranks


_BLOCK = 512        # requests cut at a time: each block's gathered runs are copied out while in cache


def cut_runs(rng: np.random.Generator, pool: np.ndarray, width: int, n: int, out: np.ndarray | None = None,
             add: np.ndarray | None = None) -> np.ndarray:
    """An (n, width) array of runs of `width` consecutive `pool` entries, each from an offset drawn
    uniformly over the pool's windows of that width (or its len(pool) empty ones), plus `add` (one
    value per run) if given; written into `out` (an (n, width) array: a column slice of a wider
    one will do) if given, a block of runs at a time."""
    view = sliding_window_view(pool, width) if width > 0 else np.zeros((len(pool), 0), pool.dtype)
    at = rng.integers(0, len(view), n)
    if out is None:
        out = np.empty((n, width), pool.dtype)
    for a in range(0, n, _BLOCK):
        b = min(a + _BLOCK, n)
        if add is None:
            out[a:b] = view[at[a:b]]
        else:
            np.add(view[at[a:b]], add[a:b, None], out=out[a:b])
    return out


class SyntheticCandidates:
    """`count` candidates per request: a share `head_share` from the global head, the rest from
    the user's cluster tail (retrieval mixes popular and personalized items)."""

    def __init__(self, rng: np.random.Generator, space: ItemSpace, count: int, head_share: float,
                 head_exponent: float, tail_exponent: float, pool_size: int = 1 << 21):
        self.space, self.count = space, count
        self.n_head = int(round(head_share * count))
        self.n_tail = count - self.n_head
        self.head_pool = space.head_ids(zipf_ranks(rng, space.n_items, head_exponent, pool_size))
        self.tail_pool = (-zipf_ranks(rng, space.segment, tail_exponent, pool_size)) % space.segment

    def draw(self, rng: np.random.Generator, clusters: np.ndarray) -> np.ndarray:
        """An (n, count) int64 array of candidates for requests of users in `clusters`."""
        n = len(clusters)
        out = np.empty((n, self.count), np.int64)
        cut_runs(rng, self.head_pool, self.n_head, n, out[:, :self.n_head])
        cut_runs(rng, self.tail_pool, self.n_tail, n, out[:, self.n_head:], clusters * self.space.segment)
        return out


class PoolCandidates:
    """`count` candidates per request drawn from an empirical item distribution (trace replay).
    A request of cluster c gets its candidates offset by c x `segment` (a widened catalogue's
    clone ranges; clusters are all 0 otherwise)."""

    def __init__(self, rng: np.random.Generator, item_counts: np.ndarray, count: int, pool_size: int = 1 << 21,
                 segment: int = 0):
        p = item_counts / item_counts.sum()
        self.count, self.segment = count, segment
        self.ids = rng.choice(len(p), size=pool_size, p=p)

    def draw(self, rng: np.random.Generator, clusters: np.ndarray) -> np.ndarray:
        return cut_runs(rng, self.ids, self.count, len(clusters), add=clusters * self.segment if self.segment else None)
