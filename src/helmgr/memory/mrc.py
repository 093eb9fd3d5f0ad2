"""Miss-ratio curves of LRU caches: exact (Mattson stack distances) and sampled (SHARDS).

The stack distance of an access is how much distinct data (keys, or bytes when keys have sizes)
was touched since the previous access to the same key; an LRU cache of capacity c hits exactly
the accesses whose distance is below c (Mattson et al., IBM Systems Journal 1970), so one pass
gives the miss ratio at every capacity. A Fenwick tree over access times makes the pass
O(n log n): each key's last access holds its size, and the distance is the sum after it.

SHARDS (Waldspurger et al., FAST 2015) keeps only the keys whose hash falls under a threshold
(rate R), computes distances on that sample, and scales them by 1/R: a fraction of the work
for an MRC within a few hundredths of the exact one.
"""
from __future__ import annotations

import numpy as np

from helmgr.core.hashing import splitmix64


def stack_distances(keys: np.ndarray, sizes: np.ndarray | None = None) -> np.ndarray:
    """Per access: the distinct data (count, or summed `sizes`) touched since the previous access
    to its key, that key excluded; +inf on a first access."""
    keys = np.asarray(keys)
    n = len(keys)
    w = np.ones(n) if sizes is None else np.asarray(sizes, float)
    tree = [0.0] * (n + 1)                       # Fenwick tree over access times (Python floats)
    total = 0.0
    last: dict = {}
    out = np.full(n, np.inf)
    key_list, w_list = keys.tolist(), w.tolist()
    for i, (k, size) in enumerate(zip(key_list, w_list)):
        prev = last.get(k)
        if prev is not None:
            # every key's weight sits at its last access: the distance is what lies after prev
            s, j = 0.0, prev + 1
            while j > 0:
                s += tree[j]
                j -= j & -j
            out[i] = total - s
            wprev = w_list[prev]
            j = prev + 1
            while j <= n:
                tree[j] -= wprev
                j += j & -j
            total -= wprev
        j = i + 1
        while j <= n:
            tree[j] += size
            j += j & -j
        total += size
        last[k] = i
    return out


def miss_ratio_curve(distances: np.ndarray, capacities: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
    """Miss ratio of an LRU cache at each capacity: the share of accesses with distance >= it."""
    d = np.sort(distances)
    if weights is None:
        hits = np.searchsorted(d, capacities, side="left")
        return 1.0 - hits / max(len(d), 1)
    order = np.argsort(distances)
    cum = np.r_[0.0, np.cumsum(np.asarray(weights, float)[order])]
    hits = cum[np.searchsorted(d, capacities, side="left")]
    return 1.0 - hits / max(cum[-1], 1e-300)


def shards_sample(keys: np.ndarray, rate: float, salt: int = 0) -> np.ndarray:
    """Indices of the accesses SHARDS keeps: those whose key hashes below `rate` of the range."""
    if not 0.0 < rate <= 1.0:
        raise ValueError(f"SHARDS rate must be in (0, 1], got {rate}")
    h = splitmix64(np.asarray(keys, np.uint64) ^ np.uint64(salt))
    return np.flatnonzero(h < np.uint64(int(rate * float(1 << 64) - 1)))


def shards_mrc(keys: np.ndarray, capacities: np.ndarray, rate: float = 0.01, sizes: np.ndarray | None = None,
               salt: int = 0) -> np.ndarray:
    """The MRC estimated from a `rate` spatial sample: sampled distances scaled by 1/rate, and
    sampled misses counted against the expected sample size rate x n rather than the actual one
    (SHARDS_adj: whether the few hottest keys fall in the sample would otherwise bias every
    point of a skewed trace)."""
    keep = shards_sample(keys, rate, salt)
    if len(keep) == 0:
        return np.ones(len(capacities))
    d = stack_distances(np.asarray(keys)[keep], None if sizes is None else np.asarray(sizes)[keep]) / rate
    misses = len(d) - np.searchsorted(np.sort(d), np.asarray(capacities, float), side="left")
    return np.clip(misses / (rate * len(keys)), 0.0, 1.0)
