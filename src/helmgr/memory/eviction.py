"""Eviction policies, once for both EMB caches: how an entry's priority grows with its
accesses and ages with time, which entries a cache keeps, and the registry by name.

A cache keeps one float32 priority per entry (higher = keep) and tells its policy two things:
`touch(scores, ids, counts, epoch)`, entries `ids` (distinct) were accessed `counts` times in
epoch `epoch`, and `age(scores)`, an epoch ended. Epochs are the cache's clock: the simulated
cache's refresh intervals, the device cache's lookups. Which entries stay follows one rule: the
highest priorities, ties to the lower index (`keep_top`, `top`); a cache that admits one miss at a
time lets it replace a resident entry only when it scores strictly higher (`admits`).

LFU ages in one of two representations with the same order. Eager: every score is multiplied by
`decay` when an epoch ends (O(entries)). Lazy: the weight of a new access grows by 1/decay
instead (O(batch)), and scores are rescaled when the weight gets large (`rescales` counts it).
Under lazy aging scores only grow between rescales, which lets a cache keep its coldest entries
aside between misses (the device cache) or re-rank only the rows a refresh saw (the simulated
one). Both caches age lazily; the tests hold them to eager aging as the reference.
"""
from __future__ import annotations

import numpy as np

from helmgr.core.errors import HelmInputError


class EvictionPolicy:
    """Priorities from accesses. Subclasses define `priority`; `age` is a no-op unless time
    itself lowers a priority."""

    name = ""
    additive = False             # an access adds `weight` (a cache may add accesses one at a time)
    weight = 1.0                 # what one access adds now, relative to the stored scores
    rescales = 0                 # times the stored scores were rescaled (they never are here)

    def priority(self, old: np.ndarray, counts: np.ndarray, epoch: int) -> np.ndarray:
        """New priorities of entries with priorities `old`, accessed `counts` (> 0, float32)
        times in epoch `epoch`."""
        raise NotImplementedError

    def touch(self, scores: np.ndarray, ids: np.ndarray, counts: np.ndarray, epoch: int) -> None:
        """Entries `ids` (distinct) were accessed `counts` times in epoch `epoch`."""
        if len(ids):
            scores[ids] = self.priority(scores[ids], counts, epoch)

    def age(self, scores: np.ndarray) -> None:
        """An epoch ended."""

    def settled(self, shares, per_epoch: float) -> np.ndarray:
        """Scores (float64) for a warm start from access `shares`, one per entry: the priorities
        that `per_epoch` accesses an epoch, split by share, settle at."""
        s = np.asarray(shares, np.float64)
        return s / max(float(np.sum(shares)), 1e-300) * per_epoch

    @staticmethod
    def admits(candidate, victim):
        """Whether a candidate of priority `candidate` replaces a resident of priority `victim`
        (elementwise, numpy or torch): only a strictly higher one does."""
        return candidate > victim


class LFU(EvictionPolicy):
    """Decayed frequency (LFU with aging, as HugeCTR's HPS and FBGEMM's LFU cache): an access in
    epoch e counts decay^(now - e). `decay` 1 is plain frequency."""

    name = "lfu"
    additive = True

    def __init__(self, decay: float = 0.99, lazy: bool = False):
        if not 0.0 < decay <= 1.0:
            raise HelmInputError(f"LFU decay must be in (0, 1], got {decay}")
        self.decay, self.lazy = decay, lazy
        self.weight = 1.0
        self.rescales = 0

    def priority(self, old, counts, epoch):
        return old + counts * self.weight

    def age(self, scores):
        if not self.lazy:
            scores *= self.decay
            return
        self.weight /= self.decay
        if self.weight > 1e18:
            scores /= self.weight
            self.weight = 1.0
            self.rescales += 1

    def settled(self, shares, per_epoch):
        """Per-epoch counts c settle at c / (1 - decay); without aging they never settle and
        count as one epoch's."""
        s = super().settled(shares, per_epoch) * self.weight
        return s / (1.0 - self.decay) if self.decay < 1.0 else s


class LRU(EvictionPolicy):
    """Recency: the epoch of the last access, ties inside an epoch going to the busier entry
    (epoch + its share of the epoch's top count)."""

    name = "lru"

    def __init__(self, decay: float = 0.99, lazy: bool = False):
        pass                     # recency does not age: the arguments keep one signature

    def priority(self, old, counts, epoch):
        return epoch + counts / (float(counts.max()) + 1.0)


EVICTION_POLICIES = {"lfu": LFU, "lru": LRU}


def make_eviction(name: str, decay: float = 0.99, lazy: bool = False) -> EvictionPolicy:
    """The policy registered as `name`; `lazy` picks LFU's O(batch) aging."""
    try:
        cls = EVICTION_POLICIES[name]
    except KeyError:
        raise HelmInputError(f"unknown EMB policy {name!r} (known: {', '.join(EVICTION_POLICIES)})") from None
    return cls(decay, lazy)


def value_at_rank(scores: np.ndarray, r: int):
    """The score at rank r (0 = highest)."""
    n = len(scores)
    return np.partition(scores, n - 1 - r)[n - 1 - r]


def keep_top(scores: np.ndarray, c: int, rank=value_at_rank) -> np.ndarray:
    """Mask of the c entries a cache of c keeps: highest score first, ties to the lower index.
    One selection (`rank`: a `value_at_rank`) and three passes, whatever c."""
    n = len(scores)
    c = min(c, n)
    if c <= 0:
        return np.zeros(n, bool)
    theta = rank(scores, c - 1)
    keep = scores >= theta
    extra = int(np.count_nonzero(keep)) - c
    if extra > 0:                                  # ties at the threshold: keep the lowest ids
        tied = np.flatnonzero(scores == theta)
        keep[tied[len(tied) - extra:]] = False
    return keep


def top(scores: np.ndarray, c: int) -> np.ndarray:
    """Indices of the `keep_top` entries, highest first (ties: lower index first)."""
    ids = np.flatnonzero(keep_top(scores, c))
    return ids[np.argsort(-scores[ids], kind="stable")]
