"""What does adapter v2 correct where the base policy is wrong? (SPEC 6, issue 22's adapter bar)

    python benchmarks/adapter_v2.py --workload steady --duration 240 --bias -0.15,0,0.15 \
        [--policies helm-base,helm-base+adapter-v1,helm-base+adapter] [--hardware a100-80g] [--seed 1] \
        [--value mean|tail] [--warmup 120 --static 0.55,0.6,0.65]
    python benchmarks/adapter_v2.py --trace ../shared/data/amazon-beauty.txt --clone-users 32 \
        --widen-catalogue --time-compression 100 --duration 180 --bias 0,-0.2

Each (bias, policy) is one run on the v2 cluster under the HELM router, every node set `bias`
above its controller's decision (`HelmPolicy(bias=...)`: a base deliberately wrong by that much;
0: the base as it is). Printed per run, one JSON line: P99, window SLO, the nodes' mean ratio,
the mean ratio over the last quarter (where the adapter has had time), adapter v2's samples,
steps and final offsets, and the mean ratio every 30 s. The gap an adapter closes is read
against the same run of `helm-base` and hindsight static-best (`helmgr sweep`, or `--static`: static
splits run here, on the same cluster and measured over the same span). `--warmup S` measures P99
and window SLO over the requests that arrive after S seconds (the simulator's `warmup_s`, at most
half the run; default: the simulator's 15 s), so that "closes the gap within a few simulated
minutes" can be read after the adapter has had them; every policy runs from t = 0 all the same.
Asserts nothing.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace

from helmgr.policy.policies import POLICIES, HelmPolicy
from helmgr.sim import SimConfig, simulate
from helmgr.sim.config import scenario_cluster
from helmgr.sim.metrics import window_ratios
from helmgr.workload import WorkloadSpec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="steady")
    ap.add_argument("--duration", type=float, default=240.0)
    ap.add_argument("--bias", default="-0.15,0,0.15")
    ap.add_argument("--policies", default="helm-base,helm-base+adapter-v1,helm-base+adapter")
    ap.add_argument("--hardware", default="a100-80g")
    ap.add_argument("--model", default="large")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--bound", type=float, default=None, help="adapter v2's bound [default: MarginalAdapter's]")
    ap.add_argument("--adapter", default="{}",
                    help="more of adapter v2's settings, as JSON (e.g. '{\"hold_base\": false}')")
    ap.add_argument("--value", default=None, choices=("mean", "tail"),
                    help="adapter v2's samples priced over every request or the tail [default: HelmPolicy's]")
    ap.add_argument("--trace", default=None, help="replay this log (sequences format) instead of --workload")
    ap.add_argument("--clone-users", type=int, default=1)
    ap.add_argument("--widen-catalogue", action="store_true")
    ap.add_argument("--time-compression", type=float, default=None)
    ap.add_argument("--warmup", type=float, default=None,
                    help="measure requests arriving after this many seconds [default: the simulator's]")
    ap.add_argument("--static", default="", help="also run these static splits (comma-separated), as references")
    args = ap.parse_args()
    adapter_kw = json.loads(args.adapter) | ({} if args.bound is None else {"bound": args.bound})
    spec = WorkloadSpec(args.workload, args.duration, args.seed, trace=args.trace, trace_format="sequences",
                        time_compression=args.time_compression, clone_users=args.clone_users,
                        overlays=("widen",) if args.widen_catalogue else ())
    cluster = SimConfig(**scenario_cluster("v2"), router="helm", seed=args.seed, hardware=args.hardware,
                        model=args.model)
    if args.warmup is not None:
        cluster = replace(cluster, warmup_s=args.warmup)
    for ratio in (float(x) for x in args.static.split(",") if x):
        s = simulate(replace(cluster, policy="static", ratio=ratio), spec.build()).summary
        print(json.dumps({"policy": "static", "ratio": ratio, "warmup_s": cluster.warmup_s,
                          "p99_ms": round(s["p99_ms"], 3), "window_slo": round(s["window_slo_satisfaction"], 4),
                          "wall_s": round(s["wall_s"], 1)}), flush=True)
    for bias in (float(x) for x in args.bias.split(",")):
        for name in args.policies.split(","):
            cls = POLICIES[name]
            if not issubclass(cls, HelmPolicy):
                raise SystemExit(f"{name}: not a HELM policy (the bias is the controller's)")
            policy = cls(bias=bias, adapter_kw=adapter_kw or None, value=args.value)
            w = spec.build()
            res = simulate(replace(cluster, policy=name), w, policy=policy)
            s, n = res.summary, cluster.nodes
            r = window_ratios(res.series.timeline, n, w.duration_s)
            ctl = s["controller"]
            row = {"bias": bias, "policy": name, "warmup_s": cluster.warmup_s, "adapter": adapter_kw,
                   "value": policy.value, "p99_ms": round(s["p99_ms"], 3),
                   "window_slo": round(s["window_slo_satisfaction"], 4), "mean_ratio": round(float(r.mean()), 3),
                   "last_quarter_ratio": round(float(r[int(0.75 * len(r)):].mean()), 3),
                   "samples": ctl["adapter_estimates"], "steps": ctl["adapter_steps"],
                   "offsets": ctl.get("adapter_offsets"),
                   "ratio_every_30s": [round(float(x), 3) for x in r[::30]],
                   "sim_path": s["sim_path"], "wall_s": round(s["wall_s"], 1)}
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
