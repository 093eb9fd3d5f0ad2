"""Is the training environment's node the node the base will serve? (issue 22)

    python benchmarks/env_fidelity.py --regimes steady,trend,burst --seeds 3,4

`HelmEnv` trains the base on one node carrying an eighth of the v2 cluster's rate and users.
Each (regime, seed) is one episode held at its starting ratio (action 0) once per cluster size
in `--nodes`, with the same draws (start second, ratio, preset): that node alone (`nodes=1`), and
node 0 of N such nodes under the HELM router (`nodes=8`: each node its share, the cluster the
validation runs on).
Printed: node 0's requests per window and the mean and 99th percentile of its 1-s window P99s,
and the share of windows over the SLO. Asserts nothing.
"""
from __future__ import annotations

import argparse

import numpy as np

from helmgr.learn.env import HelmEnv


def episode(regime: str, seed: int, nodes: int, hardware: str, model: str) -> dict:
    env = HelmEnv(regimes=(regime,), nodes=nodes, hardware=hardware, model=model)
    _, info = env.reset(seed=seed)
    p99, done = [], []
    for _ in range(int(env.episode_s)):
        env.step(np.zeros(1, np.float32))
        w = env.recorder.windows[0]
        if w.p99_s is not None:
            p99.append(w.p99_s * 1e3)
            done.append(w.completed)
    p = np.asarray(p99)
    return info | {"req_per_window": float(np.mean(done)), "mean_window_p99_ms": float(p.mean()),
                   "p99_window_p99_ms": float(np.percentile(p, 99)),
                   "windows_over_slo": float(np.mean(p > env.slo_s * 1e3))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--regimes", default="steady,trend,burst")
    ap.add_argument("--seeds", default="3,4")
    ap.add_argument("--nodes", default="1,8", help="comma list of cluster sizes, each node its share")
    ap.add_argument("--hardware", default="a100-80g")
    ap.add_argument("--model", default="large")
    a = ap.parse_args()
    for regime in a.regimes.split(","):
        for seed in (int(s) for s in a.seeds.split(",")):
            for n in (int(x) for x in a.nodes.split(",")):
                e = episode(regime, seed, n, a.hardware, a.model)
                print(f"{regime} seed {seed} (start {e['start_s']} s, ratio {e['ratio']:.2f}), node 0 of {n}: "
                      f"req/window {e['req_per_window']:.0f}; window P99 mean {e['mean_window_p99_ms']:.2f} ms, "
                      f"p99 {e['p99_window_p99_ms']:.1f} ms; over SLO {e['windows_over_slo']:.3f}", flush=True)


if __name__ == "__main__":
    main()
