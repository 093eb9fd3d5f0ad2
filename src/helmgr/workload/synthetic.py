"""The synthetic generator: the embedded default workload, in three regimes.

- steady: stationary session arrivals and popularity;
- trend:  a compressed day whose traffic mix moves: the share of discovery traffic (new,
          short-lived sessions on a rising trending set) alternates between a low `feed` plateau
          and a high `discovery` one, while the total rate follows a diurnal curve;
- burst:  steady traffic plus trending events of x1.5-x3 for 20-90 s, made of mostly new
          sessions (cold KV) whose candidates lean on the event's trending set;
Regimes combine with '+', e.g. `trend+burst`. `default_config(regime)` gives the default
scenario's settings for a regime (trend runs its day at its own base rate).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from helmgr.core.errors import HelmInputError
from helmgr.core.validate import NON_NEGATIVE, POSITIVE, Range, number
from helmgr.core.validate import seed as seed_check
from helmgr.workload.arrivals import (BurstSource, NewUsers, Population, SessionShape, SessionSource, ShapedSource,
                                      burst_schedule)
from helmgr.workload.candidates import SyntheticCandidates
from helmgr.workload.history import SyntheticHistory
from helmgr.workload.phases import Plateaus, carve, whole
from helmgr.workload.popularity import ItemSpace
from helmgr.workload.stream import TrendEvent, Trending, Workload, burst_events
from helmgr.workload.users import SyntheticUsers

REGIMES = ("steady", "trend", "burst")


def parse_regime(name: str) -> frozenset[str]:
    """'steady' -> {}, 'trend+burst' -> {'trend', 'burst'}; anything else is a named error."""
    parts = [p.strip() for p in name.split("+")]
    if not name or any(p not in REGIMES for p in parts) or ("steady" in parts and len(parts) > 1):
        raise HelmInputError(f"unknown workload {name!r} (known: {', '.join(REGIMES)}, "
                             "or a combination such as trend+burst)")
    if len(set(parts)) < len(parts):
        raise HelmInputError(f"workload {name!r} names a regime twice")
    return frozenset(p for p in parts if p != "steady")


@dataclass(frozen=True, slots=True)
class SyntheticConfig:
    """Knobs of the synthetic generator. Defaults describe the default scenario's steady and burst
    regimes; `default_config("trend")` sets trend's rate and phases (docs/workloads.md)."""

    regime: str = "steady"
    duration_s: float = 360.0            # several trend phases or bursts
    rps: float = 1300.0                  # base request rate, whole cluster (docs/tradeoff.md)
    n_users: int = 1_000_000
    n_items: int = 2_000_000             # a 122-GiB table of the large model's rows: twice an A100's pool
    n_clusters: int = 64                 # interest clusters; each owns n_items / n_clusters items
    candidates: int = 512                # candidates per request
    head_exponent: float = 0.9           # Zipf exponent of global popularity
    tail_exponent: float = 0.6           # Zipf exponent inside a cluster's items
    cand_head_share: float = 0.8         # share of candidates from the global head
    hist_head_share: float = 0.2         # share of history positions from the global head
    activity_exponent: float = 0.3       # Zipf exponent of user activity: mild, no user sends a session a second
    len_median: float = 1000.0           # history length: lognormal median ...
    len_sigma: float = 0.7               # ... and sigma
    len_cap: int = 8192                  # ... capped at the model's max sequence length
    session: SessionShape = SessionShape(mean_requests=12.0, think_s=3.0, new_tokens=4.0)   # feed sessions
    # trend: plateaus of the discovery share of the request rate, and a diurnal total rate
    trend_phase_s: float = 60.0          # each phase (feed, discovery, feed, ...), its leading ramp included
    trend_ramp_s: float = 10.0           # linear ramp from the previous phase's share
    trend_feed_share: float = 0.05       # discovery share in feed phases
    trend_discovery_share: float = 0.6   # discovery share in discovery phases
    diurnal: float = 0.4                 # rate x (1 + diurnal x sin(2 pi t / day - pi / 2)): trough at 0, peak mid-day
    day_s: float | None = None           # None: the run is one day
    trend_drift_per_s: float = 0.0       # trend: item ranks rotated per second (popularity drift)
    discovery_session: SessionShape = SessionShape(mean_requests=1.5, think_s=2.0, new_tokens=4.0)
    discovery_new_share: float = 0.9     # share of discovery sessions from new users (cold KV)
    discovery_trend_share: tuple[float, float] = (0.2, 0.5)   # candidates from the phase's trending set, start -> end
    # burst: trending events
    burst_every_s: float = 100.0         # mean gap between bursts (x U(0.5, 1.5))
    burst_first_s: tuple[float, float] | None = (30.0, 60.0)  # the first burst's start; None: a gap like the others
    burst_len_s: tuple[float, float] = (20.0, 90.0)
    burst_mult: tuple[float, float] = (1.5, 3.0)
    burst_ramp_s: float = 0.0            # a burst's extra rate rises linearly over this many seconds (0: a step)
    burst_new_share: float = 0.9         # burst: share of burst sessions from new users
    burst_session: SessionShape = SessionShape(mean_requests=1.0, think_s=1.0, new_tokens=4.0)
    trending: Trending = field(default_factory=Trending)

    @property
    def day(self) -> float:
        return self.duration_s if self.day_s is None else self.day_s

    def compressed(self, factor: float) -> "SyntheticConfig":
        """The same regime `factor` times shorter: the run, trend's phases, ramps and day, the bursts'
        starts, gaps, lengths and ramps all divided by `factor` (sessions and rates unchanged), so a
        short run keeps the whole shape of the long one instead of its first stretch."""
        number("time-compression", factor, POSITIVE)
        return replace(self, duration_s=self.duration_s / factor, trend_phase_s=self.trend_phase_s / factor,
                       trend_ramp_s=self.trend_ramp_s / factor, day_s=None if self.day_s is None else self.day_s / factor,
                       burst_every_s=self.burst_every_s / factor, burst_len_s=_div(self.burst_len_s, factor),
                       burst_first_s=None if self.burst_first_s is None else _div(self.burst_first_s, factor),
                       burst_ramp_s=self.burst_ramp_s / factor)

    def validate(self) -> "SyntheticConfig":
        """Every knob a finite number of its type and in range (core.validate), or a named error."""
        parse_regime(self.regime)
        for name, value in {"duration": self.duration_s, "rps": self.rps, "len-median": self.len_median,
                            "think-s": self.session.think_s, "burst-every-s": self.burst_every_s,
                            "trend-phase-s": self.trend_phase_s,
                            "discovery-think-s": self.discovery_session.think_s, "day-s": self.day}.items():
            number(name, value, POSITIVE)
        for name, value in {"users": self.n_users, "items": self.n_items, "clusters": self.n_clusters,
                            "candidates": self.candidates, "len-cap": self.len_cap}.items():
            number(name, value, Range(1), integer=True)
        for name in ("head_exponent", "tail_exponent", "activity_exponent", "len_sigma", "trend_drift_per_s",
                     "burst_ramp_s"):
            number(name, getattr(self, name), NON_NEGATIVE)
        number("trend_ramp_s", self.trend_ramp_s, Range(0.0, self.trend_phase_s))
        for name in ("cand_head_share", "hist_head_share", "burst_new_share", "trend_feed_share",
                     "trend_discovery_share", "diurnal", "discovery_new_share"):
            number(name, getattr(self, name), Range(0.0, 1.0))
        for name in ("session", "discovery_session", "burst_session"):
            number(f"{name}.mean_requests", getattr(self, name).mean_requests, Range(1.0))
        self._ranges()
        if self.n_items < self.n_clusters:
            raise HelmInputError(f"items ({self.n_items}) must be at least clusters ({self.n_clusters})")
        return self

    def _ranges(self) -> None:
        pairs = {"burst_len_s": (self.burst_len_s, POSITIVE), "burst_mult": (self.burst_mult, Range(1.0)),
                 "discovery_trend_share": (self.discovery_trend_share, Range(0.0, 1.0))}
        if self.burst_first_s is not None:
            pairs["burst_first_s"] = (self.burst_first_s, NON_NEGATIVE)
        for name, ((lo, hi), allowed) in pairs.items():
            number(f"{name}[0]", lo, allowed)
            number(f"{name}[1]", hi, allowed)
            if lo > hi:
                raise HelmInputError(f"{name} ({lo:g}, {hi:g}): the low end is above the high end")


def _div(pair: tuple[float, float], factor: float) -> tuple[float, float]:
    return pair[0] / factor, pair[1] / factor


def _rate(cfg: SyntheticConfig, overlays: frozenset[str]):
    """The total request rate of the regular traffic, per second, at times t."""
    if "trend" in overlays:
        return lambda t: cfg.rps * (1.0 + cfg.diurnal * np.sin(2.0 * np.pi * np.asarray(t) / cfg.day - np.pi / 2))
    return lambda t: cfg.rps + 0.0 * np.asarray(t)          # constant, shaped like t


def _spinup(shape: SessionShape) -> float:
    return 5.0 * shape.mean_requests * shape.think_s


def _trend(cfg: SyntheticConfig, rate, population: Population, new_users: NewUsers, seed: int):
    """Trend's sources (feed and discovery), its phases, and a trending event per phase."""
    mix = Plateaus(cfg.trend_phase_s, cfg.trend_ramp_s, (cfg.trend_feed_share, cfg.trend_discovery_share))
    lo, hi = min(mix.levels), max(mix.levels)
    feed_keep = (lambda t: (1.0 - mix.level(t)) / (1.0 - lo)) if lo < 1.0 else (lambda t: np.ones(np.shape(t)))
    disc_keep = (lambda t: mix.level(t) / hi) if hi > 0.0 else (lambda t: np.ones(np.shape(t)))
    sources = [
        ShapedSource(lambda t: (1.0 - lo) * rate(t), feed_keep, cfg.session, population, _spinup(cfg.session),
                     new_users, 0.0),
        ShapedSource(lambda t: hi * rate(t), disc_keep, cfg.discovery_session, population,
                     _spinup(cfg.discovery_session), new_users, cfg.discovery_new_share, lean="discovery"),
    ]
    phases = mix.phases(cfg.duration_s)
    firsts = np.random.default_rng([seed, 3]).integers(0, cfg.n_items, len(phases))
    events = [TrendEvent(p.start, p.end, int(first), "discovery", cfg.discovery_trend_share)
              for p, first in zip(phases, firsts)]
    return sources, phases, events



def synthetic_workload(config: SyntheticConfig = SyntheticConfig(), seed: int = 0) -> Workload:
    cfg = config.validate()
    seed_check("seed", seed)
    overlays = parse_regime(cfg.regime)
    rng = np.random.default_rng([seed, 1])
    space = ItemSpace(cfg.n_items, cfg.n_clusters)
    users = SyntheticUsers(cfg.n_clusters, cfg.len_median, cfg.len_sigma, cfg.len_cap, seed)
    history = SyntheticHistory(rng, space, users, cfg.hist_head_share, cfg.head_exponent, cfg.tail_exponent)
    candidates = SyntheticCandidates(rng, space, cfg.candidates, cfg.cand_head_share, cfg.head_exponent,
                                     cfg.tail_exponent)
    rate = _rate(cfg, overlays)
    population = Population(cfg.n_users, cfg.activity_exponent)
    new_users = NewUsers(cfg.n_users)
    if "trend" in overlays:
        sources, phases, events = _trend(cfg, rate, population, new_users, seed)
    else:
        sources = [SessionSource(rate, cfg.session, population, _spinup(cfg.session))]
        phases, events = whole(cfg.duration_s), []
    bursts = []
    if "burst" in overlays:
        bursts = burst_schedule(np.random.default_rng([seed, 2]), cfg.duration_s, n_items=cfg.n_items,
                                every_s=cfg.burst_every_s, len_s=cfg.burst_len_s, mult=cfg.burst_mult,
                                first_s=cfg.burst_first_s, clip=True)
        sources.append(BurstSource(bursts, rate, cfg.burst_session, population, cfg.burst_new_share, cfg.n_users,
                                   new_users, ramp_s=cfg.burst_ramp_s))
    drift = cfg.trend_drift_per_s if "trend" in overlays else 0.0
    return Workload(
        name=cfg.regime, duration_s=cfg.duration_s, seed=seed, space=space, users=users, history=history,
        candidates=candidates, sources=sources, bursts=bursts, trending=cfg.trending, drift_per_s=drift,
        prior=space.prior(cfg.cand_head_share, cfg.head_exponent, cfg.tail_exponent),
        events=burst_events(bursts, cfg.trending.share) + events,
        phases=carve(phases, [(b.start, b.end) for b in bursts]),
    )


TREND_RPS = 2200.0        # trend's base rate (its day peaks at 1.4x), whole cluster
TREND_PHASE_S = 120.0     # trend: feed, discovery, feed


def default_config(regime: str = "steady", **overrides) -> SyntheticConfig:
    """The default scenario's settings for `regime`, with `overrides` (SyntheticConfig fields) on
    top: the operating point of docs/tradeoff.md, where trend's day runs at its own base rate."""
    trend = "trend" in {p.strip() for p in regime.split("+")}
    base = {"rps": TREND_RPS, "trend_phase_s": TREND_PHASE_S} if trend else {}
    return SyntheticConfig(regime=regime, **(base | overrides))
