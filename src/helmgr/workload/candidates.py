"""Candidate sets: the items a request scores (their rows are looked up, never KV-cached).

Drawing 512 Zipf samples per request would dominate generation, so candidates are cut from
pools of pre-drawn ids: each request copies a run of consecutive pool entries from a random
offset. A chunk's candidates are written in one compiled pass (`cut_runs`), the interest
cluster's offset added as they are copied, so the chunk's array is written once and read by
nothing else on the way.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from helmgr.workload.popularity import ItemSpace, zipf_ranks


@njit(cache=True, nogil=True)
def cut_runs(out, lo, hi, pool, starts, add):
    """out[i, lo:hi] = pool[starts[i]:starts[i] + hi - lo] + add[i] for every row i (`add` empty:
    nothing added)."""
    for i in range(out.shape[0]):
        a = starts[i] - lo
        d = add[i] if len(add) else 0
        for j in range(lo, hi):
            out[i, j] = pool[a + j] + d


def run_starts(rng: np.random.Generator, pool: np.ndarray, width: int, n: int) -> np.ndarray:
    """Where each of n runs of `width` consecutive entries of `pool` starts (uniform; any row of
    the pool's windows of that width, or of its len(pool) empty ones)."""
    return rng.integers(0, len(pool) - width + 1 if width > 0 else len(pool), n)


NO_ADD = np.zeros(0, np.int64)


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
        head = run_starts(rng, self.head_pool, self.n_head, n)
        tail = run_starts(rng, self.tail_pool, self.n_tail, n)
        cut_runs(out, 0, self.n_head, self.head_pool, head, NO_ADD)
        cut_runs(out, self.n_head, self.count, self.tail_pool, tail,
                  np.asarray(clusters, np.int64) * self.space.segment)
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
        n = len(clusters)
        out = np.empty((n, self.count), np.int64)
        starts = run_starts(rng, self.ids, self.count, n)
        cut_runs(out, 0, self.count, self.ids, starts,
                  np.asarray(clusters, np.int64) * self.segment if self.segment else NO_ADD)
        return out
