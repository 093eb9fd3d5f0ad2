"""Simulator speed: simulated requests per wall-second at 8, 32 and 128 nodes, by router.

    python benchmarks/bench_sim.py [--nodes 8,32,128] [--routers least-loaded,helm] [--duration 10]
                                   [--emb-sample 1,16] [--policies static,helm] [--json]

The same figures as `helmgr bench --sim` (experiments.bench.sim_bench): the default scenario's
per-node load (v2: 162.5 req/s per node) at each size, `simulate` end to end on one core (chunks are
drawn as the run consumes them), each run at most --max-requests requests long; then the split of
wall time by phase from an instrumented run of the same configuration, and memory per node.
Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import json

from helmgr.experiments.bench import sim_bench


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="8,32,128", help="comma list of cluster sizes")
    ap.add_argument("--routers", default="least-loaded,helm", help="comma list of routers")
    ap.add_argument("--duration", type=float, default=10.0, help="simulated seconds per run (before the cap)")
    ap.add_argument("--max-requests", type=int, default=150_000, help="cap on one run's requests")
    ap.add_argument("--sim-path", default="auto", help="comma list of per-request paths (auto, compiled, python)")
    ap.add_argument("--emb-sample", default="1", help="comma list of EMB sampling rates (simulate --emb-sample)")
    ap.add_argument("--policies", default="static", help="comma list of memory policies (static at 0.5, helm, ...)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args()
    r = sim_bench([int(x) for x in args.nodes.split(",")], args.routers.split(","), args.duration, args.max_requests,
                  paths=args.sim_path.split(","), samples=[int(x) for x in args.emb_sample.split(",")],
                  policies=args.policies.split(","))
    if args.json:
        print(json.dumps(r, indent=2, allow_nan=False))
        return
    print(f"{'nodes':>5} {'policy':>8} {'router':>13} {'path':>8} {'sample':>6} {'sim s':>6} {'requests':>9} {'req/s':>8} {'ids/req':>7} "
          f"{'MB/node':>7}  "
          + " ".join(f"{p[:10]:>10}" for p in r["phases"]) + "  (% of wall)")
    for row in r["rows"]:
        print(f"{row['nodes']:5d} {row['policy']:>8} {row['router']:>13} {row['sim_path']:>8} {row['emb_sample']:6d} {row['duration_s']:6.1f} {row['requests']:9,d} "
              f"{row['req_per_s']:8,.0f} {row['ids_per_request']:7,.0f} {row['setup_bytes_per_node'] / 2**20:7.1f}  "
              + " ".join(f"{100 * row['phase_share'][p]:10.1f}" for p in r["phases"]))


if __name__ == "__main__":
    main()
