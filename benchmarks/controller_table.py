"""The controller comparison of docs/controller.md: HELM's tiers against static-best, three seeds.
Reads the JSON these commands write, prints the Markdown tables:

    for s in 1 2 3; do for w in steady trend burst; do
      helmgr compare --workload $w --seed $s --policies helm,helm-base,helm-base+adapter,static-best \\
        --routers helm --ratio 0.5 --ratios 0.2,0.35,0.45,0.55,0.7,0.8,0.9 --json > results/acc/$w-s$s.json
    done; done
    helmgr simulate --workload burst --seed $s --policy adaptive --refill sync --router least-loaded \\
        --json > results/acc/naive-burst-s$s.json                       # naive reallocation, per seed
    python benchmarks/controller_table.py results/acc --baseline results/route

Single `helmgr simulate --router helm --json` runs in FOLDER/rerun (named REGIME-sSEED.json)
replace the row of their policy (how the full `helm` was rerun after a detector fix).

The acceptance baseline, "static-best + least-loaded", is per seed the least-loaded static run
with the lowest P99 among the routing comparison's rows (`--baseline`, benchmarks/route_table.py)
and the sweeps in FOLDER/ll:

    helmgr sweep --workload $w --seed $s --router least-loaded --ratios 0.7,0.8,0.9 --json > results/acc/ll/$w-s$s.json
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

ORDER = ("helm", "helm-base+adapter", "helm-base", "static-best", "static-best + least-loaded", "naive (adaptive, sync, LL)")


def load(folder: Path, baseline: Path | None) -> dict:
    """{(workload, row name): {seed: result}}"""
    rows: dict = defaultdict(dict)
    for f in sorted(folder.glob("*-s[0-9]*.json")):
        if not f.stat().st_size:                        # still being written
            continue
        d = json.loads(f.read_text())
        if f.name.startswith("naive-"):
            rows[(d["workload"], ORDER[-1])][d["seed"]] = d
            continue
        for r in d.get("results", []):
            rows[(d["workload"], r["policy"])][d["seed"]] = r
    for f in sorted((folder / "rerun").glob("[a-z]*-s[0-9]*.json")):   # single runs that replace a row
        d = json.loads(f.read_text()) if f.stat().st_size else None
        if d and d["router"] == "helm":
            # a single run has no held r*: take the distance of a compared run of the same seed
            # whose ratio trajectory it repeats (the same time-weighted mean ratio, to 1e-12)
            twins = [r for (w, _), by in rows.items() if w == d["workload"] for sd, r in by.items()
                     if sd == d["seed"] and "held_oracle_distance" in r and abs(r["mean_ratio"] - d["mean_ratio"]) < 1e-12]
            if twins:
                d = d | {"held_oracle_distance": twins[0]["held_oracle_distance"]}
            rows[(d["workload"], d["policy"])][d["seed"]] = d
    # static-best + least-loaded: per seed, the least-loaded static run with the lowest P99 of
    # every one found (the routing comparison's rows, and `helmgr sweep --router least-loaded`)
    files = [f for folder_ in (baseline, folder / "ll") if folder_ for f in sorted(folder_.glob("*-s[0-9]*.json"))]
    for f in files:
        if not f.stat().st_size:
            continue
        d = json.loads(f.read_text())
        for r in d.get("results", d.get("rows", [])):
            if r["router"] == "least-loaded" and r["policy"] == "static":
                best = rows[(d["workload"], ORDER[-2])]
                if d["seed"] not in best or r["p99_ms"] < best[d["seed"]]["p99_ms"]:
                    best[d["seed"]] = r
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--baseline", type=Path, default=None, help="the routing comparison's folder")
    args = ap.parse_args()
    rows = load(args.folder, args.baseline)
    for w in ("steady", "trend", "burst"):
        names = [n for n in ORDER if (w, n) in rows]
        if not names:
            continue
        ref = rows.get((w, ORDER[-2]), {})
        seeds = sorted(rows[(w, names[0])])
        print(f"\n**{w}** (seeds {', '.join(map(str, seeds))}; vs = mean P99 against static-best + least-loaded)\n")
        print("| policy | P99 ms per seed | mean P99 ms | vs | window SLO | throughput ÷ | mean r | held-r* distance | burst violation |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for n in names:
            by = rows[(w, n)]
            mine = [s for s in seeds if s in by]
            p99 = [by[s]["p99_ms"] for s in mine]
            both = [s for s in mine if s in ref]
            vs = (np.mean([by[s]["p99_ms"] for s in both]) / np.mean([ref[s]["p99_ms"] for s in both]) - 1) if both else np.nan
            thr = np.mean([by[s]["throughput_rps"] / ref[s]["throughput_rps"] for s in both]) if both else np.nan
            def mean(k):            # over every seed, or nan when a seed lacks the figure
                vals = [by[s].get(k) for s in mine]
                return np.nan if any(v is None for v in vals) else float(np.mean(vals))
            print(f"| {n} | {' / '.join(f'{v:,.1f}' for v in p99)} | {np.mean(p99):,.1f} | {vs:+.1%} | "
                  f"{mean('window_slo_satisfaction'):.3f} | {thr:.3f} | {mean('mean_ratio'):.2f} | "
                  f"{mean('held_oracle_distance'):.3f} | {mean('burst_violation_share'):.2f} |")


if __name__ == "__main__":
    main()
