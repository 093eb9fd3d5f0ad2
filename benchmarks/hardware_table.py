"""The shipped controller on hardware it was not trained for: H100 and H200 against the A100 it was.

Per hardware preset, regime and seed: `helm` and `helm-base` (HELM router), and static splits
over a grid under least-loaded routing, whose best is the acceptance baseline (static-best +
least-loaded), and under the HELM router (static-best, same router as HELM). Every run is
`helmgr simulate --hardware H --workload W --seed S --policy P [--ratio R] --router X`; each
summary goes to OUT/H-W-sS-P[-R]-X.json (kept: a rerun skips the runs already there), and the
table is printed as markdown:

    python benchmarks/hardware_table.py --out results/hardware [--hardware h100-80g,h200-141g]
"""
from __future__ import annotations

import argparse
import json
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from helmgr.cli.simulate_cmd import build_config
from helmgr.cli.workload_cmd import build_workload
from helmgr.sim.run import simulate

GRID = (0.2, 0.35, 0.5, 0.7, 0.9)


def run(job: tuple) -> dict:
    hardware, workload, seed, policy, ratio, router, out = job
    if out.is_file():
        return json.loads(out.read_text())
    cfg = build_config(nodes=8, policy=policy, ratio=ratio, router=router, hardware=hardware, model="large",
                       slo_ms=None, refill="lazy", faults=(), tick_ms=10.0, refresh_s=2.0, max_batch=1, seed=seed)
    summary = simulate(cfg, build_workload(regime=workload, duration=120.0, seed=seed, rps=None, trace=None,
                                           trace_format="inter", time_compression=None, clone_users=1,
                                           overlay=())).summary
    out.write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--hardware", default="h100-80g,h200-141g")
    ap.add_argument("--workloads", default="steady,trend,burst")
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    cells = [(h, w, int(s)) for h in a.hardware.split(",") for w in a.workloads.split(",") for s in a.seeds.split(",")]
    jobs = []
    for h, w, s in cells:
        jobs += [(h, w, s, p, 0.5, "helm", a.out / f"{h}-{w}-s{s}-{p}-helm.json") for p in ("helm", "helm-base")]
        jobs += [(h, w, s, "static", r, x, a.out / f"{h}-{w}-s{s}-static-{r}-{x}.json")
                 for r in GRID for x in ("least-loaded", "helm")]
    with ProcessPoolExecutor(max_workers=a.jobs) as pool:
        results = dict(zip([j[-1].name for j in jobs], pool.map(run, jobs)))
    print("| hardware | regime | seed | helm P99 ms (r) | helm-base | static-best, HELM router | "
          "static-best + least-loaded | helm vs baseline | window SLO helm / baseline | burst events |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---|---:|")
    for h, w, s in cells:
        def get(name: str) -> dict:
            return results[f"{h}-{w}-s{s}-{name}.json"]
        helm, base = get("helm-helm"), get("helm-base-helm")
        best_h = min((get(f"static-{r}-helm") for r in GRID), key=lambda d: d["p99_ms"])
        best_ll = min((get(f"static-{r}-least-loaded") for r in GRID), key=lambda d: d["p99_ms"])
        events = sum(e["event"] == "start" for e in helm["controller"]["burst_events"])
        print(f"| {h} | {w} | {s} | {helm['p99_ms']:,.2f} ({helm['mean_ratio']:.2f}) | {base['p99_ms']:,.2f} "
              f"({base['mean_ratio']:.2f}) | {best_h['p99_ms']:,.2f} ({best_h['ratio']}) | {best_ll['p99_ms']:,.2f} "
              f"({best_ll['ratio']}) | {helm['p99_ms'] / best_ll['p99_ms'] - 1:+.1%} | "
              f"{helm['window_slo_satisfaction']:.3f} / {best_ll['window_slo_satisfaction']:.3f} | {events} |")


if __name__ == "__main__":
    main()
