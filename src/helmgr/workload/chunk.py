"""Requests as numpy chunks: one array per field, flat id arrays plus offsets.

A chunk never holds one Python object per request or per id. Request i's new-token item ids are
`item_ids[item_offsets[i]:item_offsets[i + 1]]`, its candidates likewise in `cand_ids`.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np


_FLAT = ("item_ids", "item_offsets", "cand_ids", "cand_offsets")


@dataclass(frozen=True, slots=True)
class RequestChunk:
    t: np.ndarray             # float64 arrival time, seconds, non-decreasing
    user: np.ndarray          # int64
    prefix_len: np.ndarray    # int32: history positions before this request (K/V cacheable)
    new_tokens: np.ndarray    # int32: actions since the user's previous request
    item_ids: np.ndarray      # int64 flat: the new tokens' item ids (intp: gathers need no cast)
    item_offsets: np.ndarray  # int64, len n + 1
    cand_ids: np.ndarray      # int64 flat: candidates to score
    cand_offsets: np.ndarray  # int64, len n + 1
    burst: np.ndarray         # bool: request belongs to an injected burst
    segment: np.ndarray       # int64: the user's interest segment (what a recommender knows of a user;
                              # the workload's cluster or clone range), -1 where unknown

    def __len__(self) -> int:
        return len(self.t)

    def items(self, i: int) -> np.ndarray:
        return self.item_ids[self.item_offsets[i]:self.item_offsets[i + 1]]

    def candidates(self, i: int) -> np.ndarray:
        return self.cand_ids[self.cand_offsets[i]:self.cand_offsets[i + 1]]

    def rows(self, a: int, b: int) -> "RequestChunk":
        """Requests a..b-1, as a chunk of the same type."""
        io, co = self.item_offsets, self.cand_offsets
        per_row = {f.name: getattr(self, f.name)[a:b] for f in fields(self) if f.name not in _FLAT}
        return type(self)(item_ids=self.item_ids[io[a]:io[b]], item_offsets=io[a:b + 1] - io[a],
                          cand_ids=self.cand_ids[co[a]:co[b]], cand_offsets=co[a:b + 1] - co[a], **per_row)


@dataclass(frozen=True, slots=True)
class RequestTable:
    """Requests before their ids are drawn: what the arrival processes produce."""

    t: np.ndarray       # float64
    user: np.ndarray    # int64
    n_new: np.ndarray   # int32
    burst: np.ndarray   # bool

    def __len__(self) -> int:
        return len(self.t)

    @staticmethod
    def empty() -> "RequestTable":
        return RequestTable(np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, bool))

    @staticmethod
    def concat(tables: list["RequestTable"]) -> "RequestTable":
        return RequestTable(*(np.concatenate([getattr(x, f) for x in tables]) for f in ("t", "user", "n_new", "burst")))

    def take(self, idx: np.ndarray) -> "RequestTable":
        return RequestTable(self.t[idx], self.user[idx], self.n_new[idx], self.burst[idx])


def offsets_from_counts(counts: np.ndarray) -> np.ndarray:
    out = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def ragged_positions(starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For rows with `counts[i]` elements starting at `starts[i]`: (row of each element,
    position of each element), flat, without a Python loop."""
    total = int(counts.sum())
    rows = np.repeat(np.arange(len(counts)), counts)
    offsets = offsets_from_counts(counts)
    pos = np.arange(total) - offsets[rows] + np.repeat(starts, counts)
    return rows, pos
