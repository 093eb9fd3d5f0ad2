"""Every policy (and router) on one workload and seed, side by side: static-best from a sweep of
the same run, the oracle's r*, and each policy's distance from it."""
from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from helmgr.experiments.oracle import run_oracle
from helmgr.experiments.sweep import held_r_star, static_best, sweep
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


def _quiet(label: str, total: int) -> Callable[[int], None]:
    return lambda k=1: None


def compare(spec: WorkloadSpec, cfgs: dict[str, SimConfig], names: list[str], grid: list[float], jobs: int = 1,
            track: Track = _quiet) -> Comparison:
    """Run `names` (policies, plus "static-best" and "oracle") under each router of `cfgs`."""
    out = Comparison([], {})
    pairs = [(rt, n) for rt in cfgs for n in names if n in POLICIES]      # every router x policy, in one pool
    advance = track(f"{spec.regime if spec.trace is None else 'trace'}: {len(pairs)} runs", len(pairs))
    with ProcessPoolExecutor(max_workers=min(jobs, max(1, len(pairs)))) as pool:
        futures = [pool.submit(_run, (spec, replace(cfgs[rt], policy=n))) for rt, n in pairs]
        for f in futures:
            f.add_done_callback(lambda _: advance(1))
        for (rt, n), f in zip(pairs, futures):
            summary, series = f.result()
            out.rows.append(summary)
            out.timelines[(n, rt)] = series
    for rt, cfg in cfgs.items() if {"static-best", "oracle"} & set(names) else ():
        if "static-best" in names:
            step = track(f"{rt}: static-best", len(grid))
            rows = sweep(spec, cfg, grid, min(jobs, len(grid)), lambda: step(1))
            out.held_r_star = held_r_star(rows, grid)
            for row in rows:
                row.pop("window_p99_ms")
            out.rows.append(static_best(rows))
            out.timelines[("static-best", rt)] = None
        if "oracle" in names:
            w = spec.build()
            step = track(f"{rt}: oracle", int(-(-w.duration_s // 1)))
            seen = [0]

            def windows_done(k: int) -> None:
                step(k - seen[0])
                seen[0] = k
            o = run_oracle(cfg, w, grid, jobs, on_progress=windows_done)
            out.rows.append(o.summary)
            out.timelines[("oracle", rt)] = o.series
            out.r_star = o.r_star
    add_distances(out)
    return out


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
