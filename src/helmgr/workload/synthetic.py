"""The synthetic generator (SPEC 3): the embedded default workload, in three regimes.

- steady: stationary session arrivals and popularity;
- trend:  popularity drift (the items behind each rank rotate, so the hot set turns over) and a
          slow ramp of traffic;
- burst:  steady traffic plus spikes of x3-x5 for seconds to tens of seconds, made of mostly new
          sessions (cold KV) whose candidates lean on a trending item set.
Regimes combine with '+', e.g. `trend+burst`.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from helmgr.core.errors import HelmInputError
from helmgr.core.validate import NON_NEGATIVE, POSITIVE, Range, number
from helmgr.core.validate import seed as seed_check
from helmgr.workload.arrivals import BurstSource, Population, SessionShape, SessionSource, burst_schedule
from helmgr.workload.candidates import SyntheticCandidates
from helmgr.workload.history import SyntheticHistory
from helmgr.workload.popularity import ItemSpace
from helmgr.workload.stream import Trending, Workload
from helmgr.workload.users import SyntheticUsers

REGIMES = ("steady", "trend", "burst")


def parse_regime(name: str) -> frozenset[str]:
    """'steady' -> {}, 'trend+burst' -> {'trend', 'burst'}; anything else is a named error."""
    parts = [p.strip() for p in name.split("+")]
    if not name or any(p not in REGIMES for p in parts) or ("steady" in parts and len(parts) > 1):
        raise HelmInputError(f"unknown workload {name!r} (known: {', '.join(REGIMES)}, or trend+burst)")
    return frozenset(p for p in parts if p != "steady")


@dataclass(frozen=True, slots=True)
class SyntheticConfig:
    """Knobs of the synthetic generator. Defaults describe the default scenario (docs/workloads.md)."""

    regime: str = "steady"
    duration_s: float = 120.0
    rps: float = 2400.0                  # base request rate, whole cluster (docs/tradeoff.md)
    n_users: int = 1_000_000
    n_items: int = 1_000_000
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
    session: SessionShape = SessionShape(mean_requests=12.0, think_s=3.0, new_tokens=4.0)
    drift_per_s: float = 30.0            # trend: item ranks rotated per second
    ramp: float = 0.5                    # trend: traffic grows by this share over the run
    burst_every_s: float = 40.0          # burst: mean gap between bursts
    burst_len_s: tuple[float, float] = (2.0, 6.0)
    burst_mult: tuple[float, float] = (3.0, 5.0)
    burst_new_share: float = 0.9         # burst: share of burst sessions from new users
    burst_session: SessionShape = SessionShape(mean_requests=1.0, think_s=1.0, new_tokens=4.0)
    trending: Trending = field(default_factory=Trending)

    def validate(self) -> "SyntheticConfig":
        """Every knob a finite number of its type and in range (core.validate), or a named error."""
        parse_regime(self.regime)
        for name, value in {"duration": self.duration_s, "rps": self.rps, "len-median": self.len_median,
                            "think-s": self.session.think_s, "burst-every-s": self.burst_every_s}.items():
            number(name, value, POSITIVE)
        for name, value in {"users": self.n_users, "items": self.n_items, "clusters": self.n_clusters,
                            "candidates": self.candidates, "len-cap": self.len_cap}.items():
            number(name, value, Range(1), integer=True)
        for name in ("head_exponent", "tail_exponent", "activity_exponent", "len_sigma", "drift_per_s", "ramp"):
            number(name, getattr(self, name), NON_NEGATIVE)
        for name in ("cand_head_share", "hist_head_share", "burst_new_share"):
            number(name, getattr(self, name), Range(0.0, 1.0))
        if self.n_items < self.n_clusters:
            raise HelmInputError(f"items ({self.n_items}) must be at least clusters ({self.n_clusters})")
        return self


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
    ramp = cfg.ramp if "trend" in overlays else 0.0
    rate = lambda t: cfg.rps * (1.0 + ramp * np.asarray(t) / cfg.duration_s)
    population = Population(cfg.n_users, cfg.activity_exponent)
    spinup = 5.0 * cfg.session.mean_requests * cfg.session.think_s
    sources = [SessionSource(rate, cfg.session, population, spinup)]
    bursts = []
    if "burst" in overlays:
        bursts = burst_schedule(np.random.default_rng([seed, 2]), cfg.duration_s, cfg.burst_every_s,
                                cfg.burst_len_s, cfg.burst_mult, cfg.n_items)
        sources.append(BurstSource(bursts, rate, cfg.burst_session, population, cfg.burst_new_share, cfg.n_users))
    return Workload(
        name=cfg.regime, duration_s=cfg.duration_s, seed=seed, space=space, users=users, history=history,
        candidates=candidates, sources=sources, bursts=bursts, trending=cfg.trending,
        drift_per_s=cfg.drift_per_s if "trend" in overlays else 0.0,
        prior=space.prior(cfg.cand_head_share, cfg.head_exponent, cfg.tail_exponent),
    )


def default_config(regime: str = "steady", **overrides) -> SyntheticConfig:
    return replace(SyntheticConfig(regime=regime), **overrides)
