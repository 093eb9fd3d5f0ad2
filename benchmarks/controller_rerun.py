"""Rerun the controller's rows of an acceptance comparison without redoing its static sweeps.

`helmgr compare` (benchmarks/controller_table.py) runs every held ratio of the grid to find each
window's best held ratio (held r*); that sweep does not depend on the controller. After a change
to the controller, this reruns only the controller policies — the same runs `helmgr simulate
--workload W --seed S --policy P --router helm --ratio 0.5 [--refill M]` makes — and measures
their held-r* distance against the held r* a compare already wrote (FROM/W-sS.json). Each run
goes to OUT/W-sS-P.json, where `controller_table.py FOLDER` picks it up from FOLDER/rerun:

    python benchmarks/controller_rerun.py --from results/acc2 --out results/acc3/rerun
    python benchmarks/controller_table.py results/acc3 --baseline results/route

(results/acc3 holding copies of results/acc2's compare JSON, or a link to them).
"""
from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from helmgr.cli.simulate_cmd import build_config
from helmgr.cli.workload_cmd import build_workload
from helmgr.sim.metrics import oracle_distance
from helmgr.sim.run import simulate


def run(job: tuple) -> str:
    workload, seed, policy, refill, held_r_star, out = job
    # `helmgr simulate`'s defaults, named
    cfg = build_config(nodes=8, policy=policy, ratio=0.5, router="helm", hardware="a100-80g", model="large",
                       slo_ms=None, refill=refill, faults=(), tick_ms=10.0, refresh_s=2.0, max_batch=1, seed=seed)
    r = simulate(cfg, build_workload(regime=workload, duration=120.0, seed=seed, rps=None, trace=None,
                                     trace_format="inter", time_compression=None, clone_users=1, overlay=()))
    summary = r.summary
    if held_r_star is not None:
        summary["held_oracle_distance"] = oracle_distance(r.series.timeline, summary["nodes"], summary["duration_s"],
                                                          np.asarray(held_r_star))
    out.write_text(json.dumps(summary, indent=2) + "\n")
    return f"{out.name}: P99 {summary['p99_ms']:,.1f} ms, window SLO {summary['window_slo_satisfaction']:.3f}, " \
           f"mean r {summary['mean_ratio']:.3f}, held-r* distance {summary.get('held_oracle_distance', float('nan')):.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="source", type=Path, required=True, help="folder of a compare's W-sS.json")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--workloads", default="steady,trend,burst")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--policies", default="helm,helm-base,helm-base+adapter")
    ap.add_argument("--refill", default="lazy", choices=("sync", "lazy", "background"))
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    jobs = []
    for w in a.workloads.split(","):
        for s in (int(x) for x in a.seeds.split(",")):
            src = a.source / f"{w}-s{s}.json"
            if not src.is_file():
                sys.exit(f"no compare for {w} seed {s}: {src} is missing")
            held = json.loads(src.read_text()).get("held_r_star")
            jobs += [(w, s, p, a.refill, held, a.out / f"{w}-s{s}-{p}.json") for p in a.policies.split(",")]
    a.out.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(max_workers=a.jobs) as pool:
        for line in pool.map(run, jobs):
            print(line, flush=True)


if __name__ == "__main__":
    main()
