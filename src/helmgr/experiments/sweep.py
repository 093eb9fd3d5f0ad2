"""Static sweeps and what hindsight makes of them: static-best and the held r* per window."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np

from helmgr.experiments.parallel import run_all
from helmgr.sim import SimConfig, simulate
from helmgr.workload import WorkloadSpec


def run_point(args: tuple[WorkloadSpec, SimConfig]) -> dict:
    """One run (in a worker process: it builds its own workload). The summary gains
    `window_p99_ms`, each window's P99."""
    spec, cfg = args
    result = simulate(cfg, spec.build())
    return result.summary | {"window_p99_ms": [float(x) for x in result.series.window_p99_ms]}


def sweep_tasks(spec: WorkloadSpec, cfg: SimConfig, ratios) -> tuple[list, list[str]]:
    """The sweep's runs (for `run_point`) and their names, in the order of `ratios`."""
    return ([(spec, replace(cfg, ratio=r, policy="static")) for r in ratios],
            [f"sweep ratio {r:g} ({cfg.router})" for r in ratios])


def sweep(spec: WorkloadSpec, cfg: SimConfig, ratios, jobs: int = 1, on_done: Callable[[], None] | None = None,
          ray_address: str | None = None) -> list[dict]:
    """One static run per ratio (experiments.parallel: `jobs` processes, or Ray at `ray_address`),
    in the order of `ratios`."""
    tasks, names = sweep_tasks(spec, cfg, ratios)
    return run_all(run_point, tasks, jobs, ray_address, names, on_done and (lambda _: on_done()))


def static_best(rows: list[dict]) -> dict:
    """The sweep's row with the lowest P99 (hindsight-tuned: the strongest static baseline)."""
    best = dict(min(rows, key=lambda x: x["p99_ms"]))
    best["policy"] = "static-best"
    return best


def held_r_star(rows: list[dict], ratios) -> np.ndarray:
    """Per window, the swept ratio whose held run had the lowest window P99."""
    held = np.array([row["window_p99_ms"] for row in rows])                 # ratios x windows
    return np.asarray(ratios)[np.argmin(np.where(np.isnan(held), np.inf, held), axis=0)]
