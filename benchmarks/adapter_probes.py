"""Probes of adapter v2's key and price on the tuning seeds (docs/results/2026-12-05-adapter-probes.md)

    python benchmarks/adapter_probes.py --variants shipped,phase-key,emb-scale=0.5,queue-price \
        --workloads steady,burst,trend --seeds 101,102 --jobs 2

Each variant changes one thing in full HELM, in this process only (nothing here ships):
- `shipped`: HELM as it ships;
- `prefix-key`: adapter v2's levels keyed on the cluster's prefix tokens per completed request
  (the traffic-mix figure a node's window carries) instead of its arrival rate;
- `phase-key`: the levels keyed on the workload's true phase kind (feed / discovery / ...), which
  no controller can see: a bound on what any mix key could do;
- `emb-scale=X`: the EMB side of every marginal-value sample times X (X < 1: a stand-in for
  pricing only the link seconds that delay compute; X > 1: the EMB side worth more);
- `queue-price`: each side priced with its engine's queueing, the EMB side times 1 / (1 - the
  window's link utilization), the KV side times 1 / (1 - its compute utilization), each capped
  at 0.9.
Every (variant, workload, seed) is one 360-s full-HELM run on the v2 cluster under the HELM
router; printed, one JSON line per run: P99, burst-violation share, the mean ratio per phase
kind, and for `queue-price` the mean utilizations. Asserts nothing.
"""
from __future__ import annotations

import argparse
import json
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from tune_tiers import by_phase, regime_workload

CAP = 0.9       # queue-price: the utilization a factor is capped at


def run_one(job: tuple) -> dict:
    import helmgr.policy.policies as P
    from helmgr.sim import SimConfig, simulate
    from helmgr.sim.config import scenario_cluster
    from helmgr.sim.metrics import window_ratios

    variant, workload, seed = job
    w = regime_workload(workload, 360.0, seed)
    kind, _, arg = variant.partition("=")
    rhos = []
    shipped_value = P.marginal_value

    def priced(win, cost, share):
        v = shipped_value(win, cost, share)
        if v is None:
            return None
        emb, kv = v[1], v[2]
        if kind == "emb-scale":
            emb *= float(arg)
        elif kind == "queue-price":
            span = max(win.span_s, 1e-9)
            link, compute = min(CAP, win.h2d_busy_s / span), min(CAP, win.busy_s / span)
            rhos.append((link, compute))
            emb, kv = emb / (1.0 - link), kv / (1.0 - compute)
        return (emb - kv) / share / win.completed, emb, kv

    class Probe(P.HelmPolicy):
        def _load(self, index, t, span, rate):
            if kind == "phase-key":          # 1 for the first phase kind seen, 100 for the next, ...
                here = next((p.kind for p in w.phases if p.start <= t < p.end), w.phases[-1].kind)
                kinds = list(dict.fromkeys(p.kind for p in w.phases))
                return 100.0 ** kinds.index(here)
            if kind == "prefix-key":
                self.rates[index] = (t, self.prefix.get(index))
                live = [r for u, r in self.rates.values() if u > t - 2.0 * span and r is not None]
                return sum(live) / len(live) if live else None
            return super()._load(index, t, span, rate)

        def observe(self, index, win, node):
            if kind == "prefix-key":
                self.prefix[index] = win.kv_prefix_tokens / win.completed if win.completed else None
            super().observe(index, win, node)

        prefix: dict = {}                     # prefix-key: node -> its last window's prefix tokens per request

    if kind in ("emb-scale", "queue-price"):
        P.marginal_value = priced
    elif kind not in ("shipped", "phase-key", "prefix-key"):
        raise SystemExit(f"unknown variant {variant!r}")
    try:
        cluster = SimConfig(**scenario_cluster("v2"), router="helm", seed=seed, policy="helm")
        res = simulate(cluster, w, policy=Probe())
    finally:
        P.marginal_value = shipped_value
    s = res.summary
    r = window_ratios(res.series.timeline, cluster.nodes, w.duration_s)
    row = {"variant": variant, "workload": workload, "seed": seed, "p99_ms": round(s["p99_ms"], 3),
           "burst_violation_share": s["burst_violation_share"], "mean_ratio_by_phase": by_phase(r, w.phases),
           "wall_s": round(s["wall_s"], 1)}
    if rhos:
        a = np.asarray(rhos)
        row |= {"link_utilization": round(float(a[:, 0].mean()), 3),
                "compute_utilization": round(float(a[:, 1].mean()), 3)}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="shipped,phase-key,emb-scale=0.5,emb-scale=1.5,queue-price")
    ap.add_argument("--workloads", default="steady,burst,trend")
    ap.add_argument("--seeds", default="101,102")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    jobs = [(v, wl, int(s)) for v in args.variants.split(",") for wl in args.workloads.split(",")
            for s in args.seeds.split(",")]
    with ProcessPoolExecutor(args.jobs) as pool:
        for row in pool.map(run_one, jobs):
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
