"""The phase oracle: the offline-optimal ratio r* per block of the run.

Blocks are the workload's phases (each burst, each stretch between bursts, each trend phase; a
trace's 10-s blocks), each cut into equal blocks of at most `block_s` (10 s by default, so a
steady run has blocks too; `block_s=None` keeps the phases whole). For each block in time order
the real cluster is forked at the block's start, and every grid ratio replays the block from
there: every up node set to that ratio, the block's arrivals fed, run until they are all served
(later arrivals could not have delayed them: queues and the link are FIFO). The block's P99 per
ratio is smoothed by `block_fit.fit_block` (a convex fit of log P99 by default), whose argmin
(continuous, inside the grid's range) is r*_block. The real cluster then runs the block at
r*_block with real transitions (a resize at the block's start, refill as configured): the
*stitched* run, whose summary is the oracle's. The first block's replays, and the stitched run,
start from a cluster built at their ratio, as a static run does (no resize from `cfg.ratio` at
t=0). r* is one ratio for the whole cluster; a per-node policy is compared by the mean of its
nodes' ratios (`metrics.window_ratios`).
"""
from __future__ import annotations

import dataclasses
import time
from collections import deque
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from helmgr.core.profiles import NodeProfile, node_profile
from helmgr.core.errors import HelmInputError
from helmgr.experiments.block_fit import FITS, BlockFit, fit_block
from helmgr.experiments.parallel import run_all
from helmgr.policy.base import Static
from helmgr.routing.routers import make_router
from helmgr.sim.cluster import Cluster
from helmgr.sim.config import SimConfig
from helmgr.sim.metrics import Series, summarize, window_ratios
from helmgr.workload import Phase, Workload
from helmgr.workload.chunk import RequestChunk

BLOCK_S = 10.0
LOOKAHEAD_S = 30.0      # each block's ratio is judged by its requests and those of the next 30 s (a bound:
                        # judged alone, a block's best split was beaten by causal policies on 5 of 6 runs)
REACT_S = 20.0          # in-phase figures leave out the first 20 s after a phase change (a causal policy's
                        # time to see it)


@dataclass(frozen=True)
class PhaseOracleResult:
    summary: dict
    series: Series
    blocks: tuple[Phase, ...]
    fits: tuple[BlockFit, ...]       # per block
    grid: np.ndarray
    grid_p99: np.ndarray             # blocks x grid: each replay's P99 (s), inf for an empty block
    cluster: Cluster
    lookahead_s: float = LOOKAHEAD_S

    @property
    def r_star(self) -> np.ndarray:
        """Per block."""
        return np.array([f.r_star for f in self.fits])

    def per_window(self, window_s: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(r*, band low, band high) of each window: those of the block holding its middle."""
        return block_windows([b.start for b in self.blocks], self.blocks[-1].end, self.r_star,
                             [f.band_lo for f in self.fits], [f.band_hi for f in self.fits], window_s)

    def in_phase(self, window_s: float = 1.0, react_s: float = REACT_S) -> np.ndarray:
        """Per window: whether the block holding its middle was judged within its own phase kind
        and starts at least `react_s` after a phase change (`horizon_in_phase`)."""
        return spread([b.start for b in self.blocks], self.blocks[-1].end,
                      horizon_in_phase(self.blocks, self.lookahead_s, react_s), window_s)

    def block_table(self) -> list[dict]:
        """Per block, JSON-safe: its span and kind, r*, band and fit, each ratio's P99 (ms)."""
        return [{"start": b.start, "end": b.end, "kind": b.kind, **f.to_dict(), "p99_ms": (p * 1e3).tolist()}
                for b, f, p in zip(self.blocks, self.fits, self.grid_p99)]


def block_windows(starts, end: float, r_star, lo, hi,
                  window_s: float = 1.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-block r*, band low and band high (blocks starting at `starts`, the last ending at
    `end`) spread over windows of `window_s` (`spread`)."""
    return tuple(spread(starts, end, np.asarray(v, float), window_s) for v in (r_star, lo, hi))


def spread(starts, end: float, values, window_s: float = 1.0) -> np.ndarray:
    """Per-block `values` (blocks starting at `starts`, the last ending at `end`) over windows of
    `window_s`: each window takes the block holding its middle."""
    n_win = max(1, int(np.ceil(end / window_s - 1e-9)))
    mid = (np.arange(n_win) + 0.5) * window_s
    k = np.clip(np.searchsorted(np.asarray(starts, float), mid, side="right") - 1, 0, len(starts) - 1)
    return np.asarray(values)[k]


def replay_p99(cluster: Cluster, chunks, ratio: float, window_start: float) -> float:
    """P99 (s) of the requests of `chunks` (a sequence, fed in order) when they run at `ratio`
    from `cluster`'s state; inf if they are none."""
    c = cluster.fork()
    for i in range(len(c.nodes)):
        if c.up[i]:
            c.set_ratio(i, ratio)
    c.watch()
    for chunk in chunks:
        c.feed(chunk)
    c.run_until_served()
    arrival = np.asarray(c.rec.arrival)
    latency = np.asarray(c.rec.end) - arrival
    mine = latency[arrival >= window_start]
    return float(np.percentile(mine, 99)) if len(mine) else float("inf")


def oracle_blocks(phases: Sequence[Phase], block_s: float | None = BLOCK_S) -> tuple[Phase, ...]:
    """`phases`, each cut into the fewest equal blocks of at most `block_s` (None: kept whole)."""
    if block_s is None:
        return tuple(phases)
    out = []
    for p in phases:
        n = max(1, int(np.ceil((p.end - p.start) / block_s - 1e-9)))
        edges = np.linspace(p.start, p.end, n + 1)
        out += [Phase(float(a), float(b), p.kind) for a, b in zip(edges[:-1], edges[1:])]
    return tuple(out)


def block_arrivals(workload: Workload, blocks: Sequence[Phase]) -> Iterator[list[RequestChunk]]:
    """Per block, its arrivals: the workload's 1-s chunks (the stream every run sees), cut at the
    blocks' ends."""
    chunks = workload.chunks(1.0)
    rest = None
    for b in blocks:
        pieces = []
        while True:
            rest = next(chunks, None) if rest is None else rest
            if rest is None:
                break
            cut = int(np.searchsorted(rest.t, b.end, side="left"))
            if cut:
                pieces.append(rest.rows(0, cut) if cut < len(rest) else rest)
            if cut < len(rest):
                rest = rest.rows(cut, len(rest))
                break
            rest = None
        yield pieces


@dataclass(frozen=True)
class Start:
    """The run before it starts: the first block's replays start from a cluster built at their
    ratio, as a static run is, and so does the stitched run (no resize from `cfg.ratio` at t=0)."""

    cfg: SimConfig
    workload: Workload
    profile: NodeProfile

    def build(self, ratio: float) -> Cluster:
        cfg = dataclasses.replace(self.cfg, ratio=float(ratio))
        cluster = Cluster(cfg, self.workload, self.profile, make_router(cfg.router), Static())
        cluster.begin()
        return cluster


def _replay(state: tuple, ratio: float) -> float:
    origin, pieces, start = state
    cluster = origin.build(ratio) if isinstance(origin, Start) else origin
    return replay_p99(cluster, pieces, ratio, start)


def block_p99(origin: Cluster | Start, pieces: list, block: Phase, grid, jobs: int = 1,
              ray_address: str | None = None) -> np.ndarray:
    """The block's P99 (s) at every grid ratio, replayed from `origin` (inf: no arrivals)."""
    if not pieces:
        return np.full(len(grid), np.inf)
    names = [f"oracle block {block.start:g}-{block.end:g} s ratio {r:g}" for r in grid]
    return np.asarray(run_all(_replay, grid, jobs, ray_address, names, shared=(origin, pieces, block.start)))


def run_phase_oracle(cfg: SimConfig, workload: Workload, grid: list[float], jobs: int = 1,
                     block_s: float | None = BLOCK_S, on_progress=None, ray_address: str | None = None,
                     fit: str = "convex", lookahead_s: float = LOOKAHEAD_S) -> PhaseOracleResult:
    """The stitched run; each block's replays are independent runs (experiments.parallel: `jobs`
    processes forked from the block's state, or Ray at `ray_address`). `on_progress(k)`: k blocks done.

    Each replay runs on through the following blocks that end within `lookahead_s` of the block's
    end, and the ratio is judged by the P99 of all their requests (only the block itself is then
    run at r*): a choice whose transition costs this block but pays off after it is not refused.
    Judged alone (`lookahead_s` 0), a block's best split was beaten by causal policies on 5 of 6
    burst and trend runs: it was not a bound (docs/results/2026-12-05-oracle-lookahead.md)."""
    cfg = cfg.validate(workload.duration_s)
    if fit not in FITS:
        raise HelmInputError(f"unknown oracle fit {fit!r} (known: {', '.join(FITS)})")
    if not (lookahead_s >= 0 and np.isfinite(lookahead_s)):
        raise HelmInputError(f"oracle lookahead {lookahead_s!r} s must be a finite number >= 0")
    start = Start(cfg, workload, node_profile(cfg.hardware, cfg.model))
    wall = time.perf_counter()
    blocks = oracle_blocks(workload.phases, block_s)
    cluster, fits, table, current = None, [], [], cfg.ratio
    for k, (b, pieces, horizon) in enumerate(_with_horizon(blocks, block_arrivals(workload, blocks), lookahead_s)):
        if cluster is not None:
            cluster.advance(b.start)
        p99 = block_p99(start if cluster is None else cluster, horizon, b, grid, jobs, ray_address)
        fits.append(fit_block(grid, p99, current, fit))
        table.append(p99)
        current = fits[-1].r_star
        if cluster is None:
            cluster = start.build(current)
        for i in range(len(cluster.nodes)):
            if cluster.up[i]:
                cluster.set_ratio(i, current)
        for piece in pieces:
            cluster.feed(piece)
        if on_progress:
            on_progress(k + 1)
    cluster.finish()
    return _result(start, cluster, blocks, fits, grid, table, time.perf_counter() - wall, block_s, fit,
                   float(lookahead_s))


def horizon_last(blocks: Sequence[Phase], k: int, lookahead_s: float) -> int:
    """The last block of block k's horizon: the following blocks that end within `lookahead_s` of
    its end belong to it."""
    last = k
    while last + 1 < len(blocks) and blocks[last + 1].end <= blocks[k].end + lookahead_s + 1e-9:
        last += 1
    return last


def horizon_in_phase(blocks: Sequence[Phase], lookahead_s: float, react_s: float = REACT_S) -> np.ndarray:
    """Per block: whether its horizon stays in blocks of its own kind, and it starts at least
    `react_s` after a change of kind. Where the horizon leaves its kind, the oracle chose r* for
    arrivals of the next phase (a burst, trend's other plateau), a change a causal policy cannot
    see coming; in the first `react_s` after a change, a causal policy is still seeing it come."""
    kinds = [b.kind for b in blocks]
    changes = [b.start for b, a in zip(blocks[1:], blocks) if b.kind != a.kind]
    return np.array([all(kinds[j] == kinds[k] for j in range(k, horizon_last(blocks, k, lookahead_s) + 1))
                     and not any(c <= blocks[k].start < c + react_s for c in changes)
                     for k in range(len(blocks))], bool)


def _with_horizon(blocks, arrivals, lookahead_s: float):
    """(block, its arrivals, the arrivals of it and of the blocks of its horizon), in order; the
    stream is read at most that far ahead."""
    ahead: deque = deque()
    arrivals = iter(arrivals)
    for k, b in enumerate(blocks):
        last = horizon_last(blocks, k, lookahead_s)
        while len(ahead) < last - k + 1:
            ahead.append(next(arrivals))
        yield b, ahead[0], [p for pieces in list(ahead)[:last - k + 1] for p in pieces]
        ahead.popleft()


def _result(start: Start, cluster: Cluster, blocks, fits, grid, table, wall: float, block_s, fit: str,
            lookahead_s: float):
    cfg, workload, profile = start.cfg, start.workload, start.profile
    slo_s = (cfg.slo_ms if cfg.slo_ms is not None else profile.model.slo_ms) * 1e-3
    summary, series = summarize(cluster.rec, cluster.nodes + cluster.retired, workload.duration_s, slo_s,
                                cfg.window_s, workload.bursts, wall, cluster.rerouted,
                                cfg.metrics_warmup_s(workload.duration_s))
    head = {"workload": workload.name, "nodes": cfg.nodes, "policy": "oracle", "router": cfg.router,
            "ratio": fits[0].r_star, "seed": cfg.seed, "hardware": cfg.hardware, "model": cfg.model,
            "duration_s": workload.duration_s, "oracle_grid": [float(r) for r in grid], "oracle_block_s": block_s,
            "oracle_blocks": len(blocks), "oracle_fit": fit, "oracle_lookahead_s": lookahead_s}
    result = PhaseOracleResult(head | summary, series, blocks, tuple(fits), np.asarray(grid, float),
                               np.asarray(table), cluster, lookahead_s)
    result.summary.update(figures(series.timeline, cfg.nodes, workload.duration_s, result, summary["p99_ms"]))
    return result


# -- per-policy figures against the phase oracle ------------------------------------------------
def oracle_distance(timeline, n_nodes: int, duration: float, oracle: PhaseOracleResult,
                    window_s: float = 1.0) -> float:
    """Mean over windows of |r - r*_block|, r the mean of the up nodes' ratios."""
    return window_figures(window_ratios(timeline, n_nodes, duration, window_s), *oracle.per_window(window_s))[0]


def band_distance(timeline, n_nodes: int, duration: float, oracle: PhaseOracleResult,
                  window_s: float = 1.0) -> float:
    """Mean over windows of the distance from r to its block's band (0 inside it)."""
    return window_figures(window_ratios(timeline, n_nodes, duration, window_s), *oracle.per_window(window_s))[1]


def window_figures(r, star, lo, hi) -> tuple[float, float]:
    """(mean |r - r*|, mean distance from r to the band [lo, hi]) over the windows both cover."""
    n = min(len(r), len(star))
    r, star, lo, hi = (np.asarray(x, float)[:n] for x in (r, star, lo, hi))
    return float(np.nanmean(np.abs(r - star))), float(np.nanmean(_outside(r, lo, hi)))


def _outside(r, lo, hi) -> np.ndarray:
    """How far each r lies outside its band [lo, hi] (0 inside)."""
    return np.maximum(np.maximum(lo - r, r - hi), 0.0)


def in_phase_band_distance(r, lo, hi, keep) -> float | None:
    """Mean distance from r to the band over the windows `keep` marks (`PhaseOracleResult.in_phase`):
    the band distance a causal policy can be held to. None where no window is kept."""
    n = min(len(r), len(lo), len(keep))
    keep = np.asarray(keep, bool)[:n]
    if not keep.any():
        return None
    r, lo, hi = (np.asarray(x, float)[:n][keep] for x in (r, lo, hi))
    return float(np.nanmean(_outside(r, lo, hi)))


def band_overlap(bands) -> list[float] | None:
    """[low, high] of the splits inside every (low, high) band of `bands`, or None when they share none."""
    lo, hi = max(b[0] for b in bands), min(b[1] for b in bands)
    return [float(lo), float(hi)] if lo <= hi + 1e-12 else None


def common_band(oracle: PhaseOracleResult, after_s: float) -> list[float] | None:
    """`band_overlap` of the blocks that end after `after_s` (the warm-up)."""
    kept = [f for b, f in zip(oracle.blocks, oracle.fits) if b.end > after_s] or list(oracle.fits)
    return band_overlap([(f.band_lo, f.band_hi) for f in kept])


def regret(p99_ms: float, oracle: PhaseOracleResult | float) -> float | None:
    """P99 / the oracle's P99 (its result, or its P99 in ms) - 1; None when either P99 is not a
    positive finite number."""
    ref = oracle if isinstance(oracle, (int, float)) else oracle.summary["p99_ms"]
    if not (ref is not None and np.isfinite(p99_ms) and np.isfinite(ref) and ref > 0):
        return None
    return float(p99_ms / ref - 1.0)


def figures(timeline, n_nodes: int, duration: float, oracle: PhaseOracleResult, p99_ms: float,
            window_s: float = 1.0, react_s: float = REACT_S) -> dict:
    """`oracle_distance`, `band_distance`, `band_distance_in_phase` (`PhaseOracleResult.in_phase`,
    with a reaction allowance of `react_s`) and `regret` of a run (its ratio timeline and P99)."""
    r = window_ratios(timeline, n_nodes, duration, window_s)
    star, lo, hi = oracle.per_window(window_s)
    dist, band = window_figures(r, star, lo, hi)
    return {"oracle_distance": dist, "band_distance": band,
            "band_distance_in_phase": in_phase_band_distance(r, lo, hi, oracle.in_phase(window_s, react_s)),
            "regret": regret(p99_ms, oracle)}


def held(ratio: float, n_nodes: int) -> list:
    """The timeline of a run that holds `ratio` on every node throughout (static-best's row)."""
    return [(0.0, i, float(ratio)) for i in range(n_nodes)]
