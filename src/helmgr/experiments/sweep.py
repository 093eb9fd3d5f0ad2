"""Static sweeps and what hindsight makes of them: static-best and the held r* per window."""
from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from typing import Callable

import numpy as np

from helmgr.sim import SimConfig, simulate
from helmgr.workload import WorkloadSpec


def run_point(args: tuple[WorkloadSpec, SimConfig]) -> dict:
    """One run (in a worker process: it builds its own workload). The summary gains
    `window_p99_ms`, each window's P99."""
    spec, cfg = args
    result = simulate(cfg, spec.build())
    return result.summary | {"window_p99_ms": [float(x) for x in result.series.window_p99_ms]}


def sweep(spec: WorkloadSpec, cfg: SimConfig, ratios, jobs: int = 1,
          on_done: Callable[[], None] | None = None) -> list[dict]:
    """One static run per ratio, in `jobs` processes, in the order of `ratios`."""
    tasks = [(spec, replace(cfg, ratio=r, policy="static")) for r in ratios]
    rows = []
    if jobs <= 1:
        results = map(run_point, tasks)
        for row in results:
            rows.append(row)
            on_done and on_done()
        return rows
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for row in pool.map(run_point, tasks):
            rows.append(row)
            on_done and on_done()
    return rows


def static_best(rows: list[dict]) -> dict:
    """The sweep's row with the lowest P99 (hindsight-tuned: the strongest static baseline)."""
    best = dict(min(rows, key=lambda x: x["p99_ms"]))
    best["policy"] = "static-best"
    return best


def held_r_star(rows: list[dict], ratios) -> np.ndarray:
    """Per window, the swept ratio whose held run had the lowest window P99."""
    held = np.array([row["window_p99_ms"] for row in rows])                 # ratios x windows
    return np.asarray(ratios)[np.argmin(np.where(np.isnan(held), np.inf, held), axis=0)]
