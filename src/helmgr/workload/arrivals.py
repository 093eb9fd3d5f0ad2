"""Arrival processes: sessions of requests from a user population, and bursts on top of them.

Sessions start as a Poisson process whose rate may vary in time (a piecewise-constant rate on a
fine grid, exact for that rate); each session is a user's run of requests separated by think
times. Returning users come from the population's skewed activity: busy users come back often;
users first seen during the run (burst and discovery visitors) get new ids from `NewUsers`.

A source's `lean` names the trending events its requests' candidates lean on (stream.TrendEvent):
`"burst"` for burst sessions, `"discovery"` for trend's discovery traffic, None for the rest.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from helmgr.workload.chunk import RequestTable, offsets_from_counts
from helmgr.workload.popularity import zipf_ranks

Rate = Callable[[np.ndarray], np.ndarray]   # requests per second at the given times


def poisson_times(rng: np.random.Generator, rate: Rate, t0: float, t1: float, dt: float = 0.1) -> np.ndarray:
    """Sorted event times in [t0, t1) of a Poisson process with rate `rate(t)` (per second)."""
    if t1 <= t0:
        return np.zeros(0)
    edges = np.arange(t0, t1, dt)
    edges = np.append(edges[edges < t1], t1)   # (rounding can put arange's last step at t1 or past it)
    widths = np.diff(edges)
    counts = rng.poisson(np.maximum(rate(edges[:-1] + widths / 2), 0.0) * widths)
    times = np.repeat(edges[:-1], counts) + rng.random(int(counts.sum())) * np.repeat(widths, counts)
    return np.sort(times)


@dataclass(frozen=True, slots=True)
class SessionShape:
    mean_requests: float    # requests per session (geometric, >= 1)
    think_s: float          # mean think time between a session's requests (exponential)
    new_tokens: float       # mean new actions per request (1 + Poisson)


def expand_sessions(rng: np.random.Generator, starts: np.ndarray, users: np.ndarray, shape: SessionShape,
                    burst: bool) -> RequestTable:
    """Each session -> its requests: the first at the session start, then one per think time."""
    k = rng.geometric(1.0 / shape.mean_requests, len(starts))
    total = int(k.sum())
    offsets = offsets_from_counts(k)
    gaps = rng.exponential(shape.think_s, total)
    gaps[offsets[:-1]] = 0.0
    csum = np.cumsum(gaps)
    session = np.repeat(np.arange(len(starts)), k)
    t = starts[session] + csum - (csum[offsets[:-1]])[session]
    n_new = (1 + rng.poisson(max(shape.new_tokens - 1.0, 0.0), total)).astype(np.int32)
    return RequestTable(t, users[session], n_new, np.full(total, burst))


@dataclass(frozen=True, slots=True)
class Population:
    """`n_users` users whose activity is Zipf(`activity_exponent`) over a hashed order of ids."""

    n_users: int
    activity_exponent: float

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        ranks = zipf_ranks(rng, self.n_users, self.activity_exponent, n)
        return (ranks * 2_654_435_761) % self.n_users   # Knuth's multiplier scatters busy users


class NewUsers:
    """Ids of users first seen during the run, numbered upward from `first`; shared by the
    sources that bring such users, so their ids never collide."""

    def __init__(self, first: int):
        self.first = self.next = int(first)

    def reset(self) -> None:
        self.next = self.first

    def take(self, n: int) -> np.ndarray:
        ids = self.next + np.arange(n, dtype=np.int64)
        self.next += n
        return ids


def _mix_new(rng: np.random.Generator, users: np.ndarray, share: float, new_users: NewUsers) -> np.ndarray:
    """Replace a share `share` of `users` (at random) by new users."""
    new = rng.random(len(users)) < share
    users[new] = new_users.take(int(new.sum()))
    return users


class SessionSource:
    """Steady-state sessions at `rate(t)` requests per second. The first chunk also starts the
    sessions that would already be running at t = 0, so the stream is stationary from the start."""

    lean = None

    def __init__(self, rate: Rate, shape: SessionShape, population: Population, spinup_s: float):
        self.rate, self.shape, self.population, self.spinup_s = rate, shape, population, spinup_s

    def reset(self) -> None:
        pass

    def arrivals(self, rng: np.random.Generator, t0: float, t1: float) -> RequestTable:
        lo = t0 - self.spinup_s if t0 == 0.0 else t0
        session_rate = lambda t: self.rate(np.maximum(t, 0.0)) / self.shape.mean_requests
        starts = poisson_times(rng, session_rate, lo, t1)
        table = expand_sessions(rng, starts, self.population.draw(rng, len(starts)), self.shape, burst=False)
        return table.take(np.flatnonzero(table.t >= max(t0, 0.0)))


def session_starts(requests: Rate, shape: SessionShape, nodes: int = 24) -> Rate:
    """The session start rate whose sessions (of `shape`) send requests at `requests(t)`, also
    while that rate moves. A session sends its first request at its start, then each one after an
    exponential think time (mean theta) with probability 1 - p (p = 1 / mean_requests), so
    requests = lam + (1 - p) / theta * int lam(t - s) exp(-p s / theta) ds; solved for lam,
    lam(t) = requests(t) - (1 - p) / theta * g(t) with g(t) = int_0^inf requests(t - s) exp(-s / theta) ds
    (Gauss-Laguerre). Constant requests give lam = p x requests. Clipped at 0 where the rate falls
    faster than running sessions end (there the request rate lags the target)."""
    p, theta = 1.0 / shape.mean_requests, shape.think_s
    x, w = np.polynomial.laguerre.laggauss(nodes)

    def rate(t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, np.float64)
        g = theta * (requests(np.maximum(t[..., None] - theta * x, 0.0)) @ w)
        return np.maximum(requests(np.maximum(t, 0.0)) - (1.0 - p) / theta * g, 0.0)
    return rate


class ShapedSource:
    """Sessions whose requests arrive at `envelope(t) x keep(t)` per second, however that moves:
    sessions start at the rate that gives `envelope` (`session_starts`; keep the envelope smooth),
    and each request is kept with probability `keep(t)` (so a fast change of the mix thins running
    sessions instead of waiting for them to end). A share `new_share` of sessions are new users."""

    def __init__(self, envelope: Rate, keep: Rate, shape: SessionShape, population: Population, spinup_s: float,
                 new_users: NewUsers, new_share: float, lean: str | None = None):
        self.starts, self.keep, self.shape = session_starts(envelope, shape), keep, shape
        self.population, self.spinup_s, self.new_users, self.new_share = population, spinup_s, new_users, new_share
        self.lean = lean

    def reset(self) -> None:
        self.new_users.reset()

    def arrivals(self, rng: np.random.Generator, t0: float, t1: float) -> RequestTable:
        lo = t0 - self.spinup_s if t0 == 0.0 else t0
        starts = poisson_times(rng, self.starts, lo, t1)
        users = _mix_new(rng, self.population.draw(rng, len(starts)), self.new_share, self.new_users)
        table = expand_sessions(rng, starts, users, self.shape, burst=False)
        kept = rng.random(len(table)) < self.keep(np.maximum(table.t, 0.0))
        return table.take(np.flatnonzero(kept & (table.t >= max(t0, 0.0))))


@dataclass(frozen=True, slots=True)
class Burst:
    start: float
    end: float
    mult: float          # request rate during the burst, as a multiple of the base rate
    trend_start: int     # first item id of the burst's trending set


def burst_schedule(rng: np.random.Generator, duration: float, every_s: float, len_s: tuple[float, float],
                   mult: tuple[float, float], n_items: int, first_s: tuple[float, float] | None = None,
                   clip: bool = False) -> list[Burst]:
    """Bursts separated by gaps of `every_s` x U(0.5, 1.5), as many as fit inside the run. With
    `first_s`, the first one starts at U(first_s) instead; with `clip`, a last burst that would
    outlast the run ends with it, if at least the shortest length `len_s[0]` of it fits."""
    out, t = [], 0.0
    while True:
        t += rng.uniform(*first_s) if first_s is not None and not out else every_s * rng.uniform(0.5, 1.5)
        length = rng.uniform(*len_s)
        if clip and t + len_s[0] <= duration:
            length = min(length, duration - t)
        if t + length > duration:
            return out
        out.append(Burst(t, t + length, rng.uniform(*mult), int(rng.integers(0, n_items))))
        t += length


class BurstSource:
    """During each burst, extra sessions bring the request rate to `mult` x the base rate (rising
    linearly from the base over the burst's first `ramp_s` seconds; 0: at once); a share
    `new_share` of them are new users (cold KV), numbered upward from `first_new_user` (or taken
    from `new_users`, when other sources bring new users too)."""

    lean = "burst"

    def __init__(self, bursts: list[Burst], base_rate: Rate, shape: SessionShape, population: Population,
                 new_share: float, first_new_user: int, new_users: NewUsers | None = None, ramp_s: float = 0.0):
        self.bursts, self.base_rate, self.shape, self.ramp_s = bursts, base_rate, shape, ramp_s
        self.population, self.new_share = population, new_share
        self.new_users = new_users or NewUsers(first_new_user)

    def reset(self) -> None:
        self.new_users.reset()

    def arrivals(self, rng: np.random.Generator, t0: float, t1: float) -> RequestTable:
        tables = [RequestTable.empty()]
        for b in self.bursts:
            lo, hi = max(t0, b.start), min(t1, b.end)
            if hi <= lo:
                continue
            rate = lambda t, m=b.mult: (m - 1.0) * self.base_rate(t) / self.shape.mean_requests
            if self.ramp_s > 0:
                rate = lambda t, step=rate, t0=b.start: step(t) * np.clip((t - t0) / self.ramp_s, 0.0, 1.0)
            starts = poisson_times(rng, rate, lo, hi)
            users = _mix_new(rng, self.population.draw(rng, len(starts)), self.new_share, self.new_users)
            tables.append(expand_sessions(rng, starts, users, self.shape, burst=True))
        return RequestTable.concat(tables)
