"""Every policy (and router) on one workload and seed, side by side: static-best from a sweep of
the same run, the oracle's r*, and each policy's distance from it."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from helmgr.experiments.oracle import run_oracle
from helmgr.experiments.parallel import run_all
from helmgr.experiments.sweep import held_r_star, run_point, static_best, sweep_tasks
from helmgr.policy import POLICIES
from helmgr.sim import SimConfig, simulate
from helmgr.sim.metrics import Series, oracle_distance
from helmgr.workload import WorkloadSpec

ALL = ("static", "static-best", "independent", "adaptive", "latency-driven", "oracle")

# track(label, total) -> advance(k): a progress bar's task; advance moves it k steps
Track = Callable[[str, int], Callable[[int], None]]


@dataclass
class Comparison:
    rows: list[dict]
    timelines: dict                     # (policy, router) -> Series, None for static-best
    r_star: np.ndarray | None = None
    held_r_star: np.ndarray | None = None


def _run(args: tuple[WorkloadSpec, SimConfig]) -> tuple[dict, Series]:
    spec, cfg = args
    r = simulate(cfg, spec.build())
    return r.summary, r.series


def _one(args: tuple[bool, WorkloadSpec, SimConfig]):
    """A policy run (summary, series), or with the flag set a sweep point (`run_point`)."""
    point, spec, cfg = args
    return run_point((spec, cfg)) if point else _run((spec, cfg))


def _quiet(label: str, total: int) -> Callable[[int], None]:
    return lambda k=1: None


def compare(spec: WorkloadSpec, cfgs: dict[str, SimConfig], names: list[str], grid: list[float], jobs: int = 1,
            track: Track = _quiet, ray_address: str | None = None) -> Comparison:
    """Run `names` (policies, plus "static-best" and "oracle") under each router of `cfgs`: the
    policy runs and the static-best sweeps in one batch of independent runs (experiments.parallel:
    `jobs` processes, or Ray at `ray_address`), then the oracle, whose windows run in order."""
    out = Comparison([], {})
    pairs = [(rt, n) for rt in cfgs for n in names if n in POLICIES]      # every router x policy
    tasks = [(False, spec, replace(cfgs[rt], policy=n)) for rt, n in pairs]
    labels = [f"{n} ({rt})" for rt, n in pairs]
    advance = track(f"{spec.regime if spec.trace is None else 'trace'}: {len(pairs)} runs", len(pairs))
    bars = [advance] * len(pairs)
    swept = list(cfgs) if "static-best" in names else []
    for rt in swept:
        points, point_names = sweep_tasks(spec, cfgs[rt], grid)
        tasks += [(True, s, c) for s, c in points]
        labels += point_names
        bars += [track(f"{rt}: static-best", len(grid))] * len(grid)
    results = run_all(_one, tasks, jobs, ray_address, labels, lambda i: bars[i](1))
    for (rt, n), (summary, series) in zip(pairs, results):
        out.rows.append(summary)
        out.timelines[(n, rt)] = series
    for rt, cfg in cfgs.items():                          # per router: static-best, then the oracle
        if rt in swept:
            k = len(pairs) + swept.index(rt) * len(grid)
            rows = results[k:k + len(grid)]
            out.held_r_star = held_r_star(rows, grid)
            out.rows.append(static_best([{key: v for key, v in r.items() if key != "window_p99_ms"} for r in rows]))
            out.timelines[("static-best", rt)] = None
        if "oracle" in names:
            _oracle(out, spec, cfg, grid, jobs, track, ray_address)
    add_distances(out)
    return out


def _oracle(out: Comparison, spec: WorkloadSpec, cfg: SimConfig, grid, jobs: int, track: Track,
            ray_address: str | None) -> None:
    w = spec.build()
    step = track(f"{cfg.router}: oracle", int(-(-w.duration_s // 1)))
    seen = [0]

    def windows_done(k: int) -> None:
        step(k - seen[0])
        seen[0] = k
    o = run_oracle(cfg, w, grid, jobs, on_progress=windows_done, ray_address=ray_address)
    out.rows.append(o.summary)
    out.timelines[("oracle", cfg.router)] = o.series
    out.r_star = o.r_star


def add_distances(c: Comparison) -> None:
    """Each row's mean |r - r*| (`oracle_distance`) and |r - held r*| (`held_oracle_distance`)."""
    for key, ref in (("oracle_distance", c.r_star), ("held_oracle_distance", c.held_r_star)):
        if ref is None:
            continue
        for row in c.rows:
            series = c.timelines.get((row["policy"], row["router"]))
            if series is None:                           # static-best: one ratio held throughout
                row[key] = float(np.abs(row["ratio"] - ref).mean())
            elif not (key == "oracle_distance" and row["policy"] == "oracle"):
                row[key] = oracle_distance(series.timeline, row["nodes"], row["duration_s"], ref)
