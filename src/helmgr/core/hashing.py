"""Stable hashes of ids: any id (a cloned user, an injected one) gets the same draw in every run,
without a table."""
from __future__ import annotations

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
