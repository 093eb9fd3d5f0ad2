"""A resize at a burst's onset under the HELM router, against holding the split (issue 22 item 4).

    python benchmarks/resize_spike.py                      # burst seed 1: hold 0.66 / +0.1 at 44 s, +0.08 at 45 s

Two runs of the v2 burst regime (120 s), in parallel, under a `Scheduled` policy: every node at
--ratio, then, in the second run, the --moves. For each run it prints the window P99s around the
moves, where the window's slowest 1 % of requests were served (per node), and the history-row
miss rate of every EMB summary the router applied within a second of a move — the figure the
router prices recomputes with (docs/results/2026-12-02-history-miss.md). Asserts nothing.
"""
from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor

import numpy as np


def run_one(job: tuple) -> dict:
    from helmgr.policy.policies import Scheduled
    from helmgr.routing.helm import Helm
    from helmgr.sim import SimConfig, simulate
    from helmgr.sim.config import scenario_cluster
    from helmgr.workload import WorkloadSpec

    name, steps, seed, duration = job
    applied = []                                   # (time of the router's last decision, node, history miss)

    class LoggedHelm(Helm):
        def attach(self, cost, n_items, **kw):
            index = super().attach(cost, n_items, **kw)
            apply = index.apply_summary

            def logged(s):
                applied.append((self._now, s.node, s.history_miss))
                apply(s)

            index.apply_summary = logged
            return index

    w = WorkloadSpec("burst", duration, seed).build()
    cfg = SimConfig(**scenario_cluster("v2"), router="helm", seed=seed, policy="scheduled", path="python")
    res = simulate(cfg, w, policy=Scheduled(steps), router=LoggedHelm())
    rec = res.cluster.rec
    arrival, node = np.array(rec.arrival), np.array(rec.node)
    latency = (np.array(rec.end) - arrival) * 1e3
    return {"name": name, "p99_ms": res.summary["p99_ms"], "window_p99_ms": res.series.window_p99_ms.tolist(),
            "bursts": [(b.start, b.end) for b in w.bursts], "arrival": arrival, "latency": latency, "node": node,
            "summaries": applied, "nodes": cfg.nodes}


def slowest_by_node(r: dict, k: int) -> list[int]:
    """Per node, how many of window k's slowest 1 % of requests it served."""
    m = (r["arrival"] >= k) & (r["arrival"] < k + 1)
    top = m & (r["latency"] >= np.percentile(r["latency"][m], 99))
    return np.bincount(r["node"][top], minlength=r["nodes"]).tolist()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--duration", type=float, default=120.0)
    ap.add_argument("--ratio", type=float, default=0.66)
    ap.add_argument("--moves", default="44:0.76,45:0.84", help="T:RATIO,... for the second run")
    args = ap.parse_args()
    moves = [(float(t), float(r)) for t, r in (m.split(":") for m in args.moves.split(","))]
    jobs = [("hold", [(0.0, args.ratio)], args.seed, args.duration),
            ("move", [(0.0, args.ratio)] + moves, args.seed, args.duration)]
    with ProcessPoolExecutor(2) as ex:
        runs = list(ex.map(run_one, jobs))
    first, last = int(moves[0][0]), int(moves[-1][0])
    print(f"bursts: {[(round(a, 2), round(b, 2)) for a, b in runs[0]['bursts']]}")
    for r in runs:
        wp = r["window_p99_ms"]
        print(f"\n{r['name']}: run P99 {r['p99_ms']:.2f} ms")
        for k in range(first - 3, last + 3):
            print(f"  window {k}: P99 {wp[k]:5.1f} ms, slowest 1 % per node {slowest_by_node(r, k)}")
        for t, n, miss in r["summaries"]:
            if first - 0.5 <= t <= last + 1.0:
                print(f"  summary at {t:.2f} s, node {n}: history miss {miss:.3f}")


if __name__ == "__main__":
    main()
