"""Routing decision cost: microseconds per decision, p50 / p99, at 32 and 1,024 nodes.

    python benchmarks/bench_router.py [--router helm] [--decisions 20000] [--repeats 3]

The same as `helmgr bench --router helm`; how the index is filled is in helmgr/bench.py. Prints
figures; asserts nothing.
"""
from __future__ import annotations

import argparse

from helmgr.experiments.bench import router_bench


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--router", default="helm")
    ap.add_argument("--decisions", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    r = router_bench(args.router, [32, 1024], args.decisions, args.repeats)
    print(f"{r['router']}: {r['decisions']:,} decisions x {r['repeats']} runs per size, {r['n_items']:,} items")
    for row in r["sizes"]:
        runs = ", ".join(f"{x:.2f}" for x in row["p50_us_runs"])
        print(f"{row['nodes']:5d} nodes: p50 {row['p50_us']:6.2f} us   p99 {row['p99_us']:6.2f} us   "
              f"mean {row['mean_us']:6.2f} us   (p50 of each run: {runs})")


if __name__ == "__main__":
    main()
