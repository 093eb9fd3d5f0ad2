"""The routing comparison of docs/routing.md: every router at each regime's static-best ratio,
three seeds. Reads the JSON that these commands write, prints the Markdown tables, draws the plot:

    for s in 1 2 3; do
      for wr in "steady 0.45" "trend 0.55" "burst 0.90"; do set -- $wr
        helmgr compare --workload $1 --seed $s --policies static --ratio $2 \
          --routers helm,helm-kv,helm-emb,helm-load,least-loaded,affinity,prefix-aware --json > results/route/$1-s$s.json
      done
    done
    python benchmarks/route_table.py results/route [--plot docs/img/routing-p99.png]
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

ORDER = ("helm", "helm-kv", "helm-emb", "helm-load", "prefix-aware", "affinity", "least-loaded")


def load(folder: Path) -> dict:
    """{(workload, router): {seed: result row}}"""
    rows: dict = defaultdict(dict)
    for f in sorted(folder.glob("*-s[0-9]*.json")):
        d = json.loads(f.read_text())
        for r in d["results"]:
            rows[(d["workload"], r["router"])][d["seed"]] = r
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--plot", type=Path, default=None)
    args = ap.parse_args()
    rows = load(args.folder)
    found = {w for w, _ in rows}
    workloads = [w for w in ("steady", "trend", "burst") if w in found] + sorted(found - {"steady", "trend", "burst"})
    p99 = {}
    for w in workloads:
        routers = [r for r in ORDER if (w, r) in rows]
        seeds = sorted(rows[(w, routers[0])])
        ratio = rows[(w, routers[0])][seeds[0]]["ratio"]
        print(f"\n**{w}** (static r = {ratio:g}, seeds {', '.join(map(str, seeds))})\n")
        print("| router | P99 ms per seed | mean P99 ms | ÷ helm (same seeds) | window SLO | KV hit | EMB hit | utilization | node-load peak |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        helm = rows.get((w, "helm"), {})
        p99[w] = {}
        for r in routers:
            by = rows[(w, r)]
            mine = [s for s in seeds if s in by]
            vals = [by[s]["p99_ms"] for s in mine]
            if len(mine) == len(seeds):            # the plot shows routers run on every seed
                p99[w][r] = vals
            mean = lambda k: np.mean([by[s][k] for s in mine])
            both = [s for s in mine if s in helm]
            ratio = np.mean(vals if len(both) == len(mine) else [by[s]["p99_ms"] for s in both]) / np.mean(
                [helm[s]["p99_ms"] for s in both]) if both else np.nan
            times = f"{ratio:,.0f}×" if ratio >= 10 else f"{ratio:.3f}×"
            peak = max(by[s]["node_load_max_over_mean"] for s in mine)
            print(f"| {r} | {' / '.join(f'{v:,.1f}' for v in vals)} | {np.mean(vals):,.1f} | {times} | "
                  f"{mean('window_slo_satisfaction'):.3f} | {mean('kv_hit_rate'):.3f} | {mean('emb_hit_rate'):.3f} | "
                  f"{mean('utilization'):.2f} | {peak:.2f} |")
    if args.plot:
        from helmgr.experiments.plots import plot_router_p99
        plot_router_p99(p99, "P99 by router at each regime's static-best ratio (8 nodes; bars: mean, dots: seeds)",
                        args.plot)
        print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()
