"""Users: attributes drawn from a hash of the user id (so any id, including users cloned or
injected during a run, has them without a table), and the per-user prefix state of a stream."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from helmgr.core.hashing import hash_uniform


@dataclass(frozen=True, slots=True)
class SyntheticUsers:
    """Each user's interest cluster and history length (lognormal, median `len_median`)."""

    n_clusters: int
    len_median: float
    len_sigma: float
    len_cap: int
    seed: int

    def cluster(self, users: np.ndarray) -> np.ndarray:
        return (hash_uniform(users, self.seed * 7 + 1) * self.n_clusters).astype(np.int64)

    def base_len(self, users: np.ndarray) -> np.ndarray:
        u1 = hash_uniform(users, self.seed * 7 + 2)
        u2 = hash_uniform(users, self.seed * 7 + 3)
        z = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)    # Box-Muller
        length = np.rint(self.len_median * np.exp(self.len_sigma * z))
        return np.clip(length, 1, self.len_cap).astype(np.int32)


class PrefixTracker:
    """How many tokens each user's history has grown by since the stream began."""

    def __init__(self):
        self.growth = np.zeros(1024, np.int32)

    def advance(self, users: np.ndarray, n_new: np.ndarray) -> np.ndarray:
        """For requests in time order: each one's growth before it; then add their tokens."""
        if len(users) == 0:
            return np.zeros(0, np.int32)
        top = int(users.max()) + 1
        if top > len(self.growth):
            grown = np.zeros(max(top, 2 * len(self.growth)), np.int32)
            grown[:len(self.growth)] = self.growth
            self.growth = grown
        order = np.argsort(users, kind="stable")
        u, k = users[order], n_new[order].astype(np.int64)
        incl = np.cumsum(k)
        first = np.r_[True, u[1:] != u[:-1]]
        group_start = np.maximum.accumulate(np.where(first, np.arange(len(u)), 0))
        before = incl - k - (incl[group_start] - k[group_start])
        out = np.empty(len(users), np.int32)
        out[order] = self.growth[u] + before
        last = np.r_[u[1:] != u[:-1], True]
        self.growth[u[last]] += (before + k)[last].astype(np.int32)
        return out
