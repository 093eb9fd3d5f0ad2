"""How fast the shipped base policy climbs and descends, and what a descent would pay (issue 22).

    python benchmarks/base_descent.py starts --workload steady --starts 0.3,0.95 --duration 360
    python benchmarks/base_descent.py step --workload trend --ratio 0.95 --to 0.45 --at 260 --span 100

`starts`: `--policy` (default helm-base) under the HELM router from each starting ratio; prints
the run's P99, its mean ratio and the nodes' mean ratio in the second before each of five times
(`sim.metrics.window_ratios`). `step`: every node holds `--ratio` and moves to `--to` at `--at`
seconds (a `Scheduled` policy), against the same run held at `--ratio`; prints 5-s means of
window P99 and the KV and EMB hit rates around the move. 8 x A100-80G, the v2 defaults, one seed. Asserts nothing.
"""
from __future__ import annotations

import argparse

import numpy as np

from helmgr.policy.policies import Scheduled
from helmgr.sim import SimConfig, simulate
from helmgr.sim.config import scenario_cluster
from helmgr.sim.metrics import window_ratios
from helmgr.workload import default_config, synthetic_workload


def starts(a) -> None:
    w = synthetic_workload(default_config(a.workload, duration_s=a.duration), a.seed)
    for r0 in (float(x) for x in a.starts.split(",")):
        cfg = SimConfig(**(scenario_cluster("v2") | dict(policy=a.policy, ratio=r0, router="helm", seed=a.seed)))
        res = simulate(cfg, w)
        s, times = res.summary, [a.duration * k / 5 for k in range(1, 6)]
        r = window_ratios(res.series.timeline, res.series.n_nodes, a.duration)     # per 1-s window
        at = ", ".join(f"{t:g} s {r[int(t) - 1]:.3f}" for t in times)
        print(f"{a.workload} {a.policy} from {r0:g}: P99 {s['p99_ms']:.3f} ms, mean ratio {s['mean_ratio']:.3f}; {at}")


def step(a) -> None:
    w = synthetic_workload(default_config(a.workload, duration_s=a.at + a.span), a.seed)
    runs = {}
    for name, steps in (("hold", [(0.0, a.ratio)]), ("move", [(0.0, a.ratio), (a.at, a.to)])):
        cfg = SimConfig(**(scenario_cluster("v2") | dict(policy="scheduled", ratio=a.ratio, router="helm",
                                                           seed=a.seed)))
        s = simulate(cfg, w, policy=Scheduled(steps)).series      # 1-s windows: window k starts at k s
        runs[name] = (s.window_p99_ms, s.window_kv_hit, s.window_emb_hit)
    (ph, kh, eh), (pm, km, em) = runs["hold"], runs["move"]
    print(f"{a.workload} seed {a.seed}: {a.ratio:g} held, or moved to {a.to:g} at {a.at:g} s; "
          "5-s means, held vs moved: window P99 ms, KV hit, EMB hit")
    for k in range(int(a.at) - 10, int(a.at + a.span), 5):
        sl = slice(k, k + 5)
        print(f"  {k - a.at:+5.0f} s  P99 {np.nanmean(ph[sl]):5.2f} vs {np.nanmean(pm[sl]):5.2f}   "
              f"KV {np.mean(kh[sl]):.3f} vs {np.mean(km[sl]):.3f}   EMB {np.mean(eh[sl]):.3f} vs {np.mean(em[sl]):.3f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("probe", choices=["starts", "step"])
    p.add_argument("--workload", default="steady")
    p.add_argument("--seed", type=int, default=101)
    p.add_argument("--policy", default="helm-base", help="starts: the policy run from each start")
    p.add_argument("--starts", default="0.3,0.95", help="starts: comma list of starting ratios")
    p.add_argument("--duration", type=float, default=360.0, help="starts: simulated seconds")
    p.add_argument("--ratio", type=float, default=0.95, help="step: the ratio held before the move")
    p.add_argument("--to", type=float, default=0.6, help="step: the ratio moved to")
    p.add_argument("--at", type=float, default=120.0, help="step: when the move is made (s)")
    p.add_argument("--span", type=float, default=120.0, help="step: seconds run after the move")
    a = p.parse_args()
    (starts if a.probe == "starts" else step)(a)


if __name__ == "__main__":
    main()
