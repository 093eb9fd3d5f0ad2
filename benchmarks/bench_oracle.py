"""Phase-oracle speed: wall time of one `run_phase_oracle` on the v2 defaults, by router and path.

    python benchmarks/bench_oracle.py [--workload steady] [--duration 120] [--routers helm,least-loaded]
                                      [--sim-path auto] [--lookahead 0] [--seed 1] [--json]

One worker (`jobs=1`), after a small oracle on each router and path (kernels compiled and loaded
outside the timings): the oracle forks the cluster at each block and replays the block at every
ratio of the evaluation's grid, so its time is about the grid's size times a run's. Prints the
wall time, the stitched run's P99 and r* per block (the same on either path); asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import time

from helmgr.experiments.evaluate import DEFAULT_GRID
from helmgr.experiments.phase_oracle import run_phase_oracle
from helmgr.sim import SimConfig
from helmgr.workload import default_config, synthetic_workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="steady", help="regime: steady, burst or trend")
    ap.add_argument("--duration", type=float, default=120.0, help="simulated seconds")
    ap.add_argument("--routers", default="helm,least-loaded", help="comma list of routers")
    ap.add_argument("--sim-path", default="auto", help="comma list of per-request paths (auto, compiled, python)")
    ap.add_argument("--lookahead", type=float, default=0.0, help="the oracle's lookahead, seconds")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = ap.parse_args()
    w = synthetic_workload(default_config(args.workload, duration_s=args.duration), args.seed)
    tiny = synthetic_workload(default_config(args.workload, duration_s=12.0, rps=300.0), args.seed)
    for router in args.routers.split(","):             # compile / load the kernels outside the timings
        for path in args.sim_path.split(","):
            cfg = SimConfig(nodes=2, router=router, seed=args.seed, path=path)
            run_phase_oracle(cfg, tiny, [0.3, 0.6], jobs=1)
    rows = []
    for router in args.routers.split(","):
        for path in args.sim_path.split(","):
            cfg = SimConfig(router=router, seed=args.seed, path=path)
            t = time.perf_counter()
            r = run_phase_oracle(cfg, w, list(DEFAULT_GRID), jobs=1, lookahead_s=args.lookahead)
            rows.append({"workload": args.workload, "duration_s": args.duration, "router": router, "path": path,
                         "sim_path": r.cluster.path, "wall_s": time.perf_counter() - t,
                         "p99_ms": r.summary["p99_ms"], "r_star": [round(float(x), 4) for x in r.r_star]})
            if not args.json:
                x = rows[-1]
                print(f"{x['router']:>13} {x['sim_path']:>9}  wall {x['wall_s']:7.1f} s  P99 {x['p99_ms']:.4f} ms  "
                      f"r* {' '.join(f'{v:.3f}' for v in x['r_star'])}")
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
