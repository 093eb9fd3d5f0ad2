"""Can the residual adapter find a correction the base policy misses? A closed loop without the simulator.

One node whose window P99 is lowest at r = 0.35 (`P99 = 9 ms * (1 + 20 (r - 0.35)^2)`, times
Gaussian noise of the given relative size) and a base policy that steers its ratio toward 0.4:
the best the adapter (bounded at +-0.05) can do is an offset of -0.05. Prints, per setting, the
blocks of gradient estimates that changed the adapter, its final offset (without exploration) and the node's mean ratio
over the last 1,000 windows (0.40: the base alone; 0.35: the optimum).

    python benchmarks/adapter_closed_loop.py [--windows 6000] [--seeds 0,1,2]

Noise 0.24 is a steady node's: a window reward's sd of 0.073 around -0.30 (docs/controller.md).
"""
from __future__ import annotations

import argparse

import numpy as np

from helmgr.controller import Controller, WindowStats
from helmgr.controller import kernel as K
from helmgr.controller.adapter import ResidualAdapter
from helmgr.controller.mlp import MLPPolicy
from helmgr.controller.observe import N_FEATURES
from helmgr.controller.safety import Safety


def pull_policy(target: float) -> MLPPolicy:
    """Action tanh(-(r - target) / 0.1), 0.05 a window at most."""
    w = np.zeros((1, N_FEATURES))
    w[0, 0] = -1.0
    mean, var = np.zeros(N_FEATURES), np.ones(N_FEATURES)
    mean[0], var[0] = target, 0.01
    return MLPPolicy([w, np.ones((1, 1))], [np.zeros(1), np.zeros(1)], mean, var, max_step=0.05)


def run(windows: int, seed: int, min_move: float, noise: float, z: float) -> tuple[int, float, float]:
    rng = np.random.default_rng(seed)
    a = ResidualAdapter(N_FEATURES, z=z, rng=np.random.default_rng(seed + 1))
    ctl = Controller(pull_policy(0.4), adapter=a, safety=Safety(max_slew=0.1, min_move=min_move))
    r, ratios = 0.5, []
    for _ in range(windows):
        p99 = 0.009 * (1 + 20 * (r - 0.35) ** 2) * max(0.05, 1 + noise * rng.normal())
        r = ctl.step(WindowStats(ratio=r, arrival_rps=300.0, p99_s=p99, slo_s=0.03))
        ratios.append(r)
    obs = ctl._k[-1][0][K.OBS:K.OBS + N_FEATURES]          # the last observation the kernel built
    return a.applied, a.output(obs), float(np.mean(ratios[-1000:]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=6000)
    ap.add_argument("--seeds", default="0,1,2")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    print(f"{args.windows} windows, seeds {seeds}; per seed: blocks applied, final offset, mean ratio of the last 1,000")
    print("| min_move | noise | z | blocks applied | offset | mean ratio |")
    print("|---:|---:|---:|---|---|---|")
    for min_move in (0.03, 0.0):
        for noise in (0.0, 0.24):
            for z in (4.0, 2.0):
                rows = [run(args.windows, s, min_move, noise, z) for s in seeds]
                steps, offsets, means = zip(*rows)
                print(f"| {min_move} | {noise} | {z:g} | {' / '.join(map(str, steps))} | "
                      f"{' / '.join(f'{o:+.3f}' for o in offsets)} | {' / '.join(f'{m:.3f}' for m in means)} |",
                      flush=True)


if __name__ == "__main__":
    main()
