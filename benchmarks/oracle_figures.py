"""A run's phase-oracle figures against an oracle already computed: no replay of the grid.

    python benchmarks/oracle_figures.py --compare results/X/compare-seed1.json [--policy helm]
                                        [--adapter '{"hold_base": false}'] [--base policy.npz]
                                        [--policy-kw '{"value": "blend"}'] [--react 20]

Takes a `helmgr compare --json` result that holds the phase oracle (its `oracle_blocks`, `r*` and
bands per block, and the oracle's own run), runs POLICY under the same router, workload, seed,
duration and starting ratio on the v2 cluster, and prints its P99, mean ratio, regret (P99 / the
oracle's P99 - 1), band distance (also in phase: over the blocks whose lookahead stays in their
phase kind) and oracle distance (`experiments.phase_oracle`, the code `compare` and `evaluate`
use), with the stored rows of the compare beside it. One 720-s steady oracle costs about half an
hour on one core; a change of the controller does not change it, so this measures the change
against the same oracle in a minute. `--plot` draws the run's ratio against r* and its band;
`--base` puts another base policy file under a HELM policy (a retrained candidate). `--react S`
also prints the band distance in phase with the blocks starting less than S s after a phase
change left out (`band_distance_in_phase_react`: a causal policy's reaction time, issue 22's
proposal). Asserts nothing.
"""
from __future__ import annotations

import argparse
import json

import numpy as np

from helmgr.experiments.phase_oracle import (block_windows, horizon_in_phase, in_phase_band_distance, regret,
                                             spread, window_figures)
from helmgr.policy.policies import POLICIES, HelmPolicy
from helmgr.sim import SimConfig, simulate
from helmgr.sim.config import scenario_cluster
from helmgr.sim.metrics import window_ratios
from helmgr.workload import Phase, WorkloadSpec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--compare", required=True, help="a `helmgr compare --json` result with the phase oracle")
    ap.add_argument("--policy", default="helm")
    ap.add_argument("--adapter", default=None, help="adapter v2's settings, as JSON (a HELM policy's adapter_kw)")
    ap.add_argument("--plot", default=None, help="a PNG of the run's mean ratio per window against r* and its band")
    ap.add_argument("--base", default=None, help="a base policy file for a HELM policy (default: the shipped one)")
    ap.add_argument("--policy-kw", default=None, help="a HELM policy's other settings, as JSON (e.g. value)")
    ap.add_argument("--react", type=float, default=None,
                    help="also the band distance in phase, less the blocks starting within this many s of a change")
    args = ap.parse_args()
    with open(args.compare) as f:
        rec = json.load(f)
    rows = {r["policy"]: r for r in rec["results"]}
    oracle = rows["oracle"]
    router = oracle["router"]
    duration = oracle["duration_s"]
    start = next(r["ratio"] for r in rec["results"] if r["policy"] != "oracle")   # compare's --ratio: where runs start
    cluster = SimConfig(**(scenario_cluster("v2") | dict(nodes=rec["nodes"])), router=router, seed=rec["seed"],
                        hardware=oracle["hardware"], model=oracle["model"], policy=args.policy, ratio=start,
                        warmup_s=oracle["warmup_s"])
    cls = POLICIES[args.policy]
    kw = {} if args.policy_kw is None else json.loads(args.policy_kw)
    if args.adapter is not None:
        kw["adapter_kw"] = json.loads(args.adapter)
    if args.base is not None:
        kw["path"] = args.base
    policy = cls(**kw) if issubclass(cls, HelmPolicy) else None
    w = WorkloadSpec(rec["workload"], duration, rec["seed"]).build()
    res = simulate(cluster, w, policy=policy)
    s = res.summary
    r = window_ratios(res.series.timeline, cluster.nodes, duration)
    blocks = rec["oracle_blocks"][router]
    per_window = block_windows([b["start"] for b in blocks], blocks[-1]["end"], [b["r_star"] for b in blocks],
                               [b["band"][0] for b in blocks], [b["band"][1] for b in blocks])
    dist, band = window_figures(r, *per_window)
    phases = [Phase(b["start"], b["end"], b["kind"]) for b in blocks]
    lookahead = oracle.get("oracle_lookahead_s", 0.0)

    def kept(react: float) -> np.ndarray:
        """The windows of the blocks in phase, less those within `react` s of a change."""
        return spread([b["start"] for b in blocks], blocks[-1]["end"], horizon_in_phase(phases, lookahead, react))

    in_phase = in_phase_band_distance(r, per_window[1], per_window[2], kept(0.0))
    if args.plot:
        plot(args.plot, r, *per_window, f"{rec['workload']} seed {rec['seed']}: {args.policy}"
             + (f" over {args.base.rsplit('/', 1)[-1]}" if args.base else ""), band)
    out = {"policy": args.policy, "adapter": kw.get("adapter_kw"), "base": args.base, "policy_kw": args.policy_kw,
           "router": router, "seed": rec["seed"],
           "duration_s": duration, "p99_ms": round(s["p99_ms"], 3), "mean_ratio": round(float(r.mean()), 3),
           "last_quarter_ratio": round(float(r[int(0.75 * len(r)):].mean()), 3),
           "regret": round(regret(s["p99_ms"], oracle["p99_ms"]), 4), "band_distance": round(band, 4),
           "band_distance_in_phase": in_phase and round(in_phase, 4), "oracle_distance": round(dist, 4),
           **({} if args.react is None else {"react_s": args.react, "band_distance_in_phase_react": rounded(
               in_phase_band_distance(r, per_window[1], per_window[2], kept(args.react)))}),
           "mean_window_p99_ms": mean_window_p99(res.series, w.phases, oracle["warmup_s"]),
           "wall_s": round(s["wall_s"], 1),
           "stored": {p: {"p99_ms": round(x["p99_ms"], 3), "regret": x["regret"] and round(x["regret"], 4),
                          "band_distance": x["band_distance"] and round(x["band_distance"], 4)}
                      for p, x in rows.items()}}
    print(json.dumps(out))


def rounded(x: float | None) -> float | None:
    """`x` to 4 decimals; None (no window kept) stays None."""
    return None if x is None else round(x, 4)


def mean_window_p99(series, phases, warmup_s: float) -> dict:
    """The mean of the 1-s windows' P99 (ms) after the warm-up, over the run and per phase kind: a
    figure that sees every phase, where the run's P99 is made by its worst."""
    t, p99 = np.asarray(series.window_start), np.asarray(series.window_p99_ms)
    keep = (t >= warmup_s) & np.isfinite(p99)
    out = {"all": round(float(p99[keep].mean()), 3)}
    for kind in dict.fromkeys(ph.kind for ph in phases):
        m = keep & np.any([(t >= ph.start) & (t < ph.end) for ph in phases if ph.kind == kind], axis=0)
        out[kind] = round(float(p99[m].mean()), 3)
    return out


def plot(path: str, r, r_star, lo, hi, title: str, band: float) -> None:
    from helmgr.experiments.plots import draw_oracle, plt     # (headless: plots sets the backend)
    n = min(len(r), len(r_star))
    fig, ax = plt.subplots(figsize=(9, 3.6))
    draw_oracle(ax, r_star[:n], (lo[:n], hi[:n]))
    ax.plot(r[:n], color="C1", lw=1.3, label=f"mean ratio (band distance {band:.3f})")
    ax.set_title(title)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
