"""Forms of the HELM router's waste weight, side by side on tuning seeds (issue 22 item 1).

    python benchmarks/waste_weight.py --configs ship,cap5,cap2,fix1,fix5,fix20 \
        --workloads steady,burst,trend,widened --seeds 101,102 --jobs 2
    python benchmarks/waste_weight.py --configs ship,fix1,fix5,cap2 --workloads steady --scale 3 --seeds 101
    python benchmarks/waste_weight.py --configs ship,fix1 --workloads burst@0.1,burst@0.2,trend@0.1 --seeds 101,102

Configs: `ship` (the router's defaults: the load-based weight, (rho + rate x backlog) / (1 - rho)),
`adaptive` (the same, named: `Helm(waste=None)`), `capN` (the load-based weight, at most N:
`Helm.MAX_WASTE`), `fixN` (a fixed weight N: `Helm(waste=N)`). A regime is one
full-HELM run on the v2 cluster under the HELM router (`tune_tiers.run_one`, its base rate times
--scale); `widened` is amazon-beauty x 32 with its catalogue widened, static 0.2, 60 s (the
router's hardest real-log case; needs ../shared/data); `REGIME@R` is that regime at static split R
under the HELM router, 360 s: a split far below the regime's best leaves the cluster behind in
its peaks, which is where a weight that does not grow with the backlog loses (burst 0.1, seed 3:
357 ms load-based against 3,747 fixed at 1, docs/results/2026-12-04-waste-one.md). Prints one
JSON line per run, then the geometric means per config: over the full-HELM regimes, and over
all runs. Asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
LOG = Path(__file__).resolve().parents[2] / "shared" / "data" / "amazon-beauty.txt"


def router_settings(config: str) -> tuple[dict, float | None]:
    """(Helm's keyword arguments, MAX_WASTE or None) of a config name."""
    if config in ("ship", "adaptive"):
        return ({} if config == "ship" else {"waste": None}), None
    m = re.fullmatch(r"(cap|fix)(\d+(?:\.\d+)?)", config)
    if not m:
        raise SystemExit(f"--configs: {config!r} is not ship, adaptive, capN or fixN")
    return ({"waste": None}, float(m.group(2))) if m.group(1) == "cap" else ({"waste": float(m.group(2))}, None)


def run_one(job: tuple) -> dict:
    from helmgr.routing.helm import Helm
    config, workload, seed, scale = job
    kw, cap = router_settings(config)
    if cap is not None:
        Helm.MAX_WASTE = cap                        # this worker's runs only: one job per process
    import tune_tiers
    regime, ratio = static_case(workload)
    if ratio is None:
        return tune_tiers.run_one((config, {"router": kw}, ("a100-80g", "large", scale), workload, seed, 360.0))
    from helmgr.sim import SimConfig, simulate
    from helmgr.sim.config import scenario_cluster
    from helmgr.workload import WorkloadSpec
    if regime is None:
        w = WorkloadSpec(None, 60.0, seed, trace=str(LOG), trace_format="sequences", time_compression=100.0,
                         clone_users=32, overlays=("widen",)).build()
    else:
        w = tune_tiers.regime_workload(regime, 360.0, seed, scale)
    cfg = SimConfig(**scenario_cluster("v2"), policy="static", ratio=ratio, router="helm", seed=seed)
    s = simulate(cfg, w, router=Helm(**kw)).summary
    return {"config": config, "workload": workload, "seed": seed, "p99_ms": round(s["p99_ms"], 4),
            "utilization": round(s["utilization"], 3)}


def static_case(workload: str) -> tuple[str | None, float | None]:
    """(regime or None for the widened log, its static split) of a static case; (workload, None)
    for a full-HELM regime."""
    if workload == "widened":
        return None, 0.2
    m = re.fullmatch(r"(\w+)@([01](?:\.\d+)?|\.\d+)", workload)
    if "@" in workload and not (m and 0.0 <= float(m.group(2)) <= 1.0):
        raise SystemExit(f"--workloads: {workload!r} is not REGIME@R with R in [0, 1]")
    return (m.group(1), float(m.group(2))) if m else (workload, None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="ship,cap5,cap2,fix1,fix5,fix20")
    ap.add_argument("--workloads", default="steady,burst,trend,widened")
    ap.add_argument("--seeds", default="101,102")
    ap.add_argument("--scale", type=float, default=1.0, help="each regime's base rate times this")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    configs = args.configs.split(",")
    for c in configs:
        router_settings(c)
    for w in args.workloads.split(","):
        static_case(w)
    jobs = [(c, w, int(s), args.scale) for c in configs for w in args.workloads.split(",") for s in args.seeds.split(",")]
    rows = []
    with ProcessPoolExecutor(args.jobs, max_tasks_per_child=1) as pool:   # a fresh process per run: MAX_WASTE
        for row in pool.map(run_one, jobs):
            print(json.dumps(row), flush=True)
            rows.append(row)
    for c in configs:
        p = [r["p99_ms"] for r in rows if r["config"] == c]
        regimes = [r["p99_ms"] for r in rows if r["config"] == c and static_case(r["workload"])[1] is None]
        print(f"{c}: geomean P99 {geomean(regimes):.3f} ms over the regimes, {geomean(p):.3f} over all")


def geomean(v: list[float]) -> float:
    return math.exp(sum(map(math.log, v)) / len(v)) if v else float("nan")


if __name__ == "__main__":
    main()
