"""What moving the split could win, block by block, and where HELM's controller stands (issue 22).

    python benchmarks/split_blocks.py --workload trend --seed 1 --ratios 0.5,0.6,0.7,0.8,0.9,0.95 --jobs 2

Runs each static ratio under `--router` (default: the HELM router) and the controller `--policy`
(default: full HELM, its tiers traced), all on the v2 cluster (360 s unless `--duration`). Prints:
- the P99 of every `--show` block (default 30 s) per static ratio and for the controller;
- each run's top 1 % by latency: time queued and in service, prefix, tokens recomputed, the share
  with nothing cached;
- the **per-block best**: the ratio per `--block` block (default 10 s) whose requests, pooled with
  the other blocks' choices, give the lowest run P99 (coordinate descent from static-best). Each
  block's requests are the static run's, so a move costs nothing: an estimate of what a split
  controller could reach under this router, optimistic about resizes;
- the controller's trace every 20 s, mean over nodes: the base tier's plan, adapter v2's offset,
  the ratio set, and the adapter's pending marginal samples.
Asserts nothing.
"""
from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor

import numpy as np


def run_one(job: tuple) -> dict:
    from helmgr.core.profiles import node_profile
    from helmgr.policy.policies import HelmPolicy, make_policy
    from helmgr.routing import make_router
    from helmgr.sim import SimConfig
    from helmgr.sim.cluster import Cluster
    from helmgr.sim.config import scenario_cluster
    from helmgr.workload import WorkloadSpec

    workload, seed, router, policy, ratio, duration = job
    w = WorkloadSpec(workload, duration, seed).build()
    cfg = SimConfig(**scenario_cluster("v2"), router=router, seed=seed, policy=policy,
                    ratio=ratio if ratio is not None else 0.5).validate(w.duration_s)
    trace: list = []
    pol = make_policy(policy)
    if isinstance(pol, HelmPolicy):
        base = type(pol)

        class Traced(base):
            def decide(self, index, node, now):
                r = super().decide(index, node, now)
                c = self.ctl.get(index)
                if c is not None:
                    a = getattr(c, "adapter", None)
                    trace.append((now, c.plan if c.plan is not None else np.nan,
                                  getattr(a, "offset", 0.0), node.ratio,
                                  np.mean(a.samples) if a is not None and getattr(a, "samples", None) else np.nan))
                return r
        pol = Traced()
    cluster = Cluster(cfg, w, node_profile(cfg.hardware, cfg.model), make_router(router), pol, None)
    cluster.run()
    rec = cluster.rec
    arrival = np.asarray(rec.arrival)
    keep = arrival >= cfg.warmup_s
    col = {k: np.asarray(getattr(rec, k), float)[keep] for k in ("start", "end", "prefix", "kv_tokens")}
    arrival = arrival[keep]
    latency = col["end"] - arrival
    top = latency >= np.percentile(latency, 99)
    tail = {"latency_ms": latency[top].mean() * 1e3, "queued_ms": (col["start"] - arrival)[top].mean() * 1e3,
            "in_service_ms": (col["end"] - col["start"])[top].mean() * 1e3, "prefix": col["prefix"][top].mean(),
            "recomputed": (col["prefix"] - col["kv_tokens"])[top].mean(), "cold": (col["kv_tokens"][top] == 0).mean()}
    return {"name": f"{ratio:g}" if ratio is not None else policy, "arrival": arrival, "latency": latency,
            "trace": np.asarray(trace, float).reshape(-1, 5), "duration": w.duration_s, "tail": tail}


def p99_ms(x: np.ndarray) -> float:
    return float(np.percentile(x, 99) * 1e3) if len(x) else float("nan")


def blocks(run: dict, size: float) -> list[np.ndarray]:
    b = (run["arrival"] // size).astype(int)
    return [run["latency"][b == i] for i in range(int(np.ceil(run["duration"] / size)))]


def per_block_best(runs: list[dict], size: float) -> tuple[float, list[str]]:
    parts = {r["name"]: blocks(r, size) for r in runs}
    names = list(parts)
    choice = [min(names, key=lambda n: p99_ms(np.concatenate(parts[n])))] * len(parts[names[0]])
    pooled = lambda ch: p99_ms(np.concatenate([parts[n][i] for i, n in enumerate(ch)]))   # noqa: E731
    best = pooled(choice)
    for _ in range(4):
        moved = False
        for i in range(len(choice)):
            for n in names:
                trial = choice[:i] + [n] + choice[i + 1:]
                v = pooled(trial)
                if v < best - 1e-9:
                    best, choice, moved = v, trial, True
        if not moved:
            break
    return best, choice


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="trend")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--router", default="helm")
    ap.add_argument("--policy", default="helm")
    ap.add_argument("--ratios", default="0.5,0.6,0.7,0.8,0.9,0.95")
    ap.add_argument("--block", type=float, default=10.0)
    ap.add_argument("--show", type=float, default=30.0)
    ap.add_argument("--duration", type=float, default=None, help="simulated seconds [default: the scenario's, 360]")
    ap.add_argument("--jobs", type=int, default=1)
    args = ap.parse_args()
    ratios = [float(x) for x in args.ratios.split(",")]
    jobs = [(args.workload, args.seed, args.router, "static", r, args.duration) for r in ratios]
    jobs.append((args.workload, args.seed, args.router, args.policy, None, args.duration))
    with ProcessPoolExecutor(args.jobs) as ex:
        runs = list(ex.map(run_one, jobs))
    statics, ctl = runs[:-1], runs[-1]
    print(f"{args.workload} seed {args.seed}, router {args.router}: P99 ms per {args.show:g}-s block")
    print("block " + " ".join(f"{r['name']:>6s}" for r in runs))
    shown = [blocks(r, args.show) for r in runs]
    for i in range(len(shown[0])):
        print(f"{i * args.show:5.0f} " + " ".join(f"{p99_ms(s[i]):6.2f}" for s in shown))
    print("run   " + " ".join(f"{p99_ms(r['latency']):6.2f}" for r in runs))
    print("top 1 % by latency: mean latency, queued, in service (from the batch's take), prefix, recomputed, nothing cached")
    for r in runs:
        t = r["tail"]
        print(f"  {r['name']:>6s} {t['latency_ms']:6.2f} {t['queued_ms']:5.2f} {t['in_service_ms']:6.2f} "
              f"{t['prefix']:7.0f} {t['recomputed']:7.0f} {t['cold']:5.1%}")
    best, choice = per_block_best(statics, args.block)
    sb = min(statics, key=lambda r: p99_ms(r["latency"]))
    print(f"static-best {sb['name']}: {p99_ms(sb['latency']):.3f} ms; {args.policy}: {p99_ms(ctl['latency']):.3f} ms; "
          f"per-block best ({args.block:g}-s blocks): {best:.3f} ms")
    print("  choice: " + " ".join(choice))
    t = ctl["trace"]
    if len(t):
        print(f"{args.policy} trace (mean over nodes): t plan offset ratio marginal")
        for b in np.arange(0, ctl["duration"], 20.0):
            m = (t[:, 0] >= b) & (t[:, 0] < b + 20)
            if m.any():
                print(f"{b:5.0f} {np.nanmean(t[m, 1]):.3f} {np.mean(t[m, 2]):+.3f} {np.mean(t[m, 3]):.3f} "
                      f"{np.nanmean(t[m, 4]) if np.isfinite(t[m, 4]).any() else float('nan'):+.2e}")


if __name__ == "__main__":
    main()
