"""`oracle-greedy`, the first version's offline oracle (SPEC 5): for every window, the
cluster-wide EMB ratio that gives that window's requests the lowest P99, found in hindsight.
It chases noise (a window's P99 rests on a few dozen requests); the oracle of version 2 is the
phase oracle (experiments.phase_oracle), which shares `replay_p99` with it.

At the start of each 1-s window the cluster is forked once per ratio of a grid; each fork sets
every node to its ratio, takes the window's arrivals and runs until they have all completed
(later arrivals could not have delayed them: node queues and the H2D link are FIFO). The ratio
with the lowest P99 is r* for the window, and the real cluster then runs the window at r*, so
the oracle's trajectory is the sequence of hindsight-best choices. r* is one ratio for the whole
cluster; a per-node controller is compared by the mean of its nodes' ratios.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from helmgr.core.errors import HelmInputError
from helmgr.core.profiles import node_profile
from helmgr.experiments.parallel import run_all
from helmgr.sim.cluster import Cluster
from helmgr.sim.config import SimConfig
from helmgr.sim.metrics import Series, summarize
from helmgr.policy.policies import Static
from helmgr.routing.routers import make_router
from helmgr.workload import Workload

@dataclass(frozen=True)
class OracleResult:
    summary: dict
    series: Series
    r_star: np.ndarray       # per window
    grid: np.ndarray
    grid_p99: np.ndarray     # windows x grid: each replay's P99 (s), inf for an empty window
    cluster: Cluster


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


def _replay(state: tuple, ratio: float) -> float:
    cluster, chunk, start = state
    return replay_p99(cluster, [chunk], ratio, start)


def run_oracle(cfg: SimConfig, workload: Workload, grid: list[float], jobs: int = 1, on_progress=None,
               ray_address: str | None = None) -> OracleResult:
    """The oracle's run; each window's replays are independent runs (experiments.parallel: `jobs`
    processes, forked from the window's state, or Ray at `ray_address`)."""
    cfg = cfg.validate(workload.duration_s)
    if cfg.window_s != 1.0:
        raise HelmInputError(f"the oracle decides per 1-s window; got a {cfg.window_s}-s window")
    profile = node_profile(cfg.hardware, cfg.model)
    slo_s = (cfg.slo_ms if cfg.slo_ms is not None else profile.model.slo_ms) * 1e-3
    wall = time.perf_counter()
    cluster = Cluster(cfg, workload, profile, make_router(cfg.router), Static())
    cluster.begin()
    grid_arr = np.asarray(grid, float)
    r_star, table = [], []
    current = cfg.ratio
    for k, chunk in enumerate(workload.chunks(1.0)):
        cluster.advance(float(k))
        if len(chunk):
            names = [f"oracle window {k} ratio {r:g}" for r in grid]
            p99 = np.asarray(run_all(_replay, grid, jobs, ray_address, names, shared=(cluster, chunk, float(k))))
            best = float(np.min(p99))
            ties = np.flatnonzero(p99 == best)
            current = float(grid_arr[ties[np.argmin(np.abs(grid_arr[ties] - current))]])   # fewest moves
        else:
            p99 = np.full(len(grid), np.inf)
        for i in range(len(cluster.nodes)):
            if cluster.up[i]:
                cluster.set_ratio(i, current)
        cluster.feed(chunk)
        r_star.append(current)
        table.append(p99)
        if on_progress:
            on_progress(k + 1)
    cluster.finish()
    wall = time.perf_counter() - wall
    summary, series = summarize(cluster.rec, cluster.nodes + cluster.retired, workload.duration_s, slo_s,
                                cfg.window_s, workload.bursts, wall, cluster.rerouted,
                                cfg.metrics_warmup_s(workload.duration_s))
    head = {"workload": workload.name, "nodes": cfg.nodes, "policy": "oracle-greedy", "router": cfg.router,
            "ratio": cfg.ratio, "seed": cfg.seed, "hardware": cfg.hardware, "model": cfg.model,
            "duration_s": workload.duration_s, "oracle_grid": [float(r) for r in grid], "greedy_oracle_distance": 0.0}
    return OracleResult(head | summary, series, np.asarray(r_star), grid_arr, np.asarray(table), cluster)
