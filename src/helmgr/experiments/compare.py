"""Every policy (and router) on one workload and seed, side by side: static-best from a sweep of
the same run, the phase oracle's r* (`oracle`) and each policy's distance from it, band
distance and regret."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from helmgr.experiments.parallel import run_all
from helmgr.experiments.phase_oracle import (LOOKAHEAD_S, PhaseOracleResult, common_band, figures, held,
                                             oracle_blocks, run_phase_oracle)
from helmgr.experiments.sweep import held_r_star, run_point, static_best, sweep_tasks
from helmgr.policy import POLICIES
from helmgr.sim import SimConfig, simulate
from helmgr.sim.metrics import Series, oracle_distance
from helmgr.workload import WorkloadSpec

ALL = ("static", "static-best", "independent", "adaptive", "latency-driven", "oracle")
OFFLINE = ("static-best", "oracle")     # hindsight baselines: not policies a run can follow

# track(label, total) -> advance(k): a progress bar's task; advance moves it k steps
Track = Callable[[str, int], Callable[[int], None]]


@dataclass
class Comparison:
    rows: list[dict]
    timelines: dict                     # (policy, router) -> Series, None for static-best
    r_star: np.ndarray | None = None    # the phase oracle's, per window (of the last router)
    held_r_star: np.ndarray | None = None
    oracles: dict = field(default_factory=dict)   # router -> PhaseOracleResult


def run_series(args: tuple[WorkloadSpec, SimConfig]) -> tuple[dict, Series]:
    """One run (in a worker process: it builds its own workload): its summary and series."""
    spec, cfg = args
    r = simulate(cfg, spec.build())
    return r.summary, r.series


def _one(args: tuple[bool, WorkloadSpec, SimConfig]):
    """A policy run (summary, series), or with the flag set a sweep point (`run_point`)."""
    point, spec, cfg = args
    return run_point((spec, cfg)) if point else run_series((spec, cfg))


def _quiet(label: str, total: int) -> Callable[[int], None]:
    return lambda k=1: None


def compare(spec: WorkloadSpec, cfgs: dict[str, SimConfig], names: list[str], grid: list[float], jobs: int = 1,
            track: Track = _quiet, ray_address: str | None = None,
            oracle_lookahead_s: float = LOOKAHEAD_S) -> Comparison:
    """Run `names` (policies, plus "static-best" and "oracle") under each router
    of `cfgs`: the policy runs and the static-best sweeps in one batch of independent runs
    (experiments.parallel: `jobs` processes, or Ray at `ray_address`), then the oracles, whose
    blocks (windows) run in order."""
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
            _phase_oracle(out, spec, cfg, grid, jobs, track, ray_address, oracle_lookahead_s)
    add_distances(out)
    return out


def _progress(track: Track, label: str, total: int) -> Callable[[int], None]:
    """on_progress(k) (k steps done so far) moving a bar by the steps since the last call."""
    step, seen = track(label, total), [0]

    def done(k: int) -> None:
        step(k - seen[0])
        seen[0] = k
    return done


def _phase_oracle(out: Comparison, spec: WorkloadSpec, cfg: SimConfig, grid, jobs: int, track: Track,
                  ray_address: str | None, lookahead_s: float) -> None:
    w = spec.build()
    done = _progress(track, f"{cfg.router}: oracle blocks", len(oracle_blocks(w.phases)))
    o = run_phase_oracle(cfg, w, grid, jobs, on_progress=done, ray_address=ray_address, lookahead_s=lookahead_s)
    out.rows.append(o.summary)
    out.timelines[("oracle", cfg.router)] = o.series
    out.oracles[cfg.router] = o
    out.r_star = o.per_window()[0]


def add_distances(c: Comparison) -> None:
    """Each row's figures against the phase oracle of its router (`oracle_distance`,
    `band_distance`, `regret`), and its mean |r - r*| per window against the held r*
    (`held_oracle_distance`)."""
    for row in c.rows:
        series = c.timelines.get((row["policy"], row["router"]))
        timeline = held(row["ratio"], row["nodes"]) if series is None else series.timeline  # static-best: held
        oracle: PhaseOracleResult | None = c.oracles.get(row["router"])
        if oracle is not None:
            row.update(figures(timeline, row["nodes"], row["duration_s"], oracle, row["p99_ms"]))
        if c.held_r_star is not None:
            row["held_oracle_distance"] = oracle_distance(timeline, row["nodes"], row["duration_s"], c.held_r_star)


STEADY_REGRET = 0.01       # the oracle's check on a stationary run: static-best within 1 % of its P99


def oracle_check(c: Comparison) -> dict | None:
    """The phase oracle's sanity check on a workload with one kind of phase (steady), per router:
    the splits that lie inside every block's band after the warm-up (`common_band`; a flat
    optimum lets the fitted argmin wander, so r*'s spread is not the test) and static-best's
    regret, which must be at most `STEADY_REGRET`. None when no such oracle ran."""
    out = {}
    for router, o in c.oracles.items():
        if len({b.kind for b in o.blocks}) != 1:
            continue
        band = common_band(o, o.summary["warmup_s"])
        best = next((r for r in c.rows if r["policy"] == "static-best" and r["router"] == router), None)
        regret = None if best is None else best.get("regret")
        out[router] = {"common_band": band, "static_best_regret": regret, "regret_threshold": STEADY_REGRET,
                       "pass": band is not None and regret is not None and regret <= STEADY_REGRET}
    return out or None
