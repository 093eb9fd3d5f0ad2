"""Which bursts each configuration violates, burst by burst (issue 22's burst-violation bar).

    python benchmarks/burst_violations.py --seeds 1,2,3,4,5,6,7,8,9,10,11,12,13 --jobs 2 \
        --config helm=helm::helm --config ll95=static:0.95:least-loaded \
        --config s90=static:0.9:helm --config naive=adaptive::least-loaded:sync

Each --config is NAME=POLICY:RATIO:ROUTER[:REFILL] (RATIO empty: the scenario's initial ratio;
REFILL: lazy by default). POLICY `onset>R+D` is a bound, not a policy: every node holds RATIO and
moves to R at each burst's start + D seconds (D < 0: before it, knowing the burst in advance),
back to RATIO at its end; `onset>0.95+0` is the ideal reactive controller (no detection delay,
the burst's split at once). Every (config, seed) is one run of the v2 burst regime (360 s). A burst
is violated when one of its busy windows has a P99 over the SLO, as the summary's
`burst_violation_share` counts it. Printed: one JSON line per run (P99, utilization, each burst's
start, end, multiple, worst window P99 and the windows over the SLO, as seconds from its onset), then per config the bursts violated, and the same
among the "absorbable" bursts: those one of the --absorbable-by configurations rode out (default:
the static ones; a burst every static split violates measures the load, not the controller).
With `--absorbable-by r0` and `r0=onset>0.95+0:0.6:helm`, a burst is absorbable when the ideal
reactive controller rides it: the share a controller that only reacts can be held to.
Each burst also carries `peak_util`, the cluster's peak utilization inside it (the busiest ten
consecutive windows' mean busier-engine share, as the summary's `peak_utilization`). With
`--feasible-by NAME` a burst is *provisioned* when NAME's run keeps its peak at or under 0.85 —
SPEC 3's S3 ("feasible at the right split": peak utilization <= 0.85 at the phase's best ratio),
so NAME should hold the bursts' best split — and each config's violations are counted among
those too.
Asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import re
from concurrent.futures import ProcessPoolExecutor

import numpy as np


S3_PEAK = 0.85      # SPEC 3, S3: a phase is feasible at its best split with peak utilization <= 0.85
ONSET = re.compile(r"onset>([0-9.]+)([+-][0-9.]+)?")


def run_one(job: tuple) -> dict:
    from helmgr.policy.policies import Scheduled
    from helmgr.sim import SimConfig, simulate
    from helmgr.sim.config import scenario_cluster
    from helmgr.sim.metrics import burst_windows, burst_worst, rolling_peak, window_load_series
    from helmgr.workload import default_config, synthetic_workload

    name, (policy, ratio, router, refill), seed, duration, ramp = job
    w = synthetic_workload(default_config("burst", duration_s=duration, burst_ramp_s=ramp), seed)
    onset = ONSET.fullmatch(policy)
    kw = scenario_cluster("v2") | {"router": router, "seed": seed, "policy": "scheduled" if onset else policy,
                                   "refill": refill}
    if ratio:
        kw["ratio"] = float(ratio)
    cfg = SimConfig(**kw)
    if onset:
        to, delay = float(onset[1]), float(onset[2] or 0.0)
        steps = [(0.0, cfg.ratio)]
        for b in w.bursts:
            steps += [(max(0.0, b.start + delay), to), (b.end, cfg.ratio)]
        res = simulate(cfg, w, policy=Scheduled(steps))
    else:
        res = simulate(cfg, w)
    s, series = res.summary, res.series
    warmup = min(cfg.warmup_s, 0.5 * w.duration_s)
    busy = (series.window_requests > 0) & (series.window_start >= warmup - 1e-9)
    p99, ws = series.window_p99_ms, cfg.window_s
    load = window_load_series(res.cluster.rec.window_t, res.cluster.rec.window_loads, ws, len(p99))

    def peak(b) -> float:
        seen = load[slice(*burst_windows(b, ws, len(p99)))]
        return round(rolling_peak(seen[np.isfinite(seen)]), 3)
    bursts = [{"start": round(b.start, 1), "end": round(b.end, 1), "mult": round(b.mult, 2),
               "worst_ms": round(worst, 2), "violated": bool(worst > series.slo_ms), "peak_util": peak(b),
               "over_at_s": [round(k * ws - b.start, 1) for k in range(*burst_windows(b, ws, len(p99)))
                             if busy[k] and p99[k] > series.slo_ms]}   # windows over, from the onset
              for b, worst in zip(w.bursts, burst_worst(p99, busy, w.bursts, ws))]
    return {"config": name, "seed": seed, "p99_ms": round(s["p99_ms"], 3), "utilization": round(s["utilization"], 3),
            "window_slo": round(s["window_slo_satisfaction"], 4), "bursts": bursts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", action="append", default=[], help="NAME=POLICY:RATIO:ROUTER[:REFILL] (repeatable)")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--duration", type=float, default=360.0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--burst-ramp-s", type=float, default=0.0, help="bursts rise to their multiple over this "
                    "many seconds [default: 0, the v2 default's step]")
    ap.add_argument("--absorbable-by", default="", help="NAME,... the configurations whose rides make a burst "
                    "absorbable [default: the static ones]")
    ap.add_argument("--feasible-by", default="", help="NAME: a burst is provisioned when NAME's run keeps its "
                    "peak utilization <= 0.85 (SPEC 3, S3); NAME should hold the bursts' best split")
    args = ap.parse_args()
    configs = {}
    for c in args.config or ["helm=helm::helm", "ll95=static:0.95:least-loaded"]:
        name, _, spec = c.partition("=")
        parts = spec.split(":") + ["lazy"] * (4 - len(spec.split(":")))
        if len(parts) != 4 or not parts[0] or not parts[2]:
            raise SystemExit(f"--config {c!r}: expected NAME=POLICY:RATIO:ROUTER[:REFILL]")
        if parts[0].startswith("onset") and not ONSET.fullmatch(parts[0]):
            raise SystemExit(f"--config {c!r}: expected POLICY onset>R+D or onset>R-D (e.g. onset>0.95+0)")
        configs[name] = tuple(parts)
    static = [n for n, c in configs.items() if c[0] == "static"]
    if args.absorbable_by:
        static = args.absorbable_by.split(",")
        if unknown := [n for n in static if n not in configs]:
            raise SystemExit(f"--absorbable-by {','.join(unknown)}: not a --config name")
    if args.feasible_by and args.feasible_by not in configs:
        raise SystemExit(f"--feasible-by {args.feasible_by}: not a --config name")
    seeds = [int(s) for s in args.seeds.split(",")]
    if not args.burst_ramp_s >= 0:
        raise SystemExit(f"--burst-ramp-s {args.burst_ramp_s}: must be >= 0")
    jobs = [(n, cfg, s, args.duration, args.burst_ramp_s) for s in seeds for n, cfg in configs.items()]
    rows = []
    with ProcessPoolExecutor(args.jobs) as ex:
        for row in ex.map(run_one, jobs):
            print(json.dumps(row), flush=True)
            rows.append(row)
    flags = {(r["config"], r["seed"]): [b["violated"] for b in r["bursts"]] for r in rows}
    absorbable = {s: [not all(flags[(n, s)][k] for n in static) for k in range(len(flags[(static[0], s)]))]
                  if static else None for s in seeds}
    peaks = {(r["config"], r["seed"]): [b["peak_util"] for b in r["bursts"]] for r in rows}
    feasible = {s: [p <= S3_PEAK for p in peaks[(args.feasible_by, s)]] for s in seeds} if args.feasible_by else None
    print("\nconfig     violated / bursts   of the absorbable" + ("   of the provisioned" if feasible else ""))
    for n in configs:
        total = sum(len(flags[(n, s)]) for s in seeds)
        bad = sum(sum(flags[(n, s)]) for s in seeds)
        line = f"{n:10s} {bad:3d} / {total:3d} ({bad / max(total, 1):5.1%})"
        if static:
            ab = [(v, a) for s in seeds for v, a in zip(flags[(n, s)], absorbable[s])]
            n_ab = sum(a for _, a in ab)
            bad_ab = sum(v and a for v, a in ab)
            line += f"   {bad_ab:3d} / {n_ab:3d} ({bad_ab / max(n_ab, 1):5.1%})"
        if feasible:
            fe = [(v, f) for s in seeds for v, f in zip(flags[(n, s)], feasible[s])]
            n_fe, bad_fe = sum(f for _, f in fe), sum(v and f for v, f in fe)
            line += f"   {bad_fe:3d} / {n_fe:3d} ({bad_fe / max(n_fe, 1):5.1%})"
        print(line)
    print(f"\nmean P99 ms: " + ", ".join(f"{n} {np.mean([r['p99_ms'] for r in rows if r['config'] == n]):.2f}"
                                         for n in configs))


if __name__ == "__main__":
    main()
