"""Users: attributes drawn from a hash of the user id (so any id, including users cloned or
injected during a run, has them without a table), and the per-user prefix state of a stream."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finalizer: a fast, well-mixed 64-bit hash, vectorized."""
    with np.errstate(over="ignore"):
        z = np.asarray(x, np.uint64) + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


_MASK = (1 << 64) - 1


def hash_uniform_one(user: int, salt: int) -> float:
    """`hash_uniform` for one user, in plain Python (a numpy call per user costs ~40x more)."""
    z = (((user * 0x100000001B3) & _MASK) + salt + 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    z ^= z >> 31
    return ((z >> 11) + 0.5) / float(1 << 53)


def hash_uniform(users: np.ndarray, salt: int) -> np.ndarray:
    """A uniform in (0, 1) per (user, salt), stable across runs."""
    with np.errstate(over="ignore"):
        h = splitmix64(np.asarray(users, np.uint64) * np.uint64(0x100000001B3) + np.uint64(salt))
    return ((h >> np.uint64(11)).astype(np.float64) + 0.5) / float(1 << 53)


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
