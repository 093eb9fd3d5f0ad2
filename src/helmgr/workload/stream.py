"""A workload: arrival sources, users, histories and candidates, assembled into a chunked stream.

`Workload.chunks()` replays the same stream for the same seed, every time it is called. Two
overlays act on any source (synthetic or trace): popularity *drift* rotates the items behind
each candidate rank over time, and *trending events* make the candidates of some requests lean
on a trending set: a burst's sessions lean on the burst's set, trend's discovery traffic on the
set of the phase it arrives in. A workload also names its phases (`phases.Phase`), the
stretches a scenario check compares.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Protocol, Sequence

import numpy as np

from helmgr.workload.arrivals import Burst
from helmgr.workload.candidates import cut_runs
from helmgr.workload.chunk import RequestChunk, RequestTable, offsets_from_counts
from helmgr.workload.phases import Phase, carve, whole
from helmgr.workload.popularity import ItemSpace, zipf_ranks
from helmgr.workload.users import PrefixTracker


class Source(Protocol):
    """Requests in [t0, t1) (and sessions' later requests, which the stream holds back). An
    optional attribute `lean` ("burst", "discovery" or None) names the trending events its
    requests lean on."""

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


LEANS = ("burst", "discovery")      # the kinds of trending events, by the requests that lean on them


@dataclass(frozen=True, slots=True)
class Trending:
    """The shape of every trending set: `items` consecutive ids from an event's `trend_start`,
    Zipf(`exponent`) among them; during a burst, `share` of a burst request's candidates come
    from it."""

    items: int = 2000
    share: float = 0.5
    exponent: float = 0.9


@dataclass(frozen=True, slots=True)
class TrendEvent:
    """From `start` to `end`, the requests of sources whose `lean` is `lean` take a share of
    their candidates from the trending set at `trend_start`; the share moves linearly from
    `share[0]` at the start to `share[1]` at the end."""

    start: float
    end: float
    trend_start: int
    lean: str
    share: tuple[float, float]

    def share_at(self, t: np.ndarray) -> np.ndarray:
        a, b = self.share
        if a == b:
            return np.full(np.shape(t), a)
        return a + (b - a) * np.clip((t - self.start) / (self.end - self.start), 0.0, 1.0)


@dataclass(frozen=True, slots=True)
class StreamChunk(RequestChunk):
    """A workload's chunk: a RequestChunk that also says which requests are discovery traffic."""

    discovery: np.ndarray     # bool: request of trend's discovery traffic (never also a burst request)


def burst_events(bursts: Sequence[Burst], share: float) -> list[TrendEvent]:
    return [TrendEvent(b.start, b.end, b.trend_start, "burst", (share, share)) for b in bursts]


class Workload:
    """A stream and what it is made of. `events` default to the bursts' trending events, and
    `phases` to the steady stretches between the bursts and the bursts themselves."""

    def __init__(self, *, name: str, duration_s: float, seed: int, space: ItemSpace, users: Users,
                 history: History, candidates: Candidates, sources: list[Source], bursts: list[Burst] = (),
                 trending: Trending = Trending(), drift_per_s: float = 0.0, prior: np.ndarray | None = None,
                 events: Sequence[TrendEvent] | None = None, phases: Sequence[Phase] | None = None):
        self.name, self.duration_s, self.seed = name, float(duration_s), seed
        self.space, self.users, self.history, self.candidates = space, users, history, candidates
        self.sources, self.bursts, self.trending = list(sources), list(bursts), trending
        self.drift_per_s = drift_per_s
        self.prior = prior
        self.events = tuple(burst_events(self.bursts, trending.share) if events is None else events)
        self.phases = tuple(carve(whole(self.duration_s), [(b.start, b.end) for b in self.bursts])
                            if phases is None else phases)
        self._lean = np.array([LEANS.index(s.lean) if getattr(s, "lean", None) else -1 for s in self.sources],
                              np.int8)
        self._by_lean = [sorted((e for e in self.events if e.lean == k), key=lambda e: e.start) for k in LEANS]
        n_q = int(round(max((max(e.share) for e in self.events), default=0.0) * candidates.count))
        self._n_trend = n_q
        if n_q:
            rng = np.random.default_rng([seed, 17])
            self._trend_pool = zipf_ranks(rng, trending.items, trending.exponent, 1 << 18)

    @property
    def n_items(self) -> int:
        return self.space.n_items

    @property
    def n_segments(self) -> int:
        """How many interest segments its requests name (`RequestChunk.segment`): the synthetic
        users' clusters, a widened log's clones (1: a log as it is)."""
        return self.space.n_clusters

    def first_second_lookups(self) -> tuple[float, int, float]:
        """EMB lookups of the first simulated second (candidates, new items and half of each
        prefix), its requests, and its last arrival time; (0, 0, 0) if it is empty. What scales
        the warm-start prior into count units, for the simulated nodes and the serving replicas."""
        first = next(iter(self.chunks(1.0)), None)
        if first is None or not len(first):
            return 0.0, 0, 0.0
        ids = len(first.cand_ids) + len(first.item_ids) + 0.5 * float(first.prefix_len.sum())
        return ids, len(first), float(first.t[-1])

    def chunks(self, chunk_s: float = 1.0) -> Iterator[StreamChunk]:
        """The stream, in time order, one chunk per `chunk_s` simulated seconds."""
        rng = np.random.default_rng(self.seed)
        tracker = PrefixTracker()
        for s in self.sources:
            s.reset()
        pending, pending_lean = RequestTable.empty(), np.zeros(0, np.int8)
        t0 = 0.0
        while t0 < self.duration_s:
            t1 = min(t0 + chunk_s, self.duration_s)
            tables = [s.arrivals(rng, t0, t1) for s in self.sources]
            lean = np.concatenate([pending_lean] + [np.full(len(x), k, np.int8) for x, k in zip(tables, self._lean)])
            table = RequestTable.concat([pending] + tables)
            keep = table.t < self.duration_s
            ready = keep & (table.t < t1)
            later = np.flatnonzero(keep & ~ready)
            pending, pending_lean = table.take(later), lean[later]
            now = np.flatnonzero(ready)
            now = now[np.argsort(table.t[now], kind="stable")]
            yield self._materialize(rng, table.take(now), lean[now], tracker)
            t0 = t1

    def _lean_on_events(self, rng: np.random.Generator, t: np.ndarray, lean: np.ndarray, cands: np.ndarray) -> None:
        """Overwrite the leading candidates of the requests that lean on a trending event: each
        takes its share of candidates from the set of the latest event of its kind begun by then."""
        rows = np.flatnonzero(lean >= 0)
        if not self._n_trend or not len(rows):
            return
        first_id = np.zeros(len(rows), np.int64)
        width = np.zeros(len(rows), np.int64)
        for k, events in enumerate(self._by_lean):
            mine = np.flatnonzero(lean[rows] == k)
            if not len(mine) or not events:
                continue
            tk = t[rows[mine]]
            starts = np.array([e.start for e in events])
            which = np.clip(np.searchsorted(starts, tk, side="right") - 1, 0, len(events) - 1)
            first_id[mine] = np.array([e.trend_start for e in events])[which]
            share = np.empty(len(mine))
            for j in np.unique(which):
                at = which == j
                share[at] = events[j].share_at(tk[at])
            width[mine] = np.rint(share * self.candidates.count).astype(np.int64)
        ranks = cut_runs(rng, self._trend_pool, self._n_trend, len(rows))
        trend = (first_id[:, None] + ranks) % self.space.n_items
        lead = cands[rows, :self._n_trend]
        cands[rows, :self._n_trend] = np.where(np.arange(self._n_trend) < width[:, None], trend, lead)

    def _materialize(self, rng: np.random.Generator, req: RequestTable, lean: np.ndarray,
                     tracker: PrefixTracker) -> StreamChunk:
        users = req.user
        prefix = self.users.base_len(users) + tracker.advance(users, req.n_new)
        items = self.history.batch(users, prefix, req.n_new)
        segment = self.users.cluster(users)
        cands = self.candidates.draw(rng, segment)
        if self.drift_per_s:
            shift = np.floor(req.t * self.drift_per_s).astype(np.int64)
            cands = self.space.shift(cands, shift[:, None])
        self._lean_on_events(rng, req.t, lean, cands)
        n, m = len(req), cands.shape[1]
        return StreamChunk(
            t=req.t, user=users, prefix_len=prefix.astype(np.int32), new_tokens=req.n_new,
            item_ids=items, item_offsets=offsets_from_counts(req.n_new),
            cand_ids=cands.ravel(), cand_offsets=np.arange(n + 1, dtype=np.int64) * m, burst=req.burst,
            segment=np.asarray(segment, np.int64),
            discovery=lean == LEANS.index("discovery"),
        )
