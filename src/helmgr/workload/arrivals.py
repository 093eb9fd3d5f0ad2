"""Arrival processes: sessions of requests from a user population, and bursts on top of them.

Sessions start as a Poisson process whose rate may vary in time (a piecewise-constant rate on a
fine grid, exact for that rate); each session is a user's run of requests separated by think
times. Returning users come from the population's skewed activity: busy users come back often.
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
    edges = np.append(np.arange(t0, t1, dt), t1)
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


class SessionSource:
    """Steady-state sessions at `rate(t)` requests per second. The first chunk also starts the
    sessions that would already be running at t = 0, so the stream is stationary from the start."""

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


@dataclass(frozen=True, slots=True)
class Burst:
    start: float
    end: float
    mult: float          # request rate during the burst, as a multiple of the base rate
    trend_start: int     # first item id of the burst's trending set


def burst_schedule(rng: np.random.Generator, duration: float, every_s: float, len_s: tuple[float, float],
                   mult: tuple[float, float], n_items: int) -> list[Burst]:
    """Bursts separated by gaps of `every_s` x U(0.5, 1.5), as many as fit inside the run."""
    out, t = [], 0.0
    while True:
        t += every_s * rng.uniform(0.5, 1.5)
        length = rng.uniform(*len_s)
        if t + length > duration:
            return out
        out.append(Burst(t, t + length, rng.uniform(*mult), int(rng.integers(0, n_items))))
        t += length


class BurstSource:
    """During each burst, extra sessions bring the request rate to `mult` x the base rate; a share
    `new_share` of them are new users (cold KV), numbered upward from `first_new_user`."""

    def __init__(self, bursts: list[Burst], base_rate: Rate, shape: SessionShape, population: Population,
                 new_share: float, first_new_user: int):
        self.bursts, self.base_rate, self.shape = bursts, base_rate, shape
        self.population, self.new_share, self.first_new_user = population, new_share, first_new_user
        self.next_user = first_new_user

    def reset(self) -> None:
        self.next_user = self.first_new_user

    def arrivals(self, rng: np.random.Generator, t0: float, t1: float) -> RequestTable:
        tables = [RequestTable.empty()]
        for b in self.bursts:
            lo, hi = max(t0, b.start), min(t1, b.end)
            if hi <= lo:
                continue
            rate = lambda t, m=b.mult: (m - 1.0) * self.base_rate(t) / self.shape.mean_requests
            starts = poisson_times(rng, rate, lo, hi)
            users = self.population.draw(rng, len(starts))
            new = rng.random(len(starts)) < self.new_share
            users[new] = self.next_user + np.arange(int(new.sum()))
            self.next_user += int(new.sum())
            tables.append(expand_sessions(rng, starts, users, self.shape, burst=True))
        return RequestTable.concat(tables)
