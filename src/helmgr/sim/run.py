"""One simulation run: build the cluster, run it, summarize it."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from helmgr.core.profiles import NodeProfile, node_profile
from helmgr.sim.class_metrics import class_figures
from helmgr.sim.cluster import Cluster
from helmgr.sim.config import SimConfig
from helmgr.sim.metrics import Series, summarize
from helmgr.sim.tenancy import band_shares
from helmgr.policy.base import MemoryPolicy
from helmgr.policy.policies import make_policy
from helmgr.routing.routers import Router, make_router
from helmgr.workload import Workload


class RunStopped(Exception):
    """A run ended early by its `stop` check; the message says why."""


@dataclass(frozen=True)
class SimResult:
    summary: dict
    series: Series
    cluster: Cluster


def simulate(cfg: SimConfig, workload: Workload, policy: MemoryPolicy | None = None,
             router: Router | None = None, on_progress=None, profile: NodeProfile | None = None,
             stop: Callable[[Cluster], str | None] | None = None, measure_from_s: float | None = None) -> SimResult:
    """Run `workload` through a cluster built from `cfg`. `policy`/`router` override the names in
    `cfg` (for policies that need arguments); `profile` the node profile its hardware and model
    name (for a profile built in code, e.g. a serving replica's). `stop(cluster)` is asked after
    every 1-s chunk; a reason it returns ends the run with RunStopped(reason). `measure_from_s`: the
    latency metrics skip arrivals before this instead (default: `cfg.metrics_warmup_s`; a held-out
    tail of a replay is measured this way, the rest of the run warming the caches)."""
    cfg = cfg.validate(workload.duration_s)
    model = cfg.model if profile is None else profile.model.name
    profile = profile or node_profile(cfg.hardware, cfg.model)
    slo_s = (cfg.slo_ms if cfg.slo_ms is not None else profile.model.slo_ms) * 1e-3
    wall = time.perf_counter()
    if stop is not None:
        report = on_progress

        def on_progress(t: float) -> None:
            if report:
                report(t)
            why = stop(cluster)
            if why:
                raise RunStopped(why)
    cluster = Cluster(cfg, workload, profile, router or make_router(cfg.router), policy or make_policy(cfg.policy),
                      on_progress)
    cluster.run()
    wall = time.perf_counter() - wall
    warmup_s = cfg.metrics_warmup_s(workload.duration_s) if measure_from_s is None else measure_from_s
    summary, series = summarize(cluster.rec, cluster.nodes + cluster.retired, workload.duration_s, slo_s,
                                cfg.window_s, workload.bursts, wall, cluster.rerouted, warmup_s)
    if cfg.classes is not None:
        summary |= class_figures(cluster.rec, cfg.classes, workload.duration_s, cfg.window_s, warmup_s,
                                 workload.bursts, band_shares(cluster))
        if cfg.tenancy == "pools":
            summary["pools"] = dict(zip(cfg.classes.class_names, cfg.classes.pool_sizes(cfg.nodes)))
    head = {"workload": workload.name, "nodes": cfg.nodes, "policy": cfg.policy if policy is None else policy.name,
            "router": cfg.router if router is None else router.name, "ratio": cfg.ratio, "seed": cfg.seed,
            "hardware": cfg.hardware, "model": model, "duration_s": workload.duration_s,
            "sim_path": cluster.path} | ({"sim_path_reason": cluster.path_reason} if cluster.path_reason else {}) | (
                {"class_table": cfg.classes.source, "tenancy": cfg.tenancy} if cfg.classes is not None else {}) | (
                {"emb_sample": cfg.emb_sample} if cfg.emb_sample > 1 else {})     # hit rates and P99 estimated
    return SimResult(head | summary | cluster.policy.report(), series, cluster)
