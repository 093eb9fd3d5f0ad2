"""A workload: arrival sources, users, histories and candidates, assembled into a chunked stream.

`Workload.chunks()` replays the same stream for the same seed, every time it is called. Two
overlays act on any source (synthetic or trace): popularity *drift* rotates the items behind
each candidate rank over time, and *bursts* add sessions whose candidates lean on a trending set.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Protocol

import numpy as np

from helmgr.workload.arrivals import Burst
from helmgr.workload.candidates import windows
from helmgr.workload.chunk import RequestChunk, RequestTable, offsets_from_counts
from helmgr.workload.popularity import ItemSpace, zipf_ranks
from helmgr.workload.users import PrefixTracker


class Source(Protocol):
    def reset(self) -> None: ...
    def arrivals(self, rng: np.random.Generator, t0: float, t1: float) -> RequestTable: ...


class Users(Protocol):
    def cluster(self, users: np.ndarray) -> np.ndarray: ...
    def base_len(self, users: np.ndarray) -> np.ndarray: ...


class History(Protocol):
    def __call__(self, user: int, start: int, stop: int) -> np.ndarray: ...
    def batch(self, users: np.ndarray, starts: np.ndarray, counts: np.ndarray) -> np.ndarray: ...


class Candidates(Protocol):
    count: int
    def draw(self, rng: np.random.Generator, clusters: np.ndarray) -> np.ndarray: ...


@dataclass(frozen=True, slots=True)
class Trending:
    """During a burst, `share` of a burst request's candidates come from the burst's trending
    set: `items` consecutive ids from the burst's `trend_start`, Zipf(`exponent`) among them."""

    items: int = 2000
    share: float = 0.5
    exponent: float = 0.9


class Workload:
    def __init__(self, *, name: str, duration_s: float, seed: int, space: ItemSpace, users: Users,
                 history: History, candidates: Candidates, sources: list[Source], bursts: list[Burst] = (),
                 trending: Trending = Trending(), drift_per_s: float = 0.0, prior: np.ndarray | None = None):
        self.name, self.duration_s, self.seed = name, float(duration_s), seed
        self.space, self.users, self.history, self.candidates = space, users, history, candidates
        self.sources, self.bursts, self.trending = list(sources), list(bursts), trending
        self.drift_per_s = drift_per_s
        self.prior = prior
        n_q = int(round(trending.share * candidates.count)) if self.bursts else 0
        self._n_trend = n_q
        if n_q:
            rng = np.random.default_rng([seed, 17])
            self._trend_pool = windows(zipf_ranks(rng, trending.items, trending.exponent, 1 << 18), n_q)

    @property
    def n_items(self) -> int:
        return self.space.n_items

    def first_second_lookups(self) -> tuple[float, int, float]:
        """EMB lookups of the first simulated second (candidates, new items and half of each
        prefix), its requests, and its last arrival time; (0, 0, 0) if it is empty. What scales
        the warm-start prior into count units, for the simulated nodes and the serving replicas."""
        first = next(iter(self.chunks(1.0)), None)
        if first is None or not len(first):
            return 0.0, 0, 0.0
        ids = len(first.cand_ids) + len(first.item_ids) + 0.5 * float(first.prefix_len.sum())
        return ids, len(first), float(first.t[-1])

    def chunks(self, chunk_s: float = 1.0) -> Iterator[RequestChunk]:
        """The stream, in time order, one chunk per `chunk_s` simulated seconds."""
        rng = np.random.default_rng(self.seed)
        tracker = PrefixTracker()
        for s in self.sources:
            s.reset()
        pending = RequestTable.empty()
        t0 = 0.0
        while t0 < self.duration_s:
            t1 = min(t0 + chunk_s, self.duration_s)
            table = RequestTable.concat([pending] + [s.arrivals(rng, t0, t1) for s in self.sources])
            keep = table.t < self.duration_s
            ready = keep & (table.t < t1)
            pending = table.take(np.flatnonzero(keep & ~ready))
            now = table.take(np.flatnonzero(ready))
            now = now.take(np.argsort(now.t, kind="stable"))
            yield self._materialize(rng, now, tracker)
            t0 = t1

    def _materialize(self, rng: np.random.Generator, req: RequestTable, tracker: PrefixTracker) -> RequestChunk:
        users = req.user
        prefix = self.users.base_len(users) + tracker.advance(users, req.n_new)
        items = self.history.batch(users, prefix, req.n_new)
        cands = self.candidates.draw(rng, self.users.cluster(users))
        if self.drift_per_s:
            shift = np.floor(req.t * self.drift_per_s).astype(np.int64)
            cands = self.space.shift(cands, shift[:, None])
        burst_rows = np.flatnonzero(req.burst)
        if self._n_trend and len(burst_rows):
            starts = np.array([b.start for b in self.bursts])
            which = np.clip(np.searchsorted(starts, req.t[burst_rows], side="right") - 1, 0, len(starts) - 1)
            base = np.array([b.trend_start for b in self.bursts])[which]
            ranks = self._trend_pool[rng.integers(0, len(self._trend_pool), len(burst_rows))]
            cands[burst_rows, :self._n_trend] = (base[:, None] + ranks) % self.space.n_items
        n, m = len(req), cands.shape[1]
        return RequestChunk(
            t=req.t, user=users, prefix_len=prefix.astype(np.int32), new_tokens=req.n_new,
            item_ids=items, item_offsets=offsets_from_counts(req.n_new),
            cand_ids=cands.ravel(), cand_offsets=np.arange(n + 1, dtype=np.int64) * m, burst=req.burst,
        )
