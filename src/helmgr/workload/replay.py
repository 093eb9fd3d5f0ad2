"""A log replayed against a history store built from it: the requests `helmgr loadgen --trace`
sends, and the same replay as a workload for the simulator (`loadgen --trace --sim`).

The store holds each user's whole sequence S from the log; the replay sends the log's requests
again, in the log's time order, at a set rate (exponential gaps, seeded), each user's items as
new items after what the store holds. So a user's history during the replay is S, then the part
of S replayed so far: position len(S) + k holds S[k]. `TraceHistory` reads a sequence cyclically,
which is exactly that, so the simulated replay is the log's histories with every user's prefix
starting at its whole length (`StoreUsers`). Candidates are drawn uniformly from the catalogue,
as loadgen draws them (other draws, the same distribution).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from helmgr.workload.candidates import PoolCandidates
from helmgr.workload.chunk import RequestTable
from helmgr.workload.history import TraceHistory
from helmgr.workload.popularity import ItemSpace
from helmgr.workload.stream import Trending, Workload
from helmgr.workload.trace import Log, TraceSource, TraceUsers, _requests


class Replay(NamedTuple):
    """The replay's requests in sending order: arrival time (s from the start), user, and the
    new items (`items[offsets[k]:offsets[k + 1]]`)."""

    t: np.ndarray
    user: np.ndarray
    items: np.ndarray
    offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.t)

    def new_items(self, k: int) -> np.ndarray:
        return self.items[self.offsets[k]:self.offsets[k + 1]]


def log_replay(log: Log, rps: float, duration_s: float, max_requests: int, seed: int) -> Replay:
    """The log's requests (a user's interactions at one time form one) in its time order, sent
    at `rps` for `duration_s`, at most `max_requests`."""
    order = np.lexsort((np.arange(len(log.user)), log.time, log.user))      # by user, time, file order
    t, user, sizes = _requests(log, order)
    starts = np.r_[0, np.cumsum(sizes)[:-1]]
    rng = np.random.default_rng([seed, 11])
    arrivals = np.cumsum(rng.exponential(1.0 / rps, len(t)))
    n = min(int(np.searchsorted(arrivals, duration_s)), max_requests)
    pick = np.argsort(t, kind="stable")[:n]
    items = log.item[order]
    chosen = [items[starts[i]:starts[i] + sizes[i]] for i in pick]
    return Replay(arrivals[:n], user[pick].astype(np.int64), np.concatenate(chosen or [items[:0]]).astype(np.int64),
                  np.r_[0, np.cumsum(sizes[pick])].astype(np.int64))


class StoreUsers(TraceUsers):
    """Log users whose history is already in the store: a user's replayed requests start at its
    whole sequence."""

    def base_len(self, users: np.ndarray) -> np.ndarray:
        return self.history.lengths[self.history.base_of(users)].astype(np.int32)


def store_replay_workload(log: Log, sent: Replay, n_items: int, candidates: int, seed: int,
                          duration_s: float) -> Workload:
    """The replay `sent` of `log`, against a store built from it, as a workload over a catalogue of
    `n_items` with `candidates` uniform candidates a request."""
    order = np.lexsort((np.arange(len(log.user)), log.time, log.user))
    offsets = np.r_[0, np.cumsum(np.bincount(log.user, minlength=log.n_users))]
    history = TraceHistory(log.item[order], offsets, 1, log.n_items)
    sizes = np.diff(sent.offsets).astype(np.int32)
    table = RequestTable(np.asarray(sent.t, np.float64), sent.user, sizes, np.zeros(len(sent), bool))
    return Workload(
        name="store-replay", duration_s=duration_s, seed=seed, space=ItemSpace(n_items, 1),
        users=StoreUsers(history, log.n_users), history=history,
        candidates=PoolCandidates(np.random.default_rng([seed, 5]), np.ones(n_items), candidates),
        sources=[TraceSource(table)], bursts=[], trending=Trending(items=max(10, min(2000, n_items // 20))),
        drift_per_s=0.0, prior=None)
