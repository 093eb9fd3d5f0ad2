"""What homes earn: EMB hit rate and P99 against the static ratio, with and without homes, and
the cluster's effective EMB capacity (issue 22 item 1).

    python benchmarks/emb_homes.py                        # steady seed 1, ratios 0.2-0.9, 360 s
    python benchmarks/emb_homes.py --workload burst --seeds 1,2 --ratios 0.5,0.7,0.9

Every (ratio, seed) runs twice on the v2 cluster under a static split and the HELM router: as it
ships and with homes off (`Helm(home_slack=0)`). The effective capacity at ratio r is r' / r,
where r' is the ratio at which the run without homes reaches the EMB hit rate the run with homes
has at r (linear interpolation over the grid; '>' when the hit rate is beyond the grid's). One
JSON line per run, then a table. Asserts nothing.
"""
from __future__ import annotations

import argparse
import json
from concurrent.futures import ProcessPoolExecutor

import numpy as np


def run_one(job: tuple) -> dict:
    from helmgr.routing.helm import Helm
    from helmgr.sim import SimConfig, simulate
    from helmgr.sim.config import scenario_cluster
    from helmgr.workload import WorkloadSpec

    workload, seed, ratio, homes, duration = job
    w = WorkloadSpec(workload, duration, seed).build()
    cfg = SimConfig(**scenario_cluster("v2"), router="helm", seed=seed, policy="static", ratio=ratio)
    s = simulate(cfg, w, router=Helm() if homes else Helm(home_slack=0.0)).summary
    return {"workload": workload, "seed": seed, "ratio": ratio, "homes": homes, "p99_ms": round(s["p99_ms"], 3),
            "emb_hit_rate": round(s["emb_hit_rate"], 4), "kv_hit_rate": round(s["kv_hit_rate"], 4),
            "utilization": round(s["utilization"], 3), "wall_s": round(s["wall_s"], 1)}


def effective(ratio: float, hit: float, grid: list[float], hits_off: list[float]) -> str:
    """r' / r for the homes run's `hit` at `ratio`, over the no-homes curve (grid, hits_off)."""
    if hit > hits_off[-1]:
        return f"> {grid[-1] / ratio:.2f}"
    return f"{float(np.interp(hit, hits_off, grid)) / ratio:.2f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="steady")
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--ratios", default="0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9")
    ap.add_argument("--duration", type=float, default=360.0)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    grid = sorted(float(r) for r in args.ratios.split(","))
    jobs = [(args.workload, s, r, h, args.duration) for s in seeds for r in grid for h in (True, False)]
    with ProcessPoolExecutor(args.jobs) as ex:
        runs = []
        for r in ex.map(run_one, jobs):
            print(json.dumps(r), flush=True)
            runs.append(r)
    mean = lambda key, r, h: float(np.mean([x[key] for x in runs if x["ratio"] == r and x["homes"] == h]))
    hits_off = [mean("emb_hit_rate", r, False) for r in grid]
    print(f"\n{args.workload}, seeds {args.seeds} (means)")
    print("| ratio | P99 homes | P99 no homes | EMB hit homes | EMB hit no homes | KV hit homes / no homes | effective EMB capacity |")
    print("|---|---|---|---|---|---|---|")
    for r, off in zip(grid, hits_off):
        on = mean("emb_hit_rate", r, True)
        print(f"| {r:.2f} | {mean('p99_ms', r, True):.2f} | {mean('p99_ms', r, False):.2f} | {on:.3f} | {off:.3f} | "
              f"{mean('kv_hit_rate', r, True):.3f} / {mean('kv_hit_rate', r, False):.3f} | "
              f"{effective(r, on, grid, hits_off)} x |")


if __name__ == "__main__":
    main()
