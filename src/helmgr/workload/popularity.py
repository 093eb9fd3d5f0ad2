"""Item popularity: Zipf draws and the synthetic workload's item space.

The catalog of `n_items` is cut into `n_clusters` equal segments, one per interest cluster. A
token is either drawn from the global head (a Zipf over all items) or from its user's cluster
tail (a Zipf over the cluster's segment). Rank r maps to an item id by counting down from the
segment's current *shift*: rank 0 is the newest item of the segment, and as the shift moves
(popularity drift) new items take the top ranks and older ones fade down the order.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def zipf_ranks(rng: np.random.Generator, n: int, exponent: float, size: int) -> np.ndarray:
    """Ranks in [0, n) with P(rank = k) ~ (k + 1) ** -exponent, by inverting the continuous
    power law on [1, n + 1): exact in the tail, within a few % at the very top ranks."""
    u = rng.random(size)
    if abs(exponent - 1.0) < 1e-9:
        x = np.power(n + 1.0, u)
    else:
        e = 1.0 - exponent
        x = np.power(1.0 + u * ((n + 1.0) ** e - 1.0), 1.0 / e)
    return np.minimum(x.astype(np.int64) - 1, n - 1)


def zipf_pmf(n: int, exponent: float) -> np.ndarray:
    """The probabilities that `zipf_ranks` draws each rank (the continuous law's mass per bin)."""
    edges = np.arange(1, n + 2, dtype=np.float64)
    if abs(exponent - 1.0) < 1e-9:
        cdf = np.log(edges) / np.log(n + 1.0)
    else:
        e = 1.0 - exponent
        cdf = (edges ** e - 1.0) / ((n + 1.0) ** e - 1.0)
    return np.diff(cdf)


@dataclass(frozen=True, slots=True)
class ItemSpace:
    n_items: int
    n_clusters: int

    @property
    def segment(self) -> int:
        return self.n_items // self.n_clusters

    def head_ids(self, ranks: np.ndarray) -> np.ndarray:
        """Global ranks -> item ids at shift 0 (rank 0 is item 0, then counting down the ring)."""
        return ((-ranks) % self.n_items).astype(np.int64)

    def tail_ids(self, ranks: np.ndarray, cluster: np.ndarray) -> np.ndarray:
        """Cluster-local ranks -> item ids inside the cluster's segment, at shift 0."""
        m = self.segment
        return (cluster * m + (-ranks) % m).astype(np.int64)

    def shift(self, ids: np.ndarray, shift: np.ndarray | int) -> np.ndarray:
        """Rotate ids inside their segment by `shift` (per row if 2-D with a column of shifts):
        what popularity drift does to the item behind each rank."""
        m = self.segment
        seg, off = np.divmod(ids, m)
        inside = seg < self.n_clusters     # ids past the last full segment stay put
        out = np.where(inside, seg * m + (off + shift) % m, ids)
        return out.astype(np.int64)

    def prior(self, head_share: float, head_exponent: float, tail_exponent: float) -> np.ndarray:
        """Expected access share of every item at shift 0 when all clusters are equally busy:
        what a production cache is warm-started from."""
        p = np.zeros(self.n_items)
        ranks = np.arange(self.n_items)
        p[self.head_ids(ranks)] += head_share * zipf_pmf(self.n_items, head_exponent)
        m = self.segment
        tail = zipf_pmf(m, tail_exponent) * (1.0 - head_share) / self.n_clusters
        local = self.tail_ids(np.arange(m), np.zeros(m, np.int64))
        for c in range(self.n_clusters):
            p[local + c * m] += tail
        return p
