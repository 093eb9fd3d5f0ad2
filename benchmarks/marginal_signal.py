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

    python benchmarks/marginal_signal.py --compare results/X/compare-seed1.json \
        --ratios 0.3,0.4,0.5,0.6,0.7,0.8,0.95 [--values tail,mean,blend] [--blend 0.05,0.1]

With `--compare` (a `helmgr compare --json` result holding the phase oracle) the workload, seed,
duration and router are the oracle's, the KV ghosts are the cluster's (as HELM's), and each
10-s block of the oracle gets, per pricing of adapter v2's samples (`MarginalSampler.VALUES`),
the signal at every ratio (the block's windows summed into one sample, `MarginalSampler.fold`
and `price`) and where it crosses zero (linear between the two ratios; the sweep's end when it
keeps one sign). Then the *zero path*'s band distance: how far from the oracle's band a policy
would be that sat at the signal's zero in every block, what a tier tracking the signal without
lag could reach.
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from dataclasses import replace

import numpy as np

from helmgr.policy.policies import MarginalSampler, Static, marginal_value, track_shadows
from helmgr.sim import SimConfig, simulate
from helmgr.sim.config import scenario_cluster
from helmgr.workload import WorkloadSpec, default_config


class ShadowProbe(Static):
    """A static split whose nodes track shadows; keeps every window's (end, marginal value)."""

    def __init__(self, share: float, cluster_ghosts: bool = False, block_s: float | None = None):
        self.share, self.values = share, []
        self.peers = [] if cluster_ghosts else None
        self.block_s, self.blocks = block_s, defaultdict(lambda: MarginalSampler.open(0))   # block -> its sums
        self.sums = MarginalSampler(share)                   # (its fold)

    def attach(self, index, node):
        track_shadows(node, self.share, self.peers)

    def observe(self, index, w, node):
        v = marginal_value(w, node.cost, self.share)
        if v is not None:
            fetch, recompute = w.emb_wait_s, w.recompute_s
            self.values.append((w.t, v[0], w.emb_misses / max(1, w.emb_ids),
                                fetch / (fetch + recompute) if fetch + recompute > 0 else 0.5))
        if self.block_s:
            self.sums.fold(self.blocks[int((w.t - 1e-9) // self.block_s)], w, node.cost)


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
    ap.add_argument("--compare", default=None,
                    help="a `helmgr compare --json` result with the phase oracle: each block's zero crossing")
    ap.add_argument("--values", default=",".join(MarginalSampler.VALUES), help="the pricings compared per block")
    ap.add_argument("--blend", default=str(MarginalSampler.BLEND),
                    help="the blend's weight on the mean price (a comma list: one zero path each)")
    args = ap.parse_args()
    oracle = None
    if args.compare:
        with open(args.compare) as f:
            rec = json.load(f)
        oracle = next(r for r in rec["results"] if r["policy"] == "oracle")
        blocks = rec["oracle_blocks"][oracle["router"]]
        args.workload, args.seed, args.duration = rec["workload"], rec["seed"], oracle["duration_s"]
        args.router, args.hardware, args.cluster_ghosts = oracle["router"], oracle["hardware"], True
    rps = None if args.rate_scale == 1.0 else default_config(args.workload, "v2").rps * args.rate_scale
    spec = WorkloadSpec(args.workload, args.duration, args.seed, rps)
    cluster = SimConfig(**scenario_cluster("v2"), router=args.router, seed=args.seed, hardware=args.hardware)
    ratios, sums = [float(x) for x in args.ratios.split(",")], []
    for r in ratios:
        probe = ShadowProbe(args.share, args.cluster_ghosts, oracle and blocks[0]["end"] - blocks[0]["start"])
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
        sums.append(probe.blocks)
    if oracle:
        for value in args.values.split(","):
            for blend in (args.blend.split(",") if value == "blend" else [None]):
                zero_path(MarginalSampler(args.share, value, blend and float(blend)), ratios, sums, blocks)


def zero_path(sampler: MarginalSampler, ratios: list[float], sums: list[dict], blocks: list[dict]) -> None:
    """Per oracle block: the signal priced by `sampler` at each ratio and its zero crossing against
    r* and the band; then the zero path's mean band distance, overall and per phase kind."""
    name = f"{sampler.value} {sampler.blend}" if sampler.value == "blend" else sampler.value
    print(f"# {name}: block, kind, r*, band, zero, distance to the band, signal (ms/request/unit r) "
          f"at {ratios}")
    dist = defaultdict(list)
    for k, b in enumerate(blocks):
        sig = np.array([sampler.price(s[k]) if s[k][2] else np.nan for s in sums])
        z = zero(ratios, sig)
        lo, hi = b["band"]
        d = max(lo - z, 0.0, z - hi)
        dist[b["kind"]].append(d)
        print(f"{b['start']:6.0f} {b['kind']:9s} {b['r_star']:.2f} [{lo:.2f}, {hi:.2f}] {z:.2f} {d:.3f}  "
              + " ".join(f"{x * 1e3:+.3f}" for x in sig))
    every = [d for ds in dist.values() for d in ds]
    print(json.dumps({"value": sampler.value} | ({"blend": sampler.blend} if sampler.value == "blend" else {})
                     | {"zero_path_band_distance": round(float(np.mean(every)), 4),
                        "by_kind": {k: round(float(np.mean(ds)), 4) for k, ds in dist.items()}}), flush=True)


def zero(ratios: list[float], sig: np.ndarray) -> float:
    """Where the signal turns from + (grow EMB) to - (linear between the two ratios); the sweep's
    end it points to when it keeps one sign."""
    for i in range(len(ratios) - 1):
        if sig[i] > 0 >= sig[i + 1]:
            return ratios[i] + (ratios[i + 1] - ratios[i]) * sig[i] / (sig[i] - sig[i + 1])
    return ratios[-1] if sig[-1] > 0 else ratios[0]


if __name__ == "__main__":
    main()
