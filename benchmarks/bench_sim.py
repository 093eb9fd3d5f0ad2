"""Simulator speed: simulated requests per wall-second, at 8 and at 32 nodes.

    python benchmarks/bench_sim.py [--duration 30] [--router least-loaded]

The default scenario's per-node load (2,400 req/s on 8 nodes) is kept at 32 nodes (9,600 req/s).
Workload generation is part of the loop (chunks are drawn as the simulation consumes them), so
the figure is end to end on one core; the split between generation, node model and event loop
comes from a cProfile run. Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import time

from helmgr.sim import SimConfig, simulate
from helmgr.workload import default_config, synthetic_workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--router", default="least-loaded")
    ap.add_argument("--profile", action="store_true", help="print where the time goes at 32 nodes")
    args = ap.parse_args()
    for nodes in (8, 32):
        w = synthetic_workload(default_config("steady", rps=300.0 * nodes, duration_s=args.duration), 1)
        cfg = SimConfig(nodes=nodes, router=args.router, seed=1)
        t = time.perf_counter()
        s = simulate(cfg, w).summary
        wall = time.perf_counter() - t
        print(f"{nodes:3d} nodes, {args.router}: {s['requests']:,} requests in {wall:.1f} s "
              f"-> {s['requests'] / wall:,.0f} simulated req/s  (p99 {s['p99_ms']:.1f} ms, util {s['utilization']:.2f})")
    if args.profile:
        prof = cProfile.Profile()
        prof.runcall(simulate, SimConfig(nodes=32, router=args.router, seed=1),
                     synthetic_workload(default_config("steady", rps=9600.0, duration_s=10.0), 1))
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
