"""Does the counterfactual signal of adapter v2 point at the best split? (SPEC 6)

    python benchmarks/marginal_signal.py --workload steady --duration 90 --router prefix-aware \
        --ratios 0.3,0.5,0.7,0.9 [--seed 1] [--share 0.05]

Each ratio is one static run with shadows of `share` of the pool on both sides (EMB rows just
below the cut, KV prefixes just evicted: `policy.policies.track_shadows`) and, per node and
window after the warm-up, `marginal_value`: the seconds per request a larger EMB share would
save per unit of r (positive: grow EMB). Printed per ratio: the run's P99, the signal's mean and
its standard error over node-windows (treated as independent: an underestimate), and the same
per phase kind. Where the sweep's P99 is lowest the signal should cross zero. Also per phase
kind: the mean EMB miss
rate and EMB time share (fetch / (fetch + recompute)) of the node-windows, the signals the
recovery tier can read. Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from dataclasses import replace

import numpy as np

from helmgr.policy.policies import Static, marginal_value, track_shadows
from helmgr.sim import SimConfig, simulate
from helmgr.sim.config import scenario_cluster
from helmgr.workload import WorkloadSpec, default_config


class ShadowProbe(Static):
    """A static split whose nodes track shadows; keeps every window's (end, marginal value)."""

    def __init__(self, share: float, cluster_ghosts: bool = False):
        self.share, self.values = share, []
        self.peers = [] if cluster_ghosts else None

    def attach(self, index, node):
        track_shadows(node, self.share, self.peers)

    def observe(self, index, w, node):
        v = marginal_value(w, node.cost, self.share)
        if v is not None:
            fetch, recompute = w.emb_wait_s, w.recompute_s
            self.values.append((w.t, v[0], w.emb_misses / max(1, w.emb_ids),
                                fetch / (fetch + recompute) if fetch + recompute > 0 else 0.5))


def mean_se(x: np.ndarray) -> tuple[float, float]:
    return float(x.mean()), float(x.std(ddof=1) / np.sqrt(len(x))) if len(x) > 1 else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="steady")
    ap.add_argument("--duration", type=float, default=90.0)
    ap.add_argument("--router", default="prefix-aware")
    ap.add_argument("--ratios", default="0.3,0.5,0.7,0.9")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--share", type=float, default=0.05)
    ap.add_argument("--hardware", default="a100-80g")
    ap.add_argument("--rate-scale", type=float, default=1.0, help="the regime's default rate times this")
    ap.add_argument("--cluster-ghosts", action="store_true",
                    help="credit a KV ghost wherever its user's prefix is recomputed (track_shadows' peers)")
    args = ap.parse_args()
    rps = None if args.rate_scale == 1.0 else default_config(args.workload, "v2").rps * args.rate_scale
    spec = WorkloadSpec(args.workload, args.duration, args.seed, rps)
    cluster = SimConfig(**scenario_cluster("v2"), router=args.router, seed=args.seed, hardware=args.hardware)
    for r in (float(x) for x in args.ratios.split(",")):
        probe = ShadowProbe(args.share, args.cluster_ghosts)
        w = spec.build()
        res = simulate(replace(cluster, ratio=r), w, policy=probe)
        t, v, miss, share = (np.array(a) for a in zip(*probe.values))
        keep = t > res.cluster.cfg.warmup_s
        by_kind, misses, shares = defaultdict(list), defaultdict(list), defaultdict(list)
        for ph in w.phases:
            m = keep & (t > ph.start) & (t <= ph.end)
            by_kind[ph.kind].append(v[m])
            misses[ph.kind].append(miss[m])
            shares[ph.kind].append(share[m])
        row = {"ratio": r, "p99_ms": round(res.summary["p99_ms"], 3),
               "signal_ms_per_request": [round(x * 1e3, 3) for x in mean_se(v[keep])],
               "by_phase": {k: [round(x * 1e3, 3) for x in mean_se(np.concatenate(p))] for k, p in by_kind.items()
                            if len(np.concatenate(p)) > 1},
               "emb_miss_by_phase": {k: round(float(np.concatenate(p).mean()), 4) for k, p in misses.items()
                                     if len(np.concatenate(p))},
               "emb_time_share_by_phase": {k: round(float(np.concatenate(p).mean()), 3) for k, p in shares.items()
                                           if len(np.concatenate(p))},
               "sim_path": res.summary["sim_path"], "wall_s": round(res.summary["wall_s"], 1)}
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
